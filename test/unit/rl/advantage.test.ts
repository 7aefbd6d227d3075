/**
 * Hand-derived checks of the advantage estimators beyond the golden file: registry behaviour,
 * worked examples, edge cases (empty masks, identical rewards, single-sample groups) and input
 * validation.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  advEstimators,
  computeAdvantage,
  computeGaeAdvantageReturn,
  computeGrpoOutcomeAdvantage,
  computeGrpoPasskOutcomeAdvantage,
  computeGrpoVectorizedOutcomeAdvantage,
  computeOpoOutcomeAdvantage,
  computeOptimalTokenBaselineAdvantage,
  computeRemaxOutcomeAdvantage,
  computeReinforcePlusPlusOutcomeAdvantage,
  computeRlooOutcomeAdvantage,
  computeRlooVectorizedOutcomeAdvantage,
  computeGpgOutcomeAdvantage,
  computeMultiTurnOptimalTokenBaselineAdvantage,
  ConfigError,
} from '../../../lib/rl/index.ts';
import { ConfigError as BaseConfigError } from '../../../lib/errors.ts';
import { close, closeArr, rows, t32, t64 } from './helpers.ts';
import { groupAdvantages } from '../../../lib/image/rl.ts';

/** Outcome rewards: each row's score on its last position, full masks. */
function outcome(scores: number[], T = 3) {
  return {
    token_level_rewards: t64(scores.map((s) => [...Array(T - 1).fill(0), s])),
    response_mask: t64(scores.map(() => Array(T).fill(1))),
  };
}

test('registry: all verl estimators are registered; an unknown name lists the valid ones', () => {
  assert.deepEqual(advEstimators.names(), [
    'gae',
    'gpg',
    'grpo',
    'grpo_passk',
    'grpo_vectorized',
    'opo',
    'optimal_token_baseline',
    'reinforce_plus_plus',
    'reinforce_plus_plus_baseline',
    'remax',
    'rloo',
    'rloo_vectorized',
    'tir_optimal_token_baseline',
  ]);
  assert.throws(
    () => advEstimators.get('grp'),
    (e: Error) =>
      e instanceof BaseConfigError && /unknown adv_estimator "grp" — valid: gae, gpg, grpo, /.test(e.message),
  );
  assert.equal(ConfigError, BaseConfigError, 'lib/rl re-exports the project ConfigError');
});

test('grpo: (s − mean)/(std + ε) with the unbiased std, per group, groups interleaved with arbitrary labels', () => {
  const inp = { ...outcome([1, 5, 0, 5, 1, 0]), index: ['q', 7, 'q', 7, 'q', 'q'] as (string | number)[] };
  const { advantages, returns } = computeGrpoOutcomeAdvantage(inp);
  assert.equal(returns, advantages, 'returns is the same tensor as advantages (verl)');
  // group q = rows 0,2,4,5 → scores 1,0,1,0: mean 0.5, unbiased std = sqrt(1/3)
  const a = 0.5 / (Math.sqrt(1 / 3) + 1e-6);
  // group 7 = rows 1,3 → identical scores 5,5: 0/(0+ε) = 0
  const want = [a, 0, -a, 0, a, -a];
  rows(advantages).forEach((r, i) => closeArr(r, [want[i], want[i], want[i]], 1e-12, `row ${i}`));
  // Dr.GRPO: no std division
  const dr = computeGrpoOutcomeAdvantage(inp, { norm_adv_by_std_in_grpo: false }).advantages;
  assert.deepEqual(
    rows(dr).map((r) => r[0]),
    [0.5, 0, -0.5, 0, 0.5, -0.5],
  );
});

test('grpo with group_std = population divides by the std over n (Flow-GRPO), as lib/image/rl.ts groupAdvantages', () => {
  const scores = [1, 2, 3, 4, 0.5, 0.5, 2, 1];
  const inp = { ...outcome(scores), index: ['a', 'a', 'a', 'a', 'b', 'b', 'b', 'b'] };
  const pop = computeGrpoOutcomeAdvantage(inp, { group_std: 'population', epsilon: 1e-4 }).advantages;
  // group a: mean 2.5, population std √1.25 (unbiased: √(5/3))
  close(rows(pop)[0][0], -1.5 / (Math.sqrt(1.25) + 1e-4), 1e-12);
  const ref = groupAdvantages(scores, 4, 1e-4);
  rows(pop).forEach((r, i) => close(r[0], ref[i], 1e-12, `row ${i}`));
  // the default (verl) is unchanged: n − 1
  close(rows(computeGrpoOutcomeAdvantage(inp).advantages)[0][0], -1.5 / (Math.sqrt(5 / 3) + 1e-6), 1e-12);
});

