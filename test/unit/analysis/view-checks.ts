/**
 * One check per analysis view, run against a store holding a synthetic run (synthetic-run.ts):
 * every expected value is computed here in JS from the rows that were written. Shared by the
 * PGlite unit test and the PostgreSQL integration test, so both databases answer the same.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import type { Database } from '../../../lib/db/database.ts';
import { queryObjects } from '../../../lib/analysis/query.ts';
import type { TrajectoryRow } from '../../../lib/store/index.ts';
import type { SyntheticRun } from './synthetic-run.ts';

const close = (a: unknown, b: number, what: string, tol = 1e-9) => {
  assert.equal(typeof a, 'number', `${what}: expected a number, got ${String(a)}`);
  if (Number.isNaN(b)) return assert.ok(Number.isNaN(a as number), `${what}: expected NaN, got ${String(a)}`);
  assert.ok(Math.abs((a as number) - b) <= tol * Math.max(1, Math.abs(b)), `${what}: ${String(a)} ≠ ${b}`);
};

const mean = (xs: number[]) => xs.reduce((s, x) => s + x, 0) / xs.length;

/** numpy-style linear-interpolation percentile (PostgreSQL's percentile_cont). */
function percentile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  const pos = q * (s.length - 1);
  const lo = Math.floor(pos),
    hi = Math.ceil(pos);
  return s[lo] + (s[hi] - s[lo]) * (pos - lo);
}

function groupBy<T>(xs: readonly T[], key: (x: T) => string): Map<string, T[]> {
  const m = new Map<string, T[]>();
  for (const x of xs) {
    const k = key(x);
    if (!m.has(k)) m.set(k, []);
    m.get(k)!.push(x);
  }
  return m;
}

function metric(run: SyntheticRun, step: number, name: string): number | undefined {
  return run.metrics.find((m) => m.step === step && m.name === name)?.value;
}

const byStep = (rows: Array<Record<string, any>>) => new Map(rows.map((r) => [r.step as number, r]));

export const VIEW_NAMES = [
  'v_step_metrics_wide',
  'v_step_times',
  'v_reward_by_prompt',
  'v_response_length',
  'v_kl_entropy',
  'v_filtered_groups',
  'v_reward_failures',
  'v_staleness',
  'v_checkpoint_lineage',
  'v_dead_letters',
  'v_runs',
] as const;

export type ViewCheck = (db: Database, run: SyntheticRun) => Promise<void>;

