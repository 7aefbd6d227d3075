/**
 * DAPO overlong reward shaping, the entropy penalty, the EMA of policy weights, and the masked
 * helpers.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  applyOverlongShaping,
  effectiveEmaDecay,
  emaUpdate,
  emaUpdateInPlace,
  entropyPenalty,
  maskedMean,
  maskedMeanRows,
  maskedSum,
  maskedVar,
  maskedWhiten,
  overlongPenalty,
} from '../../../lib/rl/index.ts';
import { close, closeArr, numericGrad, rows, t32, t64 } from './helpers.ts';

const dapo = { max_response_length: 20480, overlong_buffer_len: 4096, overlong_penalty_factor: 1.0 };

test('overlong shaping: 0 up to L_max − L_cache, then linear down to −factor at L_max (DAPO)', () => {
  assert.equal(overlongPenalty(1000, dapo), 0);
  assert.equal(overlongPenalty(16384, dapo), 0);
  close(overlongPenalty(16384 + 2048, dapo), -0.5, 1e-15);
  close(overlongPenalty(20480, dapo), -1, 1e-15);
  const out = applyOverlongShaping([1, 0, 1], [100, 18432, 20480], { ...dapo, overlong_penalty_factor: 0.5 });
  closeArr(out.rewards, [1, -0.25, 0.5], 1e-15);
  closeArr(out.penalties, [0, -0.25, -0.5], 1e-15);
  close(out.metrics['reward/overlong_fraction'], 2 / 3, 1e-15);
  assert.throws(() => overlongPenalty(10, { ...dapo, overlong_buffer_len: 0 }), /overlong_buffer_len must be > 0/);
  assert.throws(
    () => overlongPenalty(10, { ...dapo, overlong_buffer_len: 30000 }),
    /must not exceed max_response_length/,
  );
  assert.throws(() => applyOverlongShaping([1], [NaN], dapo), /response length 0 is NaN/);
  assert.throws(() => applyOverlongShaping([1, 2], [1], dapo), /2 rewards for 1 lengths/);
});

test('entropy penalty: coef·mean(−log p) over response tokens, with its gradient', () => {
  const lp = t64([
    [-1, -2, -9],
    [-0.5, -9, -9],
  ]);
  const mask = t64([
    [1, 1, 0],
    [1, 0, 0],
  ]);
  const out = entropyPenalty(lp, mask, 0.01);
  close(out.entropy, (1 + 2 + 0.5) / 3, 1e-15);
  close(out.penalty, (0.01 * 3.5) / 3, 1e-15);
  const x = new Float64Array(lp.data);
  closeArr(
    out.grad_log_prob.data,
    numericGrad((v) => entropyPenalty({ data: v, bs: 2, T: 3 }, mask, 0.01).penalty, x),
    1e-8,
  );
});

test('EMA: θ ← d·θ_ema + (1 − d)·θ; starts as a copy; warm-up decay min(d, (1+n)/(10+n)); in place agrees', () => {
  const w0 = { a: new Float32Array([1, 2]), b: new Float64Array([0]) };
  const e0 = emaUpdate(null, w0, 0.9);
  assert.notEqual(e0.a, w0.a, 'a copy, not the live weights');
  assert.deepEqual(Array.from(e0.a), [1, 2]);
  const w1 = { a: new Float32Array([3, 2]), b: new Float64Array([10]) };
  const e1 = emaUpdate(e0, w1, 0.9);
  closeArr(e1.a, [0.9 * 1 + 0.1 * 3, 2], 1e-7);
  closeArr(e1.b, [1], 1e-15);
  assert.ok(e1.a instanceof Float32Array && e1.b instanceof Float64Array, 'the EMA keeps its dtypes');
  assert.deepEqual(Array.from(e0.a), [1, 2], 'pure: the previous EMA is untouched');
  close(effectiveEmaDecay(0.999, { num_updates: 0 }), 0.1, 1e-15);
  close(effectiveEmaDecay(0.999, { num_updates: 1e6 }), 0.999, 1e-15);
  const inPlace = { a: new Float32Array([1, 2]), b: new Float64Array([0]) };
  emaUpdateInPlace(inPlace, w1, 0.9);
  assert.deepEqual(Array.from(inPlace.a), Array.from(e1.a));
  assert.throws(() => emaUpdate(e0, { a: w1.a }, 0.9), /missing in EMA: \(none\); not in the model: b/);
  assert.throws(
    () => emaUpdate(e0, { a: new Float32Array(3), b: w1.b }, 0.9),
    /parameter "a" has 3 values but the EMA holds 2/,
  );
  assert.throws(
    () => emaUpdate(e0, { a: new Float32Array([NaN, 0]), b: w1.b }, 0.9),
    /parameter "a" has a non-finite value NaN at \[0\]/,
  );
  assert.throws(() => emaUpdate(e0, w1, 1.5), /ema decay must be ≤ 1/);
});

test('masked helpers: empty masks give mean 0; unbiased var needs ≥ 2 tokens; whiten keeps masked elements', () => {
  const x = t64([
    [1, 2, 3],
    [4, 5, 6],
  ]);
  const empty = t64([
    [0, 0, 0],
    [0, 0, 0],
  ]);
  assert.equal(maskedSum(x, empty), 0);
  assert.equal(maskedMean(x, empty), 0);
  assert.deepEqual(
    Array.from(
      maskedMeanRows(
        x,
        t64([
          [1, 1, 0],
          [0, 0, 0],
        ]),
      ),
    ),
    [1.5 / (1 + 0.5e-8), 0],
  );
  assert.throws(() => maskedVar(x, empty), /at least one element in the mask has to be 1/);
  assert.throws(
    () =>
      maskedVar(
        x,
        t64([
          [0, 1, 0],
          [0, 0, 0],
        ]),
      ),
    /sum of the mask is one/,
  );
  close(
    maskedVar(
      x,
      t64([
        [0, 1, 0],
        [0, 0, 0],
      ]),
      false,
    ),
    0,
    1e-15,
    'biased variance of one token: (x − x/(1 + 1e-8))² ≈ 4e-16',
  );
  const m = t64([
    [1, 1, 0],
    [0, 0, 0],
  ]);
  const w = maskedWhiten(x, m).data;
  // valid {1, 2}: μ = 1.5, unbiased var = 0.5 (up to verl's 1e-8 epsilons)
  close(w[5], (6 - 1.5) / Math.sqrt(0.5), 1e-7, 'masked elements are whitened too');
  close(w[0], -0.5 / Math.sqrt(0.5), 1e-7);
  // NaN at a masked position is ignored by masked_sum (verl's torch.where), but rejected as input here
  assert.throws(
    () =>
      maskedSum(
        t64([
          [NaN, 1, 1],
          [1, 1, 1],
        ]),
        m,
      ),
    /values has a non-finite value NaN at \[0, 0\]/,
  );
  // float32 whitening follows torch's float32 evaluation and stays within float32 precision of float64
  const x32 = t32(rows(x));
  closeArr(maskedWhiten(x32, t32(rows(m))).data, maskedWhiten(x, m).data, 1e-6);
});