test('grpo: a singleton group has mean 0 and std 1, divided by float32(1 + ε) like verl (also in float64)', () => {
  const { advantages } = computeGrpoOutcomeAdvantage(
    { ...outcome([2, 1, 3]), index: ['a', 'b', 'b'] },
    { epsilon: 1e-6 },
  );
  assert.equal(advantages.data[0], 2 / 1.0000009536743164);
  assert.equal(advantages.data[0], 2 / Math.fround(1 + 1e-6));
});

test('grpo: all-equal rewards give exactly zero advantages; masked positions are zero', () => {
  const allZero = (a: ArrayLike<number>) => Array.from(a).every((v) => v === 0);
  const inp = {
    token_level_rewards: t64([
      [0, 0.25],
      [0, 0.25],
      [0.25, 0],
    ]),
    response_mask: t64([
      [1, 1],
      [1, 1],
      [1, 0],
    ]),
    index: ['g', 'g', 'g'],
  };
  for (const name of ['grpo', 'grpo_vectorized', 'rloo', 'rloo_vectorized', 'opo', 'gpg', 'grpo_passk']) {
    assert.ok(allZero(computeAdvantage(name, inp).advantages.data), name);
  }
  // float32 inputs: the float32 group mean of identical values 0.3 is exact, so still exact zeros
  const f32in = {
    ...inp,
    token_level_rewards: t32([
      [0, 0.3],
      [0, 0.3],
      [0.3, 0],
    ]),
  };
  for (const name of ['grpo', 'grpo_vectorized', 'rloo', 'rloo_vectorized', 'opo', 'gpg']) {
    const a = computeAdvantage(name, f32in).advantages.data;
    assert.ok(a instanceof Float32Array && allZero(a), name);
  }
});

test("grpo_vectorized keeps verl's float32 statistics also for float64 scores (a leak the loop variant does not have)", () => {
  // 0.3 is not a float32: the float32 group mean differs from the float64 score by ~1.2e-8,
  // which the floored σ = sqrt(1e-6) turns into ≈ −1.2e-5 (verl computes the same)
  const inp = { token_level_rewards: t64([[0.3], [0.3]]), response_mask: t64([[1], [1]]), index: ['g', 'g'] };
  const want = (0.3 - Math.fround(0.3)) / Math.fround(Math.fround(Math.sqrt(Math.fround(1e-6))) + Math.fround(1e-6));
  assert.equal(computeGrpoVectorizedOutcomeAdvantage(inp).advantages.data[0], want);
  assert.equal(computeGrpoOutcomeAdvantage(inp).advantages.data[0], 0);
});

test('grpo vs grpo_vectorized: tiny group variance (var < ε) is floored inside the sqrt by the vectorized variant', () => {
  const inp = {
    token_level_rewards: t32([[1], [1.0001], [0.9999]]),
    response_mask: t32([[1], [1], [1]]),
    index: ['g', 'g', 'g'],
  };
  const loop = computeGrpoOutcomeAdvantage(inp).advantages.data[1];
  const vec = computeGrpoVectorizedOutcomeAdvantage(inp).advantages.data[1];
  // std ≈ 1e-4: loop ≈ 1e-4/(1e-4 + 1e-6) ≈ 0.99; vectorized: σ = sqrt(max(var, 1e-6)) = 1e-3 → ≈ 0.0999
  close(loop, 0.990099, 1e-4);
  close(vec, 1e-4 / (1e-3 + 1e-6), 1e-3);
});

test('grpo_passk: only the top scorer gets r_max − r_2nd; ties at the max give 0; singletons are rejected', () => {
  const inp = { ...outcome([3, 1, 2, 5, 5]), index: ['a', 'a', 'a', 'b', 'b'] };
  const adv = computeGrpoPasskOutcomeAdvantage(inp, { norm_adv_by_std_in_grpo: false }).advantages;
  assert.deepEqual(
    rows(adv).map((r) => r[2]),
    [1, 0, 0, 0, 0],
  );
  const normed = computeGrpoPasskOutcomeAdvantage(inp).advantages;
  close(normed.data[2], 1 / (1 + 1e-6), 1e-12); // std of (3, 1, 2) = 1
  assert.throws(
    () => computeGrpoPasskOutcomeAdvantage({ ...outcome([1, 0, 1]), index: ['a', 'b', 'b'] }),
    /at least 2 samples per group; group "a" has 1/,
  );
});