export const viewChecks: Record<(typeof VIEW_NAMES)[number], ViewCheck> = {
  async v_step_metrics_wide(db, run) {
    const rows = await queryObjects(db, 'select * from v_step_metrics_wide where run_id = $1 order by step', [
      run.runId,
    ]);
    const steps = [...new Set(run.metrics.map((m) => m.step))].sort((a, b) => a - b);
    assert.deepEqual(
      rows.map((r) => r.step),
      steps,
    );
    const cols: Record<string, string> = {
      reward_mean: 'reward/mean',
      reward_std: 'reward/std',
      reward_min: 'reward/min',
      reward_max: 'reward/max',
      val_accuracy: 'val/accuracy',
      val_reward_score: 'val/reward_score',
      pg_loss: 'actor/pg_loss',
      approx_kl: 'actor/approx_kl',
      clipfrac: 'actor/clipfrac',
      entropy: 'actor/entropy',
      grad_norm: 'actor/grad_norm',
      lr: 'actor/lr',
      kl_mean: 'kl/mean',
      kl_coef: 'kl/coef',
      response_length_mean: 'response_length/mean',
      tokens_per_second: 'perf/tokens_per_second',
      rollout_s: 'perf/step_time_s/rollout',
      reward_s: 'perf/step_time_s/reward',
      advantage_s: 'perf/step_time_s/advantage',
      update_s: 'perf/step_time_s/update',
    };
    for (const r of rows) {
      for (const [col, name] of Object.entries(cols)) {
        const want = metric(run, r.step, name);
        if (want === undefined) assert.equal(r[col], null, `${col} at step ${r.step} should be NULL`);
        else close(r[col], want, `${col} at step ${r.step}`);
      }
      assert.equal(r.vf_loss, null);
    }
    assert.ok(
      rows.some((r) => Number.isNaN(r.grad_norm)),
      'a NaN grad_norm is kept as NaN',
    );
  },

  async v_step_times(db, run) {
    const rows = await queryObjects(db, 'select * from v_step_times where run_id = $1 order by step, stage', [
      run.runId,
    ]);
    const expected = run.metrics.filter((m) => m.name.startsWith('perf/step_time_s/'));
    assert.equal(rows.length, expected.length);
    for (const r of rows) {
      close(r.step_time_s, metric(run, r.step, `perf/step_time_s/${r.stage}`)!, `step_time_s ${r.stage}@${r.step}`);
      close(r.wait_s, metric(run, r.step, `timing/${r.stage}/wait_s`)!, `wait_s ${r.stage}@${r.step}`);
      close(r.compute_s, metric(run, r.step, `timing/${r.stage}/compute_s`)!, `compute_s ${r.stage}@${r.step}`);
    }
  },

  async v_reward_by_prompt(db, run) {
    const rows = await queryObjects(
      db,
      'select * from v_reward_by_prompt where run_id = $1 order by step, prompt_index',
      [run.runId],
    );
    const groups = groupBy(run.trajectories, (t) => `${t.step}/${t.promptIndex}`);
    assert.equal(rows.length, groups.size);
    for (const r of rows) {
      const g = groups.get(`${r.step}/${r.prompt_index}`)!;
      const scored = g.filter((t) => t.reward !== null).map((t) => t.reward!);
      assert.equal(r.kind, 'train');
      assert.equal(r.prompt_text, g[0].promptText);
      assert.equal(r.prompt_hash, createHash('md5').update(g[0].promptText).digest('hex').slice(0, 12));
      assert.equal(r.group_uid, g[0].groupUid);
      assert.equal(r.n, g.length);
      assert.equal(r.n_scored, scored.length);
      assert.equal(r.n_failed, g.length - scored.length);
      assert.equal(r.n_filtered, g.filter((t) => t.filtered).length);
      close(r.reward_mean, mean(scored), `reward_mean ${r.step}/${r.prompt_index}`);
      close(r.reward_max, Math.max(...scored), 'reward_max');
      close(r.reward_min, Math.min(...scored), 'reward_min');
      const acc = g.filter((t) => t.rewardDetails).map((t) => t.rewardDetails!.accuracy as number);
      close(r.accuracy_mean, mean(acc), 'accuracy_mean');
    }
  },

  async v_response_length(db, run) {
    const rows = await queryObjects(
      db,
      "select * from v_response_length where run_id = $1 and kind = 'train' order by step",
      [run.runId],
    );
    const steps = groupBy(run.trajectories, (t) => String(t.step));
    assert.equal(rows.length, steps.size);
    for (const r of rows) {
      const lens = steps.get(String(r.step))!.map((t) => t.responseTokens.length);
      assert.equal(r.n, lens.length);
      assert.equal(r.min_len, Math.min(...lens));
      assert.equal(r.max_len, Math.max(...lens));
      close(r.p50_len, percentile(lens, 0.5), `p50 @${r.step}`);
      close(r.p90_len, percentile(lens, 0.9), `p90 @${r.step}`);
      close(r.mean_len, mean(lens), `mean @${r.step}`);
      assert.equal(r.n_truncated, steps.get(String(r.step))!.filter((t) => t.finishReason === 'length').length);
    }
    assert.ok(
      rows.some((r) => r.n_truncated > 0),
      'the fixture has truncated responses',
    );
  },

  async v_kl_entropy(db, run) {
    const rows = byStep(await queryObjects(db, 'select * from v_kl_entropy where run_id = $1', [run.runId]));
    for (let step = 1; step <= run.steps; step++) {
      const r = rows.get(step)!;
      assert.ok(r, `v_kl_entropy has step ${step}`);
      close(r.kl_mean, metric(run, step, 'kl/mean')!, 'kl_mean');
      close(r.approx_kl, metric(run, step, 'actor/approx_kl')!, 'approx_kl');
      close(r.entropy, metric(run, step, 'actor/entropy')!, 'entropy');
      close(r.kl_coef, metric(run, step, 'kl/coef')!, 'kl_coef');
      assert.equal(r.kl_loss, null);
      const used = run.trajectories.filter(
        (t) => t.step === step && t.kind === 'train' && !t.filtered && t.refLogprobs,
      );
      const diffs = used.flatMap((t) => Array.from(t.behaviourLogprobs, (b, i) => b - t.refLogprobs![i]));
      assert.equal(r.kl_tokens, diffs.length);
      close(r.kl_k1_from_logprobs, mean(diffs), `kl_k1_from_logprobs @${step}`);
    }
    // Validation-only steps have metrics rows but no KL.
    assert.equal(rows.has(0), false, 'step 0 has no KL/entropy metric');
  },

  async v_filtered_groups(db, run) {
    const rows = await queryObjects(db, 'select * from v_filtered_groups where run_id = $1 order by step, group_uid', [
      run.runId,
    ]);
    const filtered = groupBy(
      run.trajectories.filter((t) => t.filtered),
      (t) => `${t.step}/${t.groupUid}`,
    );
    assert.ok(filtered.size > 0, 'the fixture filters some groups');
    assert.equal(rows.length, filtered.size);
    for (const r of rows) {
      const g = filtered.get(`${r.step}/${r.group_uid}`)!;
      assert.equal(r.filter_reason, g[0].filterReason);
      assert.equal(r.prompt_text, g[0].promptText);
      assert.equal(r.prompt_index, g[0].promptIndex);
      assert.equal(r.n, g.length);
      const rw = g.map((t) => t.reward!).filter((x) => x !== null);
      close(r.reward_mean, mean(rw), 'filtered reward_mean');
      close(r.reward_std, Math.sqrt(mean(rw.map((x) => (x - mean(rw)) ** 2))), 'filtered reward_std');
    }
  },

  async v_reward_failures(db, run) {
    const rows = await queryObjects(db, 'select * from v_reward_failures where run_id = $1 order by source, step', [
      run.runId,
    ]);
    const tf = run.trajectories.filter((t) => t.rewardFailure);
    const vf = run.valGenerations.filter((g) => g.rewardFailure);
    assert.equal(rows.length, tf.length + vf.length);
    const traj = rows.filter((r) => r.source === 'trajectory');
    assert.deepEqual(
      traj.map((r) => [r.trajectory_id, r.step, r.reward_failure, r.kind]),
      tf.map((t) => [t.id, t.step, t.rewardFailure, t.kind]),
    );
    const val = rows.filter((r) => r.source === 'val_generation');
    assert.deepEqual(
      val.map((r) => [r.val_idx, r.step, r.reward_failure, r.trajectory_id]),
      vf.map((g) => [g.idx, g.step, g.rewardFailure, null]),
    );
  },

  async v_staleness(db, run) {
    const rows = await queryObjects(db, 'select * from v_staleness where run_id = $1 order by step', [run.runId]);
    const steps = groupBy(
      run.trajectories.filter((t) => t.kind === 'train'),
      (t) => String(t.step),
    );
    assert.equal(rows.length, steps.size);
    for (const r of rows) {
      const g: TrajectoryRow[] = steps.get(String(r.step))!;
      assert.equal(r.n, g.length);
      close(r.mean_staleness, mean(g.map((t) => t.staleness)), 'mean_staleness');
      assert.equal(r.max_staleness, Math.max(...g.map((t) => t.staleness)));
      assert.equal(r.n_stale, g.filter((t) => t.staleness > 0).length);
      assert.equal(r.min_policy_version, Math.min(...g.map((t) => t.policyVersion)));
      assert.equal(r.max_policy_version, Math.max(...g.map((t) => t.policyVersion)));
    }
  },

  async v_checkpoint_lineage(db, run) {
    const rows = await queryObjects(db, 'select * from v_checkpoint_lineage where run_id = $1 order by step', [
      run.runId,
    ]);
    assert.deepEqual(
      rows.map((r) => [r.step, r.policy_version, r.sha256, r.path]),
      run.checkpoints.map((c) => [c.step, c.policyVersion, c.sha256, c.path]),
    );
    assert.deepEqual(
      rows.map((r) => r.prev_step),
      [null, ...run.checkpoints.slice(0, -1).map((c) => c.step)],
    );
    assert.deepEqual(
      rows.map((r) => r.prev_sha256),
      [null, ...run.checkpoints.slice(0, -1).map((c) => c.sha256)],
    );
    assert.ok(rows.every((r) => r.parent_run_id === null && r.matches_parent === null));
    assert.deepEqual(rows[0].consumed_offsets, run.checkpoints[0].consumedOffsets);
    if (run.replayRunId) {
      const rep = await queryObjects(db, 'select * from v_checkpoint_lineage where run_id = $1 order by step', [
        run.replayRunId,
      ]);
      assert.deepEqual(
        rep.map((r) => r.parent_run_id),
        rep.map(() => run.runId),
      );
      assert.deepEqual(
        rep.map((r) => r.parent_sha256),
        run.checkpoints.map((c) => c.sha256),
      );
      assert.deepEqual(
        rep.map((r) => r.matches_parent),
        run.replayCheckpoints.map((c, i) => c.sha256 === run.checkpoints[i].sha256),
      );
      assert.ok(rep.some((r) => r.matches_parent === true) && rep.some((r) => r.matches_parent === false));
    }
  },

  async v_dead_letters(db, run) {
    const rows = await queryObjects(
      db,
      'select * from v_dead_letters where run_id = $1 order by source_topic, source_offset',
      [run.runId],
    );
    const want = [...run.deadLetters].sort((a, b) => a.topic.localeCompare(b.topic) || a.offset - b.offset);
    assert.deepEqual(
      rows.map((r) => [
        r.stage,
        r.source_topic,
        r.source_partition,
        r.source_offset,
        r.reason,
        r.error_code,
        r.payload_bytes,
      ]),
      want.map((d) => [
        d.stage,
        d.topic,
        d.partition,
        d.offset,
        d.reason,
        d.errorCode,
        d.payload ? d.payload.length : null,
      ]),
    );
  },

  async v_runs(db, run) {
    const [r] = await queryObjects(db, 'select * from v_runs where run_id = $1', [run.runId]);
    const trainSteps = [...new Set(run.metrics.filter((m) => !m.name.startsWith('val/')).map((m) => m.step))];
    const val = run.metrics.filter((m) => m.name === 'val/accuracy').sort((a, b) => a.step - b.step);
    const best = val.reduce((b, m) => (m.value > b.value ? m : b));
    assert.equal(r.status, 'completed');
    assert.equal(r.project, 'analysis-test');
    assert.equal(r.steps, trainSteps.length);
    assert.equal(r.last_step, Math.max(...trainSteps));
    close(r.final_reward_mean, metric(run, Math.max(...trainSteps), 'reward/mean')!, 'final_reward_mean');
    close(r.best_val_accuracy, best.value, 'best_val_accuracy');
    assert.equal(r.best_val_step, best.step);
    close(r.final_val_accuracy, val[val.length - 1].value, 'final_val_accuracy');
    assert.equal(r.checkpoints, run.checkpoints.length);
    assert.equal(r.last_checkpoint_step, run.checkpoints[run.checkpoints.length - 1].step);
    assert.equal(r.trajectories, run.trajectories.length);
    assert.equal(r.dead_letters, run.deadLetters.length);
    if (run.replayRunId) {
      const [rep] = await queryObjects(db, 'select * from v_runs where run_id = $1', [run.replayRunId]);
      assert.equal(rep.parent_run_id, run.runId);
      assert.equal(rep.steps, 0);
      assert.equal(rep.best_val_accuracy, null);
      assert.equal(rep.checkpoints, run.replayCheckpoints.length);
    }
  },
};
