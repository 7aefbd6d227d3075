/**
 * VPPO end to end: a tiny fresh vision-language policy plays the vision number game
 * (data.task number_game_vision, 84×28 images → 3 image tokens) with algorithm.vppo.enable for 3
 * GRPO steps, entropy filtering on. On the stored rows, every trained sample's vppo_token_mask and
 * vppo_scaling_factor equal lib/rl/vppo.ts's reference functions (tokenVisualDependency and the
 * stored vppo_entropies → tokenGradientMask,
 * trajectoryAdvantageScaling) recomputed per step from the stored old_logprobs (the stage's
 * real-image pass), vppo_perturbed_logprobs and the unscaled advantages; the logged actor/*
 * metrics are those functions' metrics. The same command SIGKILLed right after the advantage
 * stage's VPPO step of step 2 (RLSTREAM_CRASH_AT) and run again ends with the uninterrupted
 * run's final checkpoint sha256. Replays over the recorded trajectories: with the source's config
 * (VPPO on) the perturbations are recomputed from the sample ids, so every stored mask, α and
 * checkpoint equals the source's; with algorithm.vppo.enable=false the same rollouts train without
 * masks or scaling (another policy); and that VPPO-off replay replayed with VPPO switched back on
 * scores step 1 exactly as the source did.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { replayRun } from '../../app/replay.ts';
import { tokenizerFor } from '../../lib/pipeline/policy.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import type { StoredTrajectory } from '../../lib/store/port.ts';
import { tokenGradientMask, tokenVisualDependency, trajectoryAdvantageScaling } from '../../lib/rl/vppo.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { killHard, resumeLines, selfKilledAt, spawnCli, type CliProc } from '../support/chaos-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'vppo-e2e';
const STEPS = 3;
const tmp = join(ROOT, 'test/.tmp', `vppo-${process.pid}`);
const procs: CliProc[] = [];
after(async () => {
  for (const p of procs) await killHard(p);
  rmSync(tmp, { recursive: true, force: true });
});

const overrides = (dir: string) => [
  `trainer.run_dir=${dir}`,
  `pipeline.run_id=${RUN_ID}`,
  `trainer.max_steps=${STEPS}`,
  'trainer.save_freq=1',
  'trainer.total_epochs=1',
  'data.task=number_game_vision',
  'reward.reward_fn=number_game_vision',
  'data.task_size.train=16',
  'data.task_size.val=0',
  // the generated 84×28 images as drawn, on the 28-px grid (patch 14 × merge 2): 3 × 1 = 3 image tokens
  'data.min_pixels=784',
  'data.max_pixels=12544',
  'data.image_factor=28',
  'data.max_prompt_length=48',
  'data.max_response_length=4',
  'actor.model.max_seq_len=56',
  'actor.model.vision.enable=true',
  'actor.model.vision.depth=1',
  'actor.model.vision.hidden_size=16',
  'actor.model.vision.num_heads=2',
  'actor.model.vision.intermediate_size=32',
  'algorithm.vppo.enable=true',
  'algorithm.vppo.top_p_perception_tokens=0.4',
  'algorithm.vppo.advantage_scaling_min=0.8',
  'algorithm.vppo.enable_entropy_filtering=true',
  'algorithm.vppo.top_p_entropy_tokens=0.25',
];

/** The (bs, T) tensors of a step's trained rows, zero-padded, as the stage builds them. */
function padded(rows: readonly StoredTrajectory[], pick: (r: StoredTrajectory) => readonly number[]) {
  const bs = rows.length,
    T = Math.max(...rows.map((r) => r.responseTokens.length));
  const data = new Float64Array(bs * T);
  rows.forEach((r, i) => data.set(pick(r), i * T));
  return { data, bs, T };
}

