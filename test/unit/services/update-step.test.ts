/**
 * The update stage's per-batch bookkeeping (services/update/logic.ts): consumer positions, the
 * pending items of a batch, where the groups of untrained steps start in the log (recorded with a
 * checkpoint) and the logged steps a resume re-trains, a trained step's metrics and policy record,
 * the run's optimizer steps and the packing options of a config.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  advancePositions,
  noteStepStarts,
  packOptions,
  pendingUpdates,
  rereadFrom,
  stepBucket,
  stepMetrics,
  stepRecord,
  totalOptimizerSteps,
  versionFilesOf,
  writesVersionFile,
} from '../../../services/update/logic.ts';
import { planFromConfig } from '../../../lib/pipeline/plan.ts';
import { loggedSteps } from '../../../lib/pipeline/update-resume.ts';
import type { UpdateGroup } from '../../../lib/contracts/index.ts';
import { join } from 'node:path';
import { loadConfig } from '../../../lib/config/index.ts';

function group(id: string, step: number, policyVersion: number, samples: number, filtered = false): UpdateGroup {
  return {
    id,
    step,
    policy_version: policyVersion,
    filtered,
    prompt_ids: Int32Array.from([1, 2]),
    samples: Array.from({ length: samples }, (_, i) => ({ id: `${id}-${i}`, response_ids: Int32Array.from([3]) })),
  } as unknown as UpdateGroup;
}

test('positions move to the offset after each record, never back', () => {
  const positions = { 'updates/0': 10 };
  const out = advancePositions(positions, [
    { topic: 'updates', partition: 0, offset: 4 },
    { topic: 'updates', partition: 1, offset: 7 },
    { topic: 'updates', partition: 1, offset: 5 },
    { topic: 'updates', partition: 0, offset: 12 },
  ]);
  assert.equal(out, positions, 'updated in place');
  assert.deepEqual(out, { 'updates/0': 13, 'updates/1': 8 });
});

test('pending items: groups of untrained steps only, bucketed by zero-padded step, payload kept as sent', () => {
  const rec = (g: UpdateGroup, payload: string) => ({ value: g, message: { value: payload, headers: { h: g.id } } });
  const items = pendingUpdates(
    [rec(group('a', 3, 2, 1), 'A'), rec(group('b', 4, 3, 1), 'B'), rec(group('c', 12, 3, 1), 'C')],
    3,
  );
  assert.deepEqual(items, [
    { bucket: 'step:00000004', id: 'b', payload: 'B', headers: { h: 'b' } },
    { bucket: 'step:00000012', id: 'c', payload: 'C', headers: { h: 'c' } },
  ]);
  assert.ok(stepBucket(9) < stepBucket(10), 'buckets sort by step');
});

test("a trained step's metrics: the learner's, the kl/clipfrac aliases, staleness against the trained version, tokens", () => {
  const m = stepMetrics(
    { 'actor/pg_loss': 0.5, 'actor/ppo_kl': 0.01, 'actor/pg_clipfrac': 0.2 },
    [group('a', 5, 4, 2), group('b', 5, 2, 2)],
    4,
    77,
  );
  assert.deepEqual(m, {
    'actor/pg_loss': 0.5,
    'actor/ppo_kl': 0.01,
    'actor/pg_clipfrac': 0.2,
    'actor/approx_kl': 0.01,
    'actor/clipfrac': 0.2,
    'staleness/mean': 1,
    'staleness/max': 2,
    'perf/update_tokens': 77,
  });
  const bare = stepMetrics({}, [], 0, 0);
  assert.equal(bare['actor/approx_kl'], 0, 'no ppo_kl reported: 0');
  assert.equal(bare['staleness/max'], 0);
});

test("a step's policy record counts every group (filtered ones too) and lists the consumed offsets", () => {
  const r = stepRecord([group('a', 1, 0, 3), group('b', 1, 0, 2, true)], 40, { 'rl.updates/0': 5, 'rl.updates/1': 2 });
  assert.deepEqual(r, {
    groups: 2,
    samples: 5,
    tokens: 40,
    consumed: [
      { topic: 'rl.updates', partition: 0, next_offset: 5 },
      { topic: 'rl.updates', partition: 1, next_offset: 2 },
    ],
  });
});

test('optimizer steps of a run: steps × mini-batches × epochs, at least one', () => {
  assert.equal(totalOptimizerSteps(50, 10, 4), 2000);
  assert.equal(totalOptimizerSteps(0, 10, 4), 1);
});

test("packing options come from the config's batch size, response length, VPPO and KL-loss switches", () => {
  const cfg = loadConfig({
    file: join(import.meta.dirname, '../../../examples/number-game.yaml'),
    overrides: ['data.max_response_length=3', 'algorithm.use_kl_loss=false'],
  });
  assert.deepEqual(packOptions(cfg, 3), {
    miniBatchSize: 64,
    padTokenId: 3,
    lossScaleFactor: 3,
    vppo: false,
    klLoss: false,
  });
});

test('a checkpoint records where the groups of every later step start: a step in flight keeps its first offset', () => {
  const rec = (g: UpdateGroup, partition: number, offset: number) => ({
    value: g,
    message: { topic: 'updates', partition, offset },
  });
  // one batch brings the end of step 2 and the start of step 3 (partition 0), and step 3 on partition 1
  const starts = noteStepStarts(
    {},
    [rec(group('a', 2, 1, 1), 0, 7), rec(group('b', 3, 2, 1), 0, 8), rec(group('c', 3, 2, 1), 1, 4)],
    1,
  );
  assert.deepEqual(starts, { '2': { 'updates/0': 7 }, '3': { 'updates/0': 8, 'updates/1': 4 } });
  noteStepStarts(starts, [rec(group('d', 3, 2, 1), 0, 9), rec(group('e', 1, 0, 1), 0, 10)], 1);
  assert.deepEqual(
    starts['3'],
    { 'updates/0': 8, 'updates/1': 4 },
    'the first offset stays; trained steps are not noted',
  );
  const positions = { 'updates/0': 11, 'updates/1': 5, 'updates/2': 3 };
  // after step 2 trains, its checkpoint re-reads from step 3's first offsets, elsewhere from the position
  assert.deepEqual(rereadFrom(positions, starts, 2), { 'updates/0': 8, 'updates/1': 4, 'updates/2': 3 });
  assert.deepEqual(rereadFrom(positions, starts, 3), positions, 'nothing in flight: the positions');
});

test("a resume's logged steps: this run's groups of the steps after the base, once each, in id order", () => {
  const mine = (id: string, step: number) => ({ ...group(id, step, step - 1, 1), run_id: 'r' }) as UpdateGroup;
  const other = { ...group('x', 3, 2, 1), run_id: 'other' } as UpdateGroup;
  const steps = loggedSteps(
    [mine('b', 3), mine('a', 3), other, mine('c', 2), mine('a', 3), mine('d', 5), mine('e', 4)],
    'r',
    2,
    4,
  );
  assert.deepEqual(
    [...steps].map(([s, gs]) => [s, gs.map((g) => g.id)]),
    [
      [3, ['a', 'b']],
      [4, ['e']],
    ],
  );
});

test('writesVersionFile: checkpoints writes checkpoint steps, the versions a restart may sample with, validated versions', () => {
  const cfg = loadConfig({
    file: join(import.meta.dirname, '../../../examples/number-game.yaml'),
    overrides: ['trainer.max_steps=20', 'trainer.save_freq=8', 'pipeline.max_staleness=1', 'trainer.val_freq=-1'],
  });
  const plan = planFromConfig(cfg, 'r', 10_000, 0);
  const written = (files: 'every_step' | 'checkpoints') =>
    Array.from({ length: 20 }, (_, i) => i + 1).filter((s) => writesVersionFile(s, files, cfg, plan));
  // checkpoints 8, 16, 20; with max_staleness 1 the version before each too
  assert.deepEqual(written('checkpoints'), [7, 8, 15, 16, 19, 20]);
  const strict = { ...cfg, pipeline: { ...cfg.pipeline, max_staleness: 0 } };
  assert.deepEqual(
    Array.from({ length: 20 }, (_, i) => i + 1).filter((s) => writesVersionFile(s, 'checkpoints', strict, plan)),
    [8, 16, 20],
  );
  assert.equal(written('every_step').length, 20);
  const validated = planFromConfig({ ...cfg, trainer: { ...cfg.trainer, val_freq: 5 } }, 'r', 10_000, 4);
  assert.ok(writesVersionFile(5, 'checkpoints', cfg, validated), 'a validation round samples with version 5');
  assert.ok(!writesVersionFile(4, 'checkpoints', cfg, validated));
});

test('versionFilesOf: in memory when the rollout is in the process; files for other processes (an inference engine too), LoRA and image policies', () => {
  const cfg = (
    over: Partial<{
      set: 'every_step' | 'checkpoints';
      replicas: number;
      lora: boolean;
      image: boolean;
      openai: boolean;
    }>,
  ) => ({
    policy: { version_files: over.set ?? ('auto' as const) },
    rollout: { replicas: over.replicas ?? 1, engine: over.openai ? ('openai' as const) : ('onnx' as const) },
    actor: {
      model: {
        lora: over.lora ? ({ rank: 8 } as never) : null,
        kind: over.image ? ('image' as const) : ('language' as const),
      },
    },
  });
  assert.equal(versionFilesOf(cfg({}), true), 'checkpoints');
  assert.equal(versionFilesOf(cfg({}), false), 'every_step');
  assert.equal(versionFilesOf(cfg({ replicas: 2 }), true), 'every_step');
  assert.equal(versionFilesOf(cfg({ set: 'every_step' }), true), 'every_step');
  assert.equal(versionFilesOf(cfg({ set: 'checkpoints' }), false), 'checkpoints');
  assert.equal(versionFilesOf(cfg({ lora: true, set: 'checkpoints' }), true), 'every_step');
  assert.equal(versionFilesOf(cfg({ image: true }), true), 'every_step');
  assert.equal(versionFilesOf(cfg({ openai: true, set: 'checkpoints' }), true), 'every_step');
});
