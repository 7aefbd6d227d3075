import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  decide,
  filterExhausted,
  initialState,
  stepPrompts,
  totalSteps,
  refillPrompts,
  type ControllerPlan,
  type ControllerState,
  type ControllerEvent,
  type ControllerCommand,
} from '../../../services/controller/logic.ts';

const plan: ControllerPlan = {
  runId: 'r',
  trainSize: 10,
  valSize: 3,
  rolloutBatchSize: 4,
  valBatchSize: 3,
  totalEpochs: 2,
  maxSteps: null,
  maxStaleness: 0,
  valFreq: 2,
  valBeforeTrain: true,
  valOnly: false,
  shuffle: true,
  seed: 1,
  maxTryMakeBatch: 2,
};
const pol = (version: number) => ({ version, step: version, path: `ckpt/v${version}`, sha256: `sha${version}` });

function run(p: ControllerPlan, events: ControllerEvent[], state: ControllerState = initialState()) {
  const all: ControllerCommand[] = [];
  for (const e of events) {
    const r = decide(p, state, e);
    state = r.state;
    all.push(...r.commands);
  }
  return { state, commands: all };
}

test('plan: 2 full steps per epoch (last partial batch dropped), 4 steps over 2 epochs', () => {
  assert.equal(totalSteps(plan), 4);
  const e0 = [...stepPrompts(plan, 1).prompts, ...stepPrompts(plan, 2).prompts].map((p) => p.datasetIndex);
  assert.equal(new Set(e0).size, 8, 'no prompt repeats within an epoch');
  assert.equal(stepPrompts(plan, 3).epoch, 1);
  assert.notDeepEqual(stepPrompts(plan, 3).prompts, stepPrompts(plan, 1).prompts, 'each epoch reshuffles');
  assert.deepEqual(
    stepPrompts({ ...plan, shuffle: false }, 2).prompts.map((p) => p.datasetIndex),
    [4, 5, 6, 7],
  );
  assert.equal(totalSteps({ ...plan, maxSteps: 3 }), 3);
});

test('on-policy: step s is published only after version s−1 exists; val before train and every val_freq', () => {
  const r0 = run(plan, [{ type: 'policy', policy: pol(0) }]);
  assert.deepEqual(
    r0.commands.map((c) =>
      c.type === 'train_prompts' ? `t${c.step}` : c.type === 'val_prompts' ? `v${c.version}` : c.type,
    ),
    ['v0', 't1'],
  );
  const r1 = run(plan, [{ type: 'policy', policy: pol(1) }], r0.state);
  assert.deepEqual(
    r1.commands.map((c) => (c.type === 'train_prompts' ? `t${c.step}` : c.type)),
    ['t2'],
  );
  const r2 = run(
    plan,
    [
      { type: 'policy', policy: pol(2) },
      { type: 'policy', policy: pol(2) },
    ],
    r1.state,
  );
  assert.deepEqual(
    r2.commands.map((c) =>
      c.type === 'train_prompts' ? `t${c.step}` : c.type === 'val_prompts' ? `v${c.version}` : c.type,
    ),
    ['v2', 't3'],
    'duplicate policy events are ignored',
  );
});

test('staleness 1 lets step s+1 start while step s trains; run ends after final version and its validation', () => {
  const p = { ...plan, maxStaleness: 1 };
  const r = run(p, [{ type: 'policy', policy: pol(0) }]);
  assert.deepEqual(
    r.commands.filter((c) => c.type === 'train_prompts').map((c) => (c as { step: number }).step),
    [1, 2],
  );
  const end = run(
    p,
    [1, 2, 3, 4].map((v) => ({ type: 'policy', policy: pol(v) }) as ControllerEvent),
    r.state,
  );
  assert.ok(!end.commands.some((c) => c.type === 'run_done'), 'waits for validation rounds');
  const done = run(
    p,
    [0, 2, 4].map((v) => ({ type: 'val_done', version: v }) as ControllerEvent),
    end.state,
  );
  assert.deepEqual(done.commands, [{ type: 'run_done', finalVersion: 4 }]);
  assert.equal(done.state.done, true);
});

