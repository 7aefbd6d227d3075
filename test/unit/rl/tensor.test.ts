/** The batch-tensor helpers: construction, shape and finiteness checks, group bucketing. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  fromRows,
  groupRows,
  mask2d,
  maskFromLengths,
  tensor2d,
  tensor3d,
  toRows,
  zerosLike,
  dtypeOf,
  assertFinite,
} from '../../../lib/rl/index.ts';

test('constructors check lengths; fromRows/toRows round-trip; maskFromLengths builds right-padded masks', () => {
  assert.throws(() => tensor2d(new Float32Array(5), 2, 3), /data has 5 elements, shape \(2, 3\) needs 6/);
  assert.throws(() => mask2d(new Uint8Array(2), 1, 3), /data has 2 elements/);
  assert.throws(() => tensor3d(new Float64Array(6), 1, 2, 0), /V must be a positive integer/);
  assert.throws(() => tensor2d(new Float64Array(0), -1, 0), /shape must be non-negative integers/);
  const t = fromRows(
    [
      [1, 2],
      [3, 4],
    ],
    'float32',
  );
  assert.equal(dtypeOf(t.data), 'float32');
  assert.deepEqual(toRows(t), [
    [1, 2],
    [3, 4],
  ]);
  assert.deepEqual(toRows(zerosLike(t)), [
    [0, 0],
    [0, 0],
  ]);
  assert.throws(() => fromRows([[1, 2], [3]]), /row 1 has 1 values, row 0 has 2/);
  assert.deepEqual(toRows(maskFromLengths([3, 1, 0], 3)), [
    [1, 1, 1],
    [1, 0, 0],
    [0, 0, 0],
  ]);
  assert.throws(() => maskFromLengths([4], 3), /length 4 of row 0 is not an integer in \[0, 3\]/);
});

test('assertFinite names the input and the (row, col) of the first bad value', () => {
  assert.throws(
    () => assertFinite('log_prob', new Float64Array([0, 1, -Infinity, 2]), 2),
    /log_prob has a non-finite value -Infinity at \[1, 0\]/,
  );
  assert.doesNotThrow(() => assertFinite('x', new Float32Array([0, -1e30, 3.4e38])));
});

test('groupRows: labels in order of first appearance, rows bucketed in batch order, interleaved groups', () => {
  const g = groupRows(['b', 'a', 'b', 7, 'a', 'b'], 6);
  assert.deepEqual(g.labels, ['b', 'a', 7]);
  assert.deepEqual(Array.from(g.gid), [0, 1, 0, 2, 1, 0]);
  assert.deepEqual(Array.from(g.start), [0, 3, 5, 6]);
  assert.deepEqual(Array.from(g.order), [0, 2, 5, 1, 4, 3]);
  assert.throws(
    () => groupRows(['a', null as unknown as string], 2),
    /index\[1\] must be a string or finite number group label/,
  );
});