test(
  "VPPO on the vision game: stored masks and scaling factors are lib/rl/vppo.ts's on the stored log-probs, metrics logged, SIGKILL + rerun ends with the same checkpoint",
  { timeout: 300_000 },
  async () => {
    const refDir = join(tmp, 'reference');
    const cfg = loadConfig({ file: CONFIG, overrides: overrides(refDir) });
    const VOCAB = tokenizerFor(cfg).vocabSize;
    const out = await trainEmbedded(cfg, silentLogger(RUN_ID));
    assert.equal(out.status, 'completed', out.message);

    const store = await openStore({ kind: 'pglite', dir: join(refDir, 'db') });
    const [rows, metrics, ref] = await Promise.all([
      store.getTrajectories(RUN_ID, { kind: 'train' }),
      store.getMetrics(RUN_ID, [
        'actor/perception_token_fraction',
        'actor/entropy_token_fraction',
        'actor/sensitivity_score_mean',
        'actor/scaling_factor_mean',
      ]),
      store.latestCheckpoint(RUN_ID),
    ]).finally(() => store.close());
    assert.equal(ref?.step, STEPS);
    assert.equal(rows.length, STEPS * 4 * 4, '3 steps × 4 prompts × n = 4');
    const metric = (name: string, step: number) => metrics.find((m) => m.name === name && m.step === step)?.value;
    let partialMasks = 0,
      unequalAlpha = 0;
    for (let step = 1; step <= STEPS; step++) {
      const trained = rows.filter((r) => r.step === step && !r.filtered);
      assert.ok(trained.length > 0, `step ${step} trained on some samples`);
      assert.ok(
        rows.filter((r) => r.step === step && r.filtered).every((r) => r.vppoTokenMask === null),
        'filtered samples carry no VPPO mask',
      );
      for (const r of trained) {
        const L = r.responseTokens.length;
        assert.equal(r.imageHashes.length, 1, `${r.id}: one prompt image`);
        assert.ok(
          r.oldLogprobs && r.vppoPerturbedLogprobs && r.vppoTokenMask && r.advantages && r.vppoScalingFactor !== null,
          `${r.id}: old and perturbed log-probs, mask, α stored`,
        );
        assert.ok(r.vppoEntropies, `${r.id}: token entropies stored (entropy filtering is on)`);
        assert.deepEqual(
          [r.oldLogprobs.length, r.vppoPerturbedLogprobs.length, r.vppoTokenMask.length, r.vppoEntropies.length],
          [L, L, L, L],
        );
        r.vppoEntropies.forEach((h, t) =>
          assert.ok(h >= 0 && h <= Math.log(VOCAB) + 1e-4, `${r.id} token ${t}: entropy ${h} outside [0, ln V]`),
        );
        // the stage's real-image pass scores the sampled tokens with the generating weights: the sampler's log-probs
        r.oldLogprobs.forEach((lp, t) =>
          assert.ok(
            Math.abs(lp - r.behaviourLogprobs[t]!) < 1e-3,
            `${r.id} token ${t}: old ${lp} vs behaviour ${r.behaviourLogprobs[t]}`,
          ),
        );
      }
      // lib/rl/vppo.ts on the stored values: S_t, the top-⌈0.4·L⌉ mask per response, α over the step's batch
      const old = padded(trained, (r) => r.oldLogprobs!);
      const aug = padded(trained, (r) => r.vppoPerturbedLogprobs!);
      const mask = padded(trained, (r) => r.responseTokens.map(() => 1));
      const adv = padded(trained, (r) => r.advantages!);
      const ent = padded(trained, (r) => r.vppoEntropies!);
      const cfgV = { top_p_perception_tokens: 0.4, top_p_entropy_tokens: 0.25, advantage_scaling_min: 0.8 };
      const dep = tokenVisualDependency(old, aug);
      const filt = tokenGradientMask(mask, { dependency: dep, entropy: ent }, cfgV);
      const scale = trajectoryAdvantageScaling(adv, dep, mask, cfgV);
      trained.forEach((r, i) => {
        const want = r.responseTokens.map((_, t) => filt.keep_mask.data[i * old.T + t] === 1);
        assert.deepEqual(Array.from(r.vppoTokenMask!, Boolean), want, `${r.id}: stored token mask`);
        if (want.some((k) => !k)) partialMasks++;
        assert.ok(
          Math.abs(r.vppoScalingFactor! - scale.alpha[i]!) <= 1e-5 * Math.max(1, scale.alpha[i]!),
          `${r.id}: α ${r.vppoScalingFactor} vs ${scale.alpha[i]}`,
        );
        if (Math.abs(scale.alpha[i]! - 1) > 1e-3) unequalAlpha++;
      });
      const close = (name: string, want: number) => {
        const got = metric(name, step);
        assert.ok(
          got !== undefined && Math.abs(got - want) < 1e-4,
          `step ${step} ${name}: logged ${got}, recomputed ${want}`,
        );
      };
      close('actor/perception_token_fraction', filt.metrics.perception_token_fraction);
      close('actor/entropy_token_fraction', filt.metrics.entropy_token_fraction);
      close('actor/sensitivity_score_mean', scale.metrics.sensitivity_score_mean);
      close('actor/scaling_factor_mean', scale.metrics.scaling_factor_mean);
    }
    assert.ok(partialMasks > 0, 'some responses have tokens whose gradient is dropped');
    assert.ok(unequalAlpha > 0, 'the perturbation moves the log-probs enough to spread α');

    // replays over the recorded trajectories, VPPO on and off
    const stored = async (dir: string, runId: string) => {
      const st = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
      try {
        const [traj, cps] = await Promise.all([
          st.getTrajectories(runId, { kind: 'train' }),
          st.listCheckpoints(runId),
        ]);
        return { traj, checkpoints: cps.map((c) => [c.step, c.sha256]) };
      } finally {
        await st.close();
      }
    };
    const vppoOf = (r: StoredTrajectory) => ({
      step: r.step,
      p: r.promptIndex,
      n: r.sampleIndex,
      filtered: r.filtered,
      aug: r.vppoPerturbedLogprobs,
      mask: r.vppoTokenMask ? Array.from(r.vppoTokenMask) : null,
      alpha: r.vppoScalingFactor,
      entropies: r.vppoEntropies,
    });
    const srcVppo = rows.map(vppoOf);
    const srcCheckpoints = (await stored(refDir, RUN_ID)).checkpoints;
    const same = await replayRun({ from: refDir, overrides: [], log: silentLogger('vppo-replay') });
    assert.equal(same.status, 'completed', same.message);
    const sameRows = await stored(same.runDir, same.runId);
    assert.deepEqual(
      sameRows.traj.map(vppoOf),
      srcVppo,
      'the replay recomputes the same perturbed log-probs, masks and α',
    );
    assert.deepEqual(sameRows.checkpoints, srcCheckpoints, 'and ends with the same checkpoints');
    const off = await replayRun({
      from: refDir,
      overrides: ['algorithm.vppo.enable=false', 'algorithm.vppo.enable_entropy_filtering=false'],
      log: silentLogger('vppo-replay'),
    });
    assert.equal(off.status, 'completed', off.message);
    const offRows = await stored(off.runDir, off.runId);
    assert.equal(offRows.traj.length, rows.length, 'the same recorded samples');
    assert.ok(
      offRows.traj.every(
        (r) =>
          r.vppoPerturbedLogprobs === null &&
          r.vppoTokenMask === null &&
          r.vppoScalingFactor === null &&
          r.vppoEntropies === null,
      ),
      'VPPO off: no perturbed log-probs, masks, α or entropies',
    );
    assert.deepEqual(
      offRows.traj.map((r) => [r.step, r.promptIndex, r.sampleIndex, r.responseTokens]),
      rows.map((r) => [r.step, r.promptIndex, r.sampleIndex, r.responseTokens]),
      'identical rollouts',
    );
    assert.equal(offRows.checkpoints.length, srcCheckpoints.length);
    assert.notEqual(
      offRows.checkpoints.at(-1)![1],
      srcCheckpoints.at(-1)![1],
      'without the masks and α training ends with another policy',
    );
    // the VPPO-off replay, replayed with VPPO on: step 1 (same weights v0) is scored as the source scored it
    const on = await replayRun({
      from: off.runDir,
      overrides: ['algorithm.vppo.enable=true', 'algorithm.vppo.enable_entropy_filtering=true'],
      log: silentLogger('vppo-replay'),
    });
    assert.equal(on.status, 'completed', on.message);
    const onRows = await stored(on.runDir, on.runId);
    assert.ok(
      onRows.traj.filter((r) => !r.filtered).every((r) => r.vppoTokenMask !== null),
      'VPPO on: every trained sample has a mask',
    );
    assert.deepEqual(
      onRows.traj.filter((r) => r.step === 1).map(vppoOf),
      srcVppo.filter((r) => r.step === 1),
      'step 1 perturbed, masked and scaled as in the source',
    );
    assert.deepEqual(onRows.checkpoints[0], srcCheckpoints[0], "and step 1 ends with the source's checkpoint");

    // the same command, SIGKILLed right after step 2's VPPO step, then run again
    const dir = join(tmp, 'crashed');
    const args = ['train', CONFIG, ...overrides(dir)];
    const killed = spawnCli(args, { RLSTREAM_CRASH_AT: 'advantage:computed@2' });
    procs.push(killed);
    const k = await killed.exit;
    assert.equal(k.signal, 'SIGKILL', killed.output().slice(-2000));
    assert.equal(selfKilledAt(killed.output()), 'advantage:computed@2');
    const again = spawnCli(args);
    procs.push(again);
    const e = await again.exit;
    assert.equal(e.code, 0, again.output().slice(-2000));
    const resumed = resumeLines(again.output());
    assert.equal(resumed.length, 1, 'the rerun resumed from a checkpoint');
    assert.ok(resumed[0]!.step >= 1 && resumed[0]!.step < STEPS, resumed[0]!.text);
    const s2 = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
    const [latest, n] = await Promise.all([s2.latestCheckpoint(RUN_ID), s2.countTrajectories(RUN_ID)]).finally(() =>
      s2.close(),
    );
    assert.deepEqual(
      [latest?.step, latest?.sha256],
      [STEPS, ref.sha256],
      'the killed and rerun run ends with the uninterrupted checkpoint',
    );
    assert.ok(n >= rows.length, `${n} trajectory rows`);
  },
);
