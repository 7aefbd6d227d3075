/**
 * VPPO token reweighting (arXiv 2510.09285): visual dependency, top-p token filtering (union of
 * the perception and entropy criteria), trajectory advantage shaping with mean α = 1, metrics.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  aggLoss,
  combineTokenWeights,
  computePolicyLossVanilla,
  tokenGradientMask,
  tokenVisualDependency,
  topKCount,
  trajectoryAdvantageScaling,
  vppoReweight,
} from '../../../lib/rl/index.ts';
import { close, closeArr, rows, t32, t64 } from './helpers.ts';

test('dependency S = clamp(e^d − d − 1, 0, 10), d = clamp(aug − old, ±20)', () => {
  const old = t64([[-1, -1, -1, -1]]);
  const aug = t64([[-1, -1.5, 2, -40]]);
  const S = tokenVisualDependency(old, aug).data;
  assert.equal(S[0], 0, 'an unchanged token does not depend on the image');
  close(S[1], Math.exp(-0.5) + 0.5 - 1, 1e-15);
  assert.equal(S[2], 10, 'e^3 − 4 ≈ 16 is capped at 10');
  close(S[3], Math.exp(-20) + 20 - 1 > 10 ? 10 : 0, 1e-15, 'd clamped at −20 then capped');
  assert.ok(tokenVisualDependency(t32([[-1]]), t32([[-2]])).data instanceof Float32Array);
});

test('top-k count ⌈n·p⌉ is robust to float noise (0.7·10 = 7.000000000000001 → 7)', () => {
  assert.equal(topKCount(10, 0.7), 7);
  assert.equal(topKCount(10, 0.2), 2);
  assert.equal(topKCount(7, 0.2), 2);
  assert.equal(topKCount(1, 0.2), 1);
  assert.equal(topKCount(0, 0.2), 0);
  assert.equal(topKCount(5, 1), 5);
});

test('token filtering: per row top ⌈n_valid·p⌉ by dependency ∪ by entropy; padding is never kept', () => {
  const mask = t64([
    [1, 1, 1, 1, 1, 0],
    [1, 1, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0],
  ]);
  const dep = t64([
    [0.1, 0.9, 0.3, 0.8, 0.2, 99],
    [0.5, 0.4, 9, 9, 9, 9],
    [1, 2, 3, 4, 5, 6],
  ]);
  const ent = t64([
    [2, 0.1, 0.5, 0.4, 1.5, 99],
    [0.1, 0.2, 9, 9, 9, 9],
    [1, 2, 3, 4, 5, 6],
  ]);
  const both = tokenGradientMask(
    mask,
    { dependency: dep, entropy: ent },
    { top_p_perception_tokens: 0.4, top_p_entropy_tokens: 0.2 },
  );
  // row 0: n = 5 → 2 by dependency {1, 3}, 1 by entropy {0}; row 1: n = 2 → 1 each: dep {0}, ent {1}
  assert.deepEqual(rows(both.keep_mask), [
    [1, 1, 0, 1, 0, 0],
    [1, 1, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0],
  ]);
  close(both.metrics.perception_token_fraction, 3 / 7, 1e-15);
  close(both.metrics.entropy_token_fraction, 2 / 7, 1e-15);
  close(both.metrics.kept_token_fraction, 5 / 7, 1e-15);
  const perOnly = tokenGradientMask(
    mask,
    { dependency: dep },
    { top_p_perception_tokens: 0.4, top_p_entropy_tokens: null },
  );
  assert.deepEqual(rows(perOnly.keep_mask)[0], [0, 1, 0, 1, 0, 0]);
  const none = tokenGradientMask(mask, {}, { top_p_perception_tokens: 0, top_p_entropy_tokens: null });
  assert.deepEqual(rows(none.keep_mask), rows(mask), 'both criteria off: every valid token is kept');
  // ties: earlier position first
  const tie = tokenGradientMask(
    t64([[1, 1, 1, 1]]),
    { dependency: t64([[1, 1, 1, 1]]) },
    { top_p_entropy_tokens: null, top_p_perception_tokens: 0.5 },
  );
  assert.deepEqual(rows(tie.keep_mask), [[1, 1, 0, 0]]);
  assert.throws(
    () => tokenGradientMask(mask, { dependency: dep }, {}),
    /top_p_entropy_tokens is on but no token entropy was given/,
  );
  assert.throws(
    () => tokenGradientMask(mask, { dependency: dep, entropy: ent }, { top_p_perception_tokens: 1.5 }),
    /top_p_perception_tokens must be ≤ 1/,
  );
});

test('filtered tokens contribute 0 to the loss but still count in the token-mean denominator', () => {
  const mask = t64([[1, 1, 1, 1]]);
  const keep = t64([[1, 0, 1, 0]]);
  const L = t64([[1, 2, 3, 4]]);
  const weights = combineTokenWeights(keep, t64([[0.5, 1, 2, 1]]))!;
  closeArr(weights.data, [0.5, 0, 2, 0], 0);
  const pg = computePolicyLossVanilla({
    old_log_prob: t64([[0, 0, 0, 0]]),
    log_prob: t64([[0, 0, 0, 0]]),
    advantages: t64([[-1, -2, -3, -4]]),
    response_mask: mask,
    rollout_is_weights: keep,
  });
  close(pg.pg_loss, (1 + 3) / 4, 1e-15, 'divided by all 4 response tokens');
  close(aggLoss(L, mask, 'token-mean'), 10 / 4, 1e-15);
});

test('trajectory shaping: α = β_min + n(β_max − β_min) with β_max = β_min + (1 − β_min)/(mean n + 1e-8); mean α = 1', () => {
  const mask = t64([
    [1, 1, 0],
    [1, 1, 1],
    [1, 0, 0],
    [0, 0, 0],
  ]);
  const dep = t64([
    [0.2, 0.4, 7],
    [0, 0, 0.3],
    [1, 7, 7],
    [5, 5, 5],
  ]);
  const adv = t64([
    [1, 1, 0],
    [-2, -2, -2],
    [0.5, 0, 0],
    [3, 3, 3],
  ]);
  const out = trajectoryAdvantageScaling(adv, dep, mask, { advantage_scaling_min: 0.8 });
  const sBar = [0.3, 0.1, 1];
  closeArr(out.mean_dependency.subarray(0, 3), sBar, 1e-15);
  const n = sBar.map((s) => (s - 0.1) / 0.9);
  const meanN = (n[0] + n[1] + n[2]) / 3;
  const bMax = 0.8 + 0.2 / (meanN + 1e-8);
  const alpha = n.map((v) => 0.8 + v * (bMax - 0.8));
  closeArr(out.alpha, [...alpha, 1], 1e-12, 'a row without valid tokens keeps α = 1');
  close((out.alpha[0] + out.alpha[1] + out.alpha[2]) / 3, 1, 1e-7);
  assert.equal(out.alpha[1], 0.8, 'the least image-dependent trajectory gets β_min');
  closeArr(rows(out.advantages)[1], [-2 * 0.8, -2 * 0.8, -2 * 0.8], 1e-15);
  close(out.metrics.scaling_factor_mean, 1, 1e-7);
  close(out.metrics.sensitivity_score_mean, (0.6 + 0.3 + 1) / 6, 1e-15);
  const flat = trajectoryAdvantageScaling(
    adv,
    t64([
      [1, 1, 1],
      [1, 1, 1],
      [1, 1, 1],
      [1, 1, 1],
    ]),
    mask,
  );
  assert.deepEqual(Array.from(flat.alpha), [1, 1, 1, 1], 'max − min ≤ 1e-6: no shaping');
  assert.throws(
    () => trajectoryAdvantageScaling(adv, dep, mask, { advantage_scaling_min: 1.5 }),
    /advantage_scaling_min must be ≤ 1/,
  );
});

test("vppoReweight: the whole step with the paper's metrics; all-equal dependency leaves advantages unchanged", () => {
  const mask = t64([
    [1, 1, 1, 1, 1],
    [1, 1, 1, 0, 0],
  ]);
  const old = t64([
    [-1, -2, -0.5, -1, -3],
    [-0.2, -1, -2, -1, -1],
  ]);
  const aug = t64([
    [-1.5, -2, -0.5, -4, -3],
    [-0.2, -1.1, -2, -1, -1],
  ]);
  const ent = t64([
    [0.5, 2, 0.1, 0.2, 0.3],
    [1, 0.1, 0.2, 0, 0],
  ]);
  const adv = t64([
    [1, 1, 1, 1, 1],
    [-1, -1, -1, 0, 0],
  ]);
  const out = vppoReweight({
    advantages: adv,
    response_mask: mask,
    old_log_prob: old,
    aug_log_prob: aug,
    entropy: ent,
  });
  assert.deepEqual(Object.keys(out.metrics).sort(), [
    'entropy_token_fraction',
    'kept_token_fraction',
    'perception_token_fraction',
    'scaling_factor_mean',
    'sensitivity_score_mean',
  ]);
  // row 0 (5 tokens → 1 each): dependency picks t3 (d = −3), entropy t1; row 1 (3 tokens): dependency t1, entropy t0
  assert.deepEqual(rows(out.keep_mask), [
    [0, 1, 0, 1, 0],
    [1, 1, 0, 0, 0],
  ]);
  close(out.metrics.scaling_factor_mean, 1, 1e-7);
  assert.ok(out.alpha[0] > 1 && out.alpha[1] < 1, 'the more image-dependent trajectory is amplified');
  const same = vppoReweight({
    advantages: adv,
    response_mask: mask,
    old_log_prob: old,
    aug_log_prob: old,
    entropy: ent,
  });
  assert.deepEqual(rows(same.advantages), rows(adv));
  const nan = t64([
    [-1, -2, NaN, -1, -3],
    [-0.2, -1, -2, -1, -1],
  ]);
  assert.throws(
    () => vppoReweight({ advantages: adv, response_mask: mask, old_log_prob: old, aug_log_prob: nan, entropy: ent }),
    /aug_log_prob has a non-finite value NaN at \[0, 2\]/,
  );
});
