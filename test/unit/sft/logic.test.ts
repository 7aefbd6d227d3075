import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  collate,
  epochPermutation,
  packExamples,
  sftBatchIndices,
  sftPosition,
  sftStepsPerEpoch,
  sftTotalSteps,
  type SftExample,
  type SftPlan,
} from '../../../lib/sft/logic.ts';
import { ConfigError } from '../../../lib/errors.ts';

const plan: SftPlan = { units: 10, batchSize: 3, epochs: 2, maxSteps: null, shuffle: true, seed: 7 };

test('each epoch takes every example at most once in full batches, the incomplete last batch dropped; epochs are shuffled differently', () => {
  assert.equal(sftStepsPerEpoch(plan), 3);
  assert.equal(sftTotalSteps(plan), 6);
  assert.equal(sftTotalSteps({ ...plan, maxSteps: 4 }), 4);
  const epoch = (e: number) => [1, 2, 3].flatMap((k) => sftBatchIndices(plan, e * 3 + k));
  for (const e of [0, 1]) {
    const seen = epoch(e);
    assert.equal(new Set(seen).size, 9);
    assert.deepEqual(seen, Array.from(epochPermutation(10, 7, e)).slice(0, 9));
  }
  assert.notDeepEqual(epoch(0), epoch(1));
  // a pure function of the step: a resumed run sees the same batches
  assert.deepEqual(sftBatchIndices(plan, 5), sftBatchIndices({ ...plan }, 5));
  assert.deepEqual(
    [1, 2, 3].flatMap((k) => sftBatchIndices({ ...plan, shuffle: false }, k)),
    [0, 1, 2, 3, 4, 5, 6, 7, 8],
  );
  assert.throws(
    () => sftBatchIndices({ ...plan, units: 2 }, 1),
    (e: unknown) => e instanceof ConfigError && /fewer than actor\.global_batch_size = 3/.test(e.message),
  );
  assert.deepEqual(
    [sftPosition(plan, 4).epoch, sftPosition(plan, 4).index, sftPosition(plan, 3).epoch, sftPosition(plan, 3).index],
    [1, 3, 1, 0],
  );
});

const ex = (n: number, first: number, source: string): SftExample => ({
  tokens: Int32Array.from({ length: n }, (_, i) => first + i),
  mask: Uint8Array.from({ length: n }, (_, i) => (i >= n / 2 ? 1 : 0)),
  source,
});

test('packing concatenates examples in order into rows of at most max_length, each keeping its own loss mask', () => {
  const rows = packExamples([ex(4, 10, 'a:1'), ex(3, 20, 'a:2'), ex(5, 30, 'a:3'), ex(2, 40, 'a:4')], 8);
  assert.deepEqual(
    rows.map((r) => Array.from(r.tokens)),
    [
      [10, 11, 12, 13, 20, 21, 22],
      [30, 31, 32, 33, 34, 40, 41],
    ],
  );
  assert.deepEqual(
    rows.map((r) => Array.from(r.mask)),
    [
      [0, 0, 1, 1, 0, 0, 1],
      [0, 0, 0, 1, 1, 0, 1],
    ],
  );
  assert.deepEqual(
    rows.map((r) => r.source),
    ['a:1', 'a:3'],
  );
  assert.throws(() => packExamples([ex(9, 0, 'b:7')], 8), /b:7: example is 9 tokens, over sft\.max_length = 8/);
});

test('collate right-pads to the longest example; the loss mask is the response mask, zero on padding', () => {
  const b = collate([ex(4, 10, 'a:1'), ex(2, 20, 'a:2')], 99);
  assert.deepEqual([b.batchSize, b.seqLen], [2, 4]);
  assert.deepEqual(Array.from(b.tokens), [10, 11, 12, 13, 20, 21, 99, 99]);
  assert.deepEqual(Array.from(b.attentionMask!), [1, 1, 1, 1, 1, 1, 0, 0]);
  assert.deepEqual(Array.from(b.responseMask), [0, 0, 1, 1, 0, 1, 0, 0]);
});