test('refills are deterministic, numbered after the first draw, and bounded by max_try_make_batch', () => {
  const r0 = run(plan, [{ type: 'policy', policy: pol(0) }]);
  const r1 = run(plan, [{ type: 'refill', step: 1, needed: 2 }], r0.state);
  const c = r1.commands[0] as Extract<ControllerCommand, { type: 'train_prompts' }>;
  assert.equal(c.attempt, 1);
  assert.deepEqual(
    c.prompts.map((p) => p.promptIndex),
    [4, 5],
  );
  assert.deepEqual(c.prompts, refillPrompts(plan, 1, 1, 2));
  const r2 = run(
    plan,
    [
      { type: 'refill', step: 1, needed: 2 },
      { type: 'refill', step: 1, needed: 2 },
    ],
    r1.state,
  );
  const fail = r2.commands.find((x) => x.type === 'fail') as { message: string };
  assert.match(fail.message, /max_try_make_batch/);
});

test('too small a dataset fails with what to change; val_only runs one validation round', () => {
  const r = run({ ...plan, trainSize: 3 }, [{ type: 'policy', policy: pol(0) }]);
  assert.match((r.commands[0] as { message: string }).message, /fewer than data\.rollout_batch_size = 4/);
  const v = run({ ...plan, valOnly: true }, [
    { type: 'policy', policy: pol(0) },
    { type: 'val_done', version: 0 },
  ]);
  assert.deepEqual(
    v.commands.map((c) => c.type),
    ['val_prompts', 'run_done'],
  );
});

import {
  assembleBatch,
  checkBatchArithmetic,
  splitBatches,
  shouldCheckpoint,
  versionsInUse,
} from '../../../services/update/logic.ts';

test('update: batch is ordered by id with duplicates dropped, whatever the arrival order', () => {
  const g1 = { samples: [{ id: 's1/p1/0' }, { id: 's1/p1/1' }] };
  const g0 = { samples: [{ id: 's1/p0/1' }, { id: 's1/p0/0' }] };
  const a = assembleBatch([g1, g0, g1]);
  assert.deepEqual(
    a.samples.map((s) => s.id),
    ['s1/p0/0', 's1/p0/1', 's1/p1/0', 's1/p1/1'],
  );
  assert.equal(a.duplicates, 2);
  assert.deepEqual(assembleBatch([g0, g1]).samples, a.samples);
});

test('update: batch arithmetic is explained when it does not divide', () => {
  assert.deepEqual(checkBatchArithmetic({ rolloutBatchSize: 8, n: 5, globalBatchSize: 20, microBatchSize: 10 }), {
    samplesPerStep: 40,
    miniBatches: 2,
    microPerMini: 2,
  });
  assert.throws(
    () => checkBatchArithmetic({ rolloutBatchSize: 8, n: 5, globalBatchSize: 16, microBatchSize: 4 }),
    /8 × 5 = 40 samples.*40 is not a multiple of 16; choose a divisor of 40/,
  );
  assert.throws(
    () => checkBatchArithmetic({ rolloutBatchSize: 8, n: 5, globalBatchSize: 20, microBatchSize: 8 }),
    /20 is not a multiple of 8/,
  );
  assert.throws(
    () => checkBatchArithmetic({ rolloutBatchSize: 2, n: 2, globalBatchSize: 8, microBatchSize: 4 }),
    /lower actor\.global_batch_size to at most 4/,
  );
  assert.deepEqual(splitBatches([1, 2, 3, 4, 5, 6], 3, 2), [
    [[1, 2], [3]],
    [[4, 5], [6]],
  ]);
});

test('update: checkpoint schedule and pruning', () => {
  assert.deepEqual(
    [1, 2, 3, 4, 5].filter((s) => shouldCheckpoint(s, 5, 2)),
    [2, 4, 5],
  );
  assert.deepEqual(
    [1, 2, 3].filter((s) => shouldCheckpoint(s, 3, -1)),
    [3],
  );
});