test('rloo: s − mean(others); a singleton keeps its score in the loop variant and gets 0 in the vectorized one', () => {
  const inp = { ...outcome([1, 0, 0, 4]), index: ['g', 'g', 'g', 'solo'] };
  const loop = rows(computeRlooOutcomeAdvantage(inp).advantages).map((r) => r[0]);
  closeArr(loop, [1, -0.5, -0.5, 4], 1e-12);
  const vec = rows(computeRlooVectorizedOutcomeAdvantage(inp).advantages).map((r) => r[0]);
  closeArr(vec, [1, -0.5, -0.5, 0], 1e-12);
});

test('opo: length-weighted baseline Σ|y|·s/Σ|y|; gpg: α = bs/#nonzero scores', () => {
  const inp = {
    token_level_rewards: t64([
      [0, 0, 1],
      [0, 2, 0],
    ]),
    response_mask: t64([
      [1, 1, 1],
      [1, 0, 0],
    ]),
    index: ['g', 'g'],
  };
  const b = (3 * 1 + 1 * 2) / 4;
  closeArr(rows(computeOpoOutcomeAdvantage(inp).advantages).flat(), [1 - b, 1 - b, 1 - b, 2 - b, 0, 0], 1e-12);
  const gpg = computeGpgOutcomeAdvantage({ ...outcome([0, 2, 0, 4]), index: ['a', 'a', 'b', 'b'] }).advantages;
  // α = 4/2 = 2; group a mean 1, group b mean 2
  assert.deepEqual(
    rows(gpg).map((r) => r[0]),
    [-2, 2, -4, 4],
  );
});

test('gae: δ_t = r_t + γV_{t+1} − V_t, A_t = δ_t + γλA_{t+1}; masked positions carry the running values over', () => {
  const g = 0.9,
    l = 0.5;
  const inp = {
    token_level_rewards: t64([[0, 0, 1]]),
    values: t64([[0.5, 0.2, 0.4]]),
    response_mask: t64([[1, 0, 1]]),
  };
  const { returns } = computeGaeAdvantageReturn(inp, { gamma: g, lam: l });
  // t=2: δ = 1 − 0.4 = 0.6, A = 0.6. t=1 (masked): A carries 0.6, V_next stays 0.4.
  // t=0: δ = 0 + 0.9·0.4 − 0.5 = −0.14, A = −0.14 + 0.45·0.6 = 0.13
  closeArr(rows(returns)[0], [0.13 + 0.5, 0.6 + 0.2, 0.6 + 0.4], 1e-12);
  const adv = computeGaeAdvantageReturn(inp, { gamma: g, lam: l }).advantages.data;
  // whitened over the valid tokens {0.13, 0.6}: mean 0.365, unbiased var 0.11045
  const inv = 1 / Math.sqrt(0.11045 + 1e-8);
  closeArr(adv, [(0.13 - 0.365) * inv, (0.6 - 0.365) * inv, (0.6 - 0.365) * inv], 1e-7);
});

test('reinforce++: a masked token resets the running return; remax: returns = suffix sums, advantages − baseline·M', () => {
  const inp = {
    token_level_rewards: t64([
      [1, 2, 4],
      [1, 0, 1],
    ]),
    response_mask: t64([
      [1, 0, 1],
      [1, 1, 1],
    ]),
  };
  const { returns } = computeReinforcePlusPlusOutcomeAdvantage(inp, { gamma: 1 });
  // row 0: t2 G=4; then reset by M[2]? no — G·M_2 = 4; t1 G = 2 + 4 = 6, reset (M_1 = 0) → 0; t0 G = 1
  assert.deepEqual(rows(returns), [
    [1, 6, 4],
    [2, 1, 1],
  ]);
  const rm = computeRemaxOutcomeAdvantage({ ...inp, reward_baselines: [0.5, 1] });
  assert.deepEqual(rows(rm.returns), [
    [5, 4, 4],
    [2, 1, 1],
  ]);
  assert.deepEqual(rows(rm.advantages), [
    [4.5, 4, 3.5],
    [1, 0, 0],
  ]);
});

