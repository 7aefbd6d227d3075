/**
 * KL estimators, full-distribution KL, KL in the reward with its controllers, and KL as a loss.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  AdaptiveKlController,
  applyKlPenalty,
  computeKlLoss,
  computeRewards,
  FixedKlController,
  klFull,
  klPenalty,
  klPenaltyGrad,
  klPenaltyModes,
  logSoftmax,
  makeKlController,
  tensor3d,
} from '../../../lib/rl/index.ts';
import { close, closeArr, numericGrad, rows, t32, t64 } from './helpers.ts';

const lp = t64([
  [-1, -2, -0.5],
  [-3, -0.1, -1],
]);
const ref = t64([
  [-1.5, -2, -0.2],
  [-1, -0.4, -30],
]);

test('estimators: k1 = x, abs = |x|, k2 = x²/2, k3 = e^(−x) + x − 1 with x = log π − log π_ref (clamped)', () => {
  const x = Array.from(lp.data, (v, k) => v - ref.data[k]);
  closeArr(klPenalty(lp, ref, 'kl').data, x, 1e-15);
  closeArr(klPenalty(lp, ref, 'k1').data, x, 1e-15);
  closeArr(klPenalty(lp, ref, 'abs').data, x.map(Math.abs), 1e-15);
  closeArr(
    klPenalty(lp, ref, 'mse').data,
    x.map((v) => (v * v) / 2),
    1e-15,
  );
  const k3 = x.map((v) => Math.min(Math.exp(-v) - -v - 1, 10));
  closeArr(klPenalty(lp, ref, 'low_var_kl').data, k3, 1e-12);
  closeArr(klPenalty(lp, ref, 'k3').data, k3, 1e-12);
  assert.equal(klPenalty(lp, ref, 'k3').data[5], 10, 'ref − lp = −29 → clamp to −20 → e^−20 + 19 ≈ 19 → capped at 10');
  assert.equal(klPenalty(lp, ref, 'k3').data[1], 0, 'identical log-probs give exactly 0');
});

test('gradients d(Σ kl)/d log π match finite differences where no clamp is active; 0 where a clamp is', () => {
  for (const mode of ['kl', 'abs', 'mse', 'low_var_kl']) {
    const x = new Float64Array([-1, -2.2, -0.5, -3, -0.1, -1.3]);
    const r = new Float64Array([-1.5, -2, -0.2, -1, -0.4, -0.7]);
    const f = (v: Float64Array) =>
      Array.from(klPenalty({ data: v, bs: 2, T: 3 }, { data: r, bs: 2, T: 3 }, mode).data).reduce((a, b) => a + b, 0);
    closeArr(
      klPenaltyGrad({ data: x, bs: 2, T: 3 }, { data: r, bs: 2, T: 3 }, mode).data,
      numericGrad(f, x),
      1e-6,
      mode,
    );
  }
  const g = klPenaltyGrad(lp, ref, 'k3').data;
  assert.equal(g[5], 0, 'the ±20 clamp stops the gradient');
  assert.equal(klPenaltyGrad(t64([[0]]), t64([[0]]), 'abs').data[0], 0, 'sign(0) = 0');
});

test('"+" modes and "full" are rejected with a clear message; unknown modes list the valid ones', () => {
  for (const m of ['k1+', 'k3+', 'low_var_kl+', 'abs+'])
    assert.throws(() => klPenalty(lp, ref, m), /straight-through "\+" variants .* not available/);
  assert.throws(() => klPenalty(lp, ref, 'full'), /needs the full vocabulary distributions.*klFull/);
  assert.throws(
    () => klPenalty(lp, ref, 'k4'),
    /unknown kl_penalty "k4" — valid: abs, full, k1, k2, k3, kl, low_var_kl, mse/,
  );
  assert.ok(klPenaltyModes.has('full'));
});

test('klFull: Σ_v π_v (log π_v − log π_ref,v) from full distributions; 0 for identical ones', () => {
  const logits = tensor3d(new Float64Array([2, 0, -1, 0.5, 0.5, 0.5]), 1, 2, 3);
  const refLogits = tensor3d(new Float64Array([1, 1, 0, 0.5, 0.5, 0.5]), 1, 2, 3);
  const p = logSoftmax(logits),
    q = logSoftmax(refLogits);
  const kl = klFull(p, q).data;
  const P = [Math.exp(2), 1, Math.exp(-1)].map((v) => v / (Math.exp(2) + 1 + Math.exp(-1)));
  const Q = [Math.E, Math.E, 1].map((v) => v / (2 * Math.E + 1));
  close(
    kl[0],
    P.reduce((s, pv, v) => s + pv * Math.log(pv / Q[v]), 0),
    1e-12,
  );
  close(kl[1], 0, 1e-15);
  assert.throws(() => klFull(p, tensor3d(new Float64Array(4), 1, 2, 2)), /ref distribution has shape/);
});

test('compute_rewards: score − (log π_old − log π_ref)·kl_ratio', () => {
  closeArr(
    computeRewards(t64([[1, 0, 0]]), t64([[-1, -2, -3]]), t64([[-1.5, -2, -2]]), 0.1).data,
    [1 - 0.05, 0, 0.1],
    1e-15,
  );
  assert.ok(computeRewards(t32([[1]]), t32([[-1]]), t32([[-1]]), 0.1).data instanceof Float32Array);
});

test('controllers: fixed is a no-op; adaptive β ← β(1 + clip(KL/target − 1, ±0.2)·n/horizon)', () => {
  const fixed = new FixedKlController(0.05);
  assert.equal(fixed.update(100, 64).value, 0.05);
  let ad = makeKlController({ type: 'adaptive', kl_coef: 0.1, target_kl: 0.02, horizon: 1000 });
  ad = ad.update(0.03, 100); // error 0.5 → clipped to 0.2
  close(ad.value, 0.1 * (1 + (0.2 * 100) / 1000), 1e-15);
  ad = ad.update(0.019, 10); // error −0.05
  close(ad.value, 0.1 * 1.02 * (1 - (0.05 * 10) / 1000), 1e-15);
  assert.ok(ad instanceof AdaptiveKlController && ad.target === 0.02);
  assert.throws(() => makeKlController({ type: 'adaptive', kl_coef: 0.1 }), /needs target_kl and horizon/);
  assert.throws(
    () => makeKlController({ type: 'pid' as 'fixed', kl_coef: 0.1 }),
    /unknown kl_ctrl.type "pid" — valid: adaptive, fixed/,
  );
  assert.throws(() => new AdaptiveKlController(0.1, 0.02, 0), /horizon must be > 0/);
});

test('KL in the reward: r = score − β·kl·M; current_kl = mean over rows of the masked row mean; controller updated with bs', () => {
  const mask = t64([
    [1, 1, 0],
    [1, 0, 0],
  ]);
  const out = applyKlPenalty(
    {
      token_level_scores: t64([
        [0, 0, 1],
        [0, 2, 0],
      ]),
      old_log_probs: lp,
      ref_log_prob: ref,
      response_mask: mask,
    },
    { kl_penalty: 'kl', controller: makeKlController({ type: 'adaptive', kl_coef: 0.2, target_kl: 1, horizon: 10 }) },
  );
  const kl = Array.from(lp.data, (v, k) => (v - ref.data[k]) * mask.data[k]);
  closeArr(out.kld.data, kl, 1e-15);
  closeArr(out.token_level_rewards.data, [0 - 0.2 * kl[0], 0 - 0.2 * kl[1], 1, 0 - 0.2 * kl[3], 2, 0], 1e-15);
  const current = ((kl[0] + kl[1]) / 2 + kl[3] / 1) / 2;
  close(out.current_kl, current, 1e-7);
  assert.equal(out.beta, 0.2);
  assert.deepEqual(Object.keys(out.metrics), ['actor/reward_kl_penalty', 'actor/reward_kl_penalty_coeff']);
  close(out.next_controller.value, 0.2 * (1 + (Math.max(-0.2, Math.min(0.2, current - 1)) * 2) / 10), 1e-12);
});

test('KL as a loss: agg_loss(kl_penalty(log π, log π_ref)) with its coefficient and gradient', () => {
  const mask = t64([
    [1, 1, 0],
    [1, 1, 1],
  ]);
  const out = computeKlLoss(
    { log_prob: lp, ref_log_prob: ref, response_mask: mask },
    { kl_loss_type: 'low_var_kl', kl_loss_coef: 0.5, loss_agg_mode: 'seq-mean-token-mean' },
  );
  const x = new Float64Array(lp.data);
  const f = (v: Float64Array) =>
    0.5 *
    computeKlLoss(
      { log_prob: { data: v, bs: 2, T: 3 }, ref_log_prob: ref, response_mask: mask },
      { kl_loss_type: 'low_var_kl', loss_agg_mode: 'seq-mean-token-mean' },
    ).kl_loss;
  close(out.weighted_loss, 0.5 * out.kl_loss, 1e-15);
  const fd = numericGrad(f, x);
  fd[5] = 0; // clamped token (ref − lp = −29): no gradient
  closeArr(out.grad_log_prob.data, fd, 1e-6);
  assert.equal(out.metrics['actor/kl_coef'], 0.5);
  assert.deepEqual(rows(out.grad_log_prob)[0][2], 0, 'masked token has no gradient');
});

test('float32: low_var_kl of nearly equal log-probs cancels in float32 like the reference', () => {
  // x = 2^-20 ≈ 9.5e-7: e^x − x − 1 ≈ 4.5e-13 in double, but exactly 0 in float32 arithmetic
  const a = t32([[-1]]),
    b = t32([[-1 + 2 ** -20]]);
  assert.equal(klPenalty(a, b, 'low_var_kl').data[0], 0);
  assert.equal(klPenaltyGrad(a, b, 'low_var_kl').data[0], Math.fround(1 - Math.fround(Math.exp(2 ** -20))));
  assert.ok(klPenalty(t64([[-1]]), t64([[-1 + 2 ** -20]]), 'low_var_kl').data[0] > 0, 'float64 keeps the x²/2');
});