test("update keeps the versions validation may still sample with, read from the controller's stored state", () => {
  // the controller stores { ctl: ControllerState, … }: it has seen versions 0 and 1 and scheduled validation of 0
  const seen = run({ ...plan, valFreq: 1 }, [{ type: 'policy', policy: pol(0) }]);
  const stored = { ctl: seen.state, started: true, val: {} };
  assert.deepEqual(versionsInUse(stored, 0), [0], 'version 0: validation published, not done');
  // a replay's update stage is at version 4 while its controller has only seen version 0:
  // 1..4 may still be validated, so none of them may be pruned
  assert.deepEqual(versionsInUse(stored, 4), [0, 1, 2, 3, 4]);
  const done = run(
    { ...plan, valFreq: 1 },
    [
      { type: 'val_done', version: 0 },
      { type: 'policy', policy: pol(1) },
      { type: 'val_done', version: 1 },
    ],
    seen.state,
  );
  assert.deepEqual(versionsInUse({ ctl: done.state }, 3), [2, 3]);
  assert.deepEqual(versionsInUse(null, 2), [0, 1, 2], 'no controller state yet: nothing it may validate is pruned');
});

test("when refills run out, the stop message is the advantage stage's reason (reward failures), not online filtering", () => {
  const reason =
    'the reward failed for 16 samples in 4 of 4 groups (reward.on_failure dropped them); last error: r/train/s1/p3/n3: fn:/x/reward.mjs: reward function threw: boom — fix the reward function';
  const r0 = run(plan, [{ type: 'policy', policy: pol(0) }]);
  const r = run(
    plan,
    [1, 2, 3].map((request) => ({ type: 'refill' as const, step: 1, needed: 4, request, reason })),
    r0.state,
  );
  const fail = r.commands.find((x) => x.type === 'fail') as { message: string };
  assert.equal(
    fail.message,
    `step 1: too few usable groups after 2 extra batches (algorithm.max_try_make_batch): ${reason}`,
  );
  assert.doesNotMatch(fail.message, /online filtering|filter_low/);
});

test('online filtering out of refills: the message speaks of the semantics in use', () => {
  const easy = filterExhausted({ maxTryMakeBatch: 10, filterSemantics: 'easyr1', filterKey: 'overall' }, 7);
  assert.match(
    easy,
    /^step 7: online filtering kept too few groups after 10 extra batches \(algorithm\.max_try_make_batch\); too many groups' mean "overall" lies outside \(algorithm\.filter_low, algorithm\.filter_high\)/,
  );
  const dapo = filterExhausted({ maxTryMakeBatch: 10, filterSemantics: 'dapo', filterKey: 'accuracy' }, 7);
  assert.match(dapo, /filter_semantics = dapo a group is kept only when its "accuracy" values are not all equal/);
  assert.doesNotMatch(dapo, /filter_low|filter_high/);
});

import { addValGroup, valRoundResult, type ValRound } from '../../../services/controller/logic.ts';

test('controller: a validation round sums scored samples, counts failed rewards apart and ignores a redelivered group', () => {
  const rounds: Record<string, ValRound> = {};
  const sample = (i: number, reward: number | null, accuracy?: number) => ({
    sample_index: i,
    response_text: `r${i}`,
    reward,
    reward_details: (accuracy === undefined ? {} : { accuracy }) as Record<string, number>,
    failure: reward === null ? { message: 'timeout' } : null,
  });
  const g = { id: 'g0', step: 3, prompt_index: 1, prompt_text: 'p', ground_truth: '7' };
  const round = addValGroup(rounds, { ...g, samples: [sample(0, 0.5, 1), sample(1, 1), sample(2, null)] }, 2)!;
  assert.equal(addValGroup(rounds, { ...g, samples: [sample(0, 1)] }, 2), null);
  assert.deepEqual([round.n, round.failures, round.rewardSum, round.accSum], [2, 1, 1.5, 2]);
  assert.deepEqual(
    round.gens.map((x) => x.idx),
    [1000, 1001],
  );
  const r = valRoundResult(round, 3);
  assert.deepEqual(r.values, { 'val/reward_score': 0.75, 'val/accuracy': 1, 'val/failures': 1 });
  assert.equal(r.level, 'info');
  const failed = addValGroup({}, { ...g, samples: [sample(0, null)] }, 1)!;
  const f = valRoundResult(failed, 3);
  assert.equal(f.level, 'warn');
  assert.ok(Number.isNaN(f.values['val/accuracy']));
  assert.match(f.message, /reward failed for all 1 samples \(last error: timeout\)/);
});