test('optimal token baseline: a group of equal returns has zero advantage; singletons keep G; tir compacts valid tokens', () => {
  const inp = {
    token_level_rewards: t64([
      [0, 1],
      [0, 1],
      [0, 3],
    ]),
    response_mask: t64([
      [1, 1],
      [1, 1],
      [1, 1],
    ]),
    index: ['g', 'g', 's'],
    old_log_probs: t64([
      [-1, -2],
      [-0.5, -0.1],
      [-1, -1],
    ]),
    sum_pi_squared: t64([
      [0.3, 0.2],
      [0.4, 0.9],
      [0.5, 0.5],
    ]),
  };
  const otb = computeOptimalTokenBaselineAdvantage(inp);
  closeArr(rows(otb.advantages).flat(), [0, 0, 0, 0, 3, 3], 1e-7);
  assert.deepEqual(rows(otb.returns), [
    [1, 1],
    [1, 1],
    [3, 3],
  ]);
  const tir = computeMultiTurnOptimalTokenBaselineAdvantage({
    ...inp,
    response_mask: t64([
      [1, 1],
      [0, 1],
      [0, 0],
    ]),
  });
  assert.deepEqual(rows(tir.advantages)[2], [0, 0], 'rows without valid tokens are skipped');
});

test('empty response masks: outcome advantages are zero on padded rows; GAE needs ≥ 2 valid tokens to whiten', () => {
  const inp = {
    token_level_rewards: t64([
      [0, 1],
      [0, 0],
    ]),
    response_mask: t64([
      [1, 1],
      [0, 0],
    ]),
    index: ['g', 'g'],
  };
  assert.ok(rows(computeGrpoOutcomeAdvantage(inp).advantages)[1].every((v) => v === 0));
  assert.throws(
    () =>
      computeGaeAdvantageReturn({
        ...inp,
        values: t64([
          [0, 0],
          [0, 0],
        ]),
        response_mask: t64([
          [0, 0],
          [0, 0],
        ]),
      }),
    /mask is empty/,
  );
});

test('validation: NaN/Inf inputs, wrong shapes and missing inputs are rejected with the input and position named', () => {
  const bad = outcome([1, 0]);
  bad.token_level_rewards.data[4] = NaN;
  assert.throws(
    () => computeGrpoOutcomeAdvantage({ ...bad, index: ['a', 'a'] }),
    /grpo: token_level_rewards has a non-finite value NaN at \[1, 1\]/,
  );
  const inf = outcome([1, 0]);
  inf.response_mask.data[0] = Infinity;
  assert.throws(
    () => computeRlooOutcomeAdvantage({ ...inf, index: ['a', 'a'] }),
    /response_mask has a non-finite value Infinity at \[0, 0\]/,
  );
  assert.throws(
    () => computeGrpoOutcomeAdvantage({ ...outcome([1, 0]), index: ['a'] }),
    /index has 1 labels, expected one per sequence \(2\)/,
  );
  assert.throws(
    () => computeGrpoOutcomeAdvantage({ ...outcome([1, 0]) }),
    /index \(one group label per sequence\) is required/,
  );
  assert.throws(() => computeGaeAdvantageReturn(outcome([1])), /gae: values is required/);
  assert.throws(() => computeRemaxOutcomeAdvantage(outcome([1])), /reward_baselines .* is required/);
  assert.throws(
    () => computeGrpoOutcomeAdvantage({ ...outcome([1, 0]), response_mask: t64([[1, 1]]), index: ['a', 'a'] }),
    /response_mask has shape \(1, 2\), expected \(2, 3\)/,
  );
  assert.throws(
    () => computeGaeAdvantageReturn({ ...outcome([1]), values: t64([[0, 0, 0]]) }, { gamma: NaN }),
    /gamma must be a finite number/,
  );
});

test('dtype: float32 inputs give float32 outputs, float64 inputs float64', () => {
  const i64 = { ...outcome([1, 0, 2]), index: ['a', 'a', 'b'] };
  const i32 = { ...i64, token_level_rewards: t32(rows(i64.token_level_rewards)) };
  for (const name of advEstimators.names()) {
    if (name === 'grpo_passk') continue;
    const extra = {
      values: t64([
        [0, 0, 0],
        [0, 0, 0],
        [0, 0, 0],
      ]),
      reward_baselines: [0, 0, 0],
      old_log_probs: t64([
        [-1, -1, -1],
        [-1, -1, -1],
        [-1, -1, -1],
      ]),
      sum_pi_squared: t64([
        [0.5, 0.5, 0.5],
        [0.5, 0.5, 0.5],
        [0.5, 0.5, 0.5],
      ]),
    };
    assert.ok(computeAdvantage(name, { ...i64, ...extra }).advantages.data instanceof Float64Array, name);
    assert.ok(computeAdvantage(name, { ...i32, ...extra }).advantages.data instanceof Float32Array, name);
  }
});
