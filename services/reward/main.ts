/**
 * Reward stage: scores trajectory groups with the reward backend of `reward.type` (function
 * rewards, HTTP reward servers or an in-process ONNX reward model: lib/reward/backends.ts), and publishes scored groups
 * (training → `scored`, validation → `validation`). A trajectory that cannot be scored is a
 * recorded failure, and reward.on_failure decides: retry (re-score the failed samples up to
 * reward.max_retries_later more rounds, backing off), drop_group (publish it with its failures;
 * the advantage stage filters it out and asks for a refill), or stop (the run fails with the
 * message naming the servers and errors; the group is still published with its failures, so
 * the log keeps it).
 */
import { forStage } from '../../lib/log.ts';
import { runStage, type Pipeline, type StageRun } from '../../lib/pipeline/runtime.ts';
import { StageMetrics } from '../../lib/pipeline/metrics.ts';
import { crashPoint } from '../../lib/pipeline/crash-points.ts';
import { decideOnFailures } from '../../lib/reward/failure-policy.ts';
import { createRewardBackend as createBackend } from '../../lib/reward/backends.ts';
import type { RewardBackend } from '../../lib/reward/port.ts';
import type { TrajectoryGroup } from '../../lib/contracts/index.ts';
import { controlEvent, controlId } from '../../lib/contracts/index.ts';
import { rewardItems, samplesToScore, scoredGroup, failedSamples } from './logic.ts';

/**
 * The reward backend of `reward.type` (lib/reward/backends.ts) for this replica. Remote servers
 * are skipped when switched off (`reward.remote.enabled: false`, or `DISABLE_RL_REWARD_MODEL=true`
 * in `env` — debug mode): rewards then come from the reward function.
 */
export function createRewardBackend(
  p: Pipeline,
  replicaIndex: number,
  env: NodeJS.ProcessEnv = process.env,
): Promise<RewardBackend> {
  return createBackend({ cfg: p.cfg, log: p.log, replicaIndex, env });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export function startReward(p: Pipeline, backend: RewardBackend, opts: { replica?: string } = {}): StageRun {
  const metrics = new StageMetrics(p, 'reward', opts.replica ?? '');
  const log = forStage(p.log, 'reward');
  const r = p.cfg.reward;
  return runStage(p, 'reward', ['trajectories'], async (records, ctx) => {
    metrics.beginBatch(ctx.waitedMs);
    crashPoint('reward:start');
    const t0 = performance.now();
    const groups = records.map((x) => x.value as TrajectoryGroup);
    const items = groups.flatMap(rewardItems);
    let outcomes = await backend.score(items);
    // retry: re-score failed samples a bounded number of rounds, backing off between rounds
    for (let round = 1; r.on_failure === 'retry' && round <= r.max_retries_later; round++) {
      const failed = outcomes.filter((o) => !o.ok);
      if (failed.length === 0 || ctx.signal.aborted) break;
      await sleep(Math.min(r.remote.backoff_max_ms, r.remote.backoff_initial_ms * 2 ** round));
      const again = await backend.score(items.filter((it) => failed.some((f) => f.id === it.id)));
      const byId = new Map(again.map((o) => [o.id, o]));
      outcomes = outcomes.map((o) => (!o.ok && byId.get(o.id)?.ok ? byId.get(o.id)! : o));
    }
    crashPoint('reward:scored');
    const byId = new Map(outcomes.map((o) => [o.id, o]));
    const scored = [];
    for (const g of groups) {
      const all = samplesToScore(g);
      const gOut = all.map((s) => byId.get(s.id)!).filter(Boolean);
      const decision = decideOnFailures(
        gOut,
        {
          group_id: g.id,
          expected_ids: all.map((s) => s.id),
          attempt: r.max_retries_later,
          max_attempts: r.max_retries_later,
        },
        r.on_failure,
      );
      if (decision.action === 'stop') {
        ctx.emit(
          'control',
          controlEvent(
            'run_failed',
            { stage: 'reward', code: 'ERR_REWARD', message: `reward.on_failure = stop: ${decision.message}` },
            {
              run_id: p.runId,
              id: controlId(
                p.runId,
                'run_failed',
                `reward.${g.id.slice(p.runId.length + 1).replace(/[^A-Za-z0-9._-]/g, '.')}`,
              ),
              step: g.step,
              policy_version: g.policy_version,
              time_ms: Date.now(),
            },
          ),
        );
        log.error({ group: g.id }, `reward.on_failure = stop: ${decision.message}`);
      }
      const sg = scoredGroup(g, gOut, backend.name, r.on_failure === 'retry' ? r.max_retries_later + 1 : 1);
      scored.push(sg);
      ctx.emit(g.kind === 'val' ? 'validation' : 'scored', sg);
    }
    const train = scored.filter((g) => g.kind === 'train');
    const client = backend.metrics?.();
    for (const step of new Set(train.map((g) => g.step))) {
      metrics.add(
        step,
        { 'reward/failures': failedSamples(train.filter((g) => g.step === step)) },
        { compute: performance.now() - t0 },
      );
      if (client) metrics.set(step, client);
    }
    log.debug({ groups: groups.length, ms: Math.round(performance.now() - t0) }, 'scored');
    await metrics.flush(ctx);
  });
}
