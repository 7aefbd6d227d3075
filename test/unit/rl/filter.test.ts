/**
 * Online group filtering (EasyR1 and DAPO semantics) and the controller that draws more batches.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  filterGroups,
  initialFilterState,
  makeFilteredBatch,
  offerBatch,
  onlineFilters,
  RlError,
  type DrawnBatch,
  type OnlineFilterConfig,
} from '../../../lib/rl/index.ts';

const index = ['a', 'b', 'a', 'c', 'b', 'a', 'c', 'd'];
//             acc per group: a = (1, 1, 1) mean 1; b = (0, 1) mean 0.5; c = (0, 0) mean 0; d = (0.5) single
const acc = [1, 0, 1, 0, 1, 1, 0, 0.5];

test('registry: easyr1 and dapo; unknown semantics list the valid ones', () => {
  assert.deepEqual(onlineFilters.names(), ['dapo', 'easyr1']);
  assert.throws(() => filterGroups(index, acc, 'dynamic'), /unknown online_filter "dynamic" — valid: dapo, easyr1/);
});

test('easyr1: keep a group iff filter_low < mean < filter_high (strict)', () => {
  const r = filterGroups(index, acc, 'easyr1', { filter_low: 0.01, filter_high: 0.99 });
  assert.deepEqual(r.kept_groups, ['b', 'd']);
  assert.deepEqual(r.dropped_groups, ['a', 'c']);
  assert.deepEqual(r.kept_rows, [1, 4, 7]);
  assert.deepEqual(Array.from(r.keep), [0, 1, 0, 0, 1, 0, 0, 1]);
  // strictness: a mean equal to a bound is dropped
  assert.deepEqual(filterGroups(['x', 'x'], [0, 1], 'easyr1', { filter_low: 0.5, filter_high: 0.9 }).kept_groups, []);
  assert.deepEqual(filterGroups(['x', 'x'], [0, 1], 'easyr1', { filter_low: 0.49, filter_high: 0.9 }).kept_groups, [
    'x',
  ]);
  assert.throws(
    () => filterGroups(index, acc, 'easyr1', { filter_low: 0.9, filter_high: 0.1 }),
    /filter_low \(0.9\) must be < filter_high \(0.1\)/,
  );
});

test('dapo: keep a group iff its metric values are not all equal (std > 0); singletons kept as in the DAPO recipe', () => {
  const r = filterGroups(index, acc, 'dapo');
  assert.deepEqual(r.kept_groups, ['b', 'd']);
  assert.deepEqual(filterGroups(index, acc, 'dapo', { keep_singletons: false }).kept_groups, ['b']);
  // all-equal continuous values (e.g. 0.1 three times) have std 0 even though a float mean might not be exact
  assert.deepEqual(filterGroups(['x', 'x', 'x'], [0.1, 0.1, 0.1], 'dapo').kept_groups, []);
});

test('metric validation: NaN values and length mismatches are rejected', () => {
  assert.throws(() => filterGroups(['a', 'a'], [1, NaN], 'dapo'), /metric value of response 1 is NaN/);
  assert.throws(() => filterGroups(['a', 'a'], [1], 'dapo'), /the metric has 1 values for 2 responses/);
});

const cfg: OnlineFilterConfig = {
  semantics: 'easyr1',
  filter_key: 'overall',
  filter_low: 0.01,
  filter_high: 0.99,
  rollout_batch_size: 3,
  max_try_make_batch: 3,
};
const batch = (index: string[], overall: number[]): DrawnBatch => ({
  index,
  reward_metrics: { overall, accuracy: overall },
});

test('controller: draws until rollout_batch_size groups are kept, then selects the first ones in draw order', async () => {
  const batches = [
    batch(['p', 'p', 'q', 'q'], [1, 1, 0, 1]), // keeps q
    batch(['r', 'r', 's', 's'], [0, 0, 0, 0]), // keeps nothing
    batch(['t', 't', 'u', 'u', 'v', 'v'], [1, 0, 0, 1, 1, 0]), // keeps t, u, v
  ];
  let calls = 0;
  const out = await makeFilteredBatch((attempt) => {
    assert.equal(attempt, calls);
    return batches[calls++];
  }, cfg);
  assert.equal(calls, 3);
  assert.deepEqual(
    out.selection,
    [
      { batch: 0, rows: [2, 3] },
      { batch: 2, rows: [0, 1, 2, 3] },
    ],
    'q, then t and u; v is beyond the 3 groups needed',
  );
  assert.equal(out.metrics['filter/num_gen_batches'], 3);
  assert.equal(out.metrics['filter/kept_groups'], 4);
  assert.equal(out.metrics['filter/dropped_groups'], 3);
  assert.equal(out.batches.length, 3);
});

test('controller: a clear, non-retriable error after max_try_make_batch draws; ≤ 0 means unlimited', () => {
  let s = initialFilterState();
  const dud = batch(['a', 'a'], [1, 1]);
  s = offerBatch(s, dud, cfg).state;
  s = offerBatch(s, dud, cfg).state;
  assert.throws(
    () => offerBatch(s, dud, cfg),
    (e: unknown) =>
      e instanceof RlError &&
      !e.retriable &&
      e.code === 'ERR_FILTER_EXHAUSTED' &&
      /kept 0 of the 3 groups needed after 3 generated batches \(max_try_make_batch = 3\)/.test(e.message),
  );
  let u = initialFilterState();
  for (let i = 0; i < 20; i++) {
    const step = offerBatch(u, dud, { ...cfg, max_try_make_batch: 0 });
    assert.equal(step.done, false);
    u = step.state;
  }
  assert.throws(
    () => offerBatch(initialFilterState(), dud, { ...cfg, filter_key: 'acc' }),
    /reward metric "acc" is missing — available: accuracy, overall/,
  );
  assert.throws(
    () => offerBatch(initialFilterState(), dud, { ...cfg, rollout_batch_size: 0 }),
    /rollout_batch_size must be a positive integer/,
  );
});

test('controller with DAPO semantics: state is immutable, each step is pure', () => {
  const s0 = initialFilterState();
  const b = batch(['a', 'a', 'b', 'b'], [1, 0, 1, 1]);
  const step = offerBatch(s0, b, { ...cfg, semantics: 'dapo', rollout_batch_size: 1 });
  assert.equal(s0.tries, 0);
  assert.equal(step.done, true);
  assert.deepEqual(step.selection, [{ batch: 0, rows: [0, 1] }]);
});
