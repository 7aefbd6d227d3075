/**
 * NFT (arXiv 2505.18116): r̂, the loss, its straight-through clamps, the per-token gradient w.r.t.
 * log π, the RFT / DAPO-like settings of neg_weight, and the paper's on-policy equivalence to GRPO.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  computeGrpoOutcomeAdvantage,
  computeNftLoss,
  computePolicyLoss,
  computePolicyLossVanilla,
  nftRHat,
} from '../../../lib/rl/index.ts';
import { close, closeArr, numericGrad, t64 } from './helpers.ts';

const index = ['q', 'q', 'q', 'q', 'p', 'p'];
const rewards = [1, -1, -1, -1, 1, 1];
const mask = t64([
  [1, 1, 0],
  [1, 1, 1],
  [1, 0, 0],
  [1, 1, 1],
  [1, 1, 0],
  [1, 1, 1],
]);
const old = t64([
  [-1, -2, -1],
  [-0.5, -1.5, -2],
  [-1, -1, -1],
  [-2, -0.3, -0.8],
  [-1, -1, -1],
  [-0.4, -0.6, -0.9],
]);
const lp = t64([
  [-0.9, -2.1, -1],
  [-0.7, -1.4, -2.3],
  [-1.2, -1, -1],
  [-1.9, -0.5, -0.6],
  [-0.8, -1.1, -1],
  [-0.4, -0.5, -1],
]);

test('r̂ = (group mean reward + 1)/2, clamped to [0.02, 0.98]', () => {
  closeArr(nftRHat(rewards, index), [0.25, 0.25, 0.25, 0.25, 0.98, 0.98], 1e-15);
  closeArr(nftRHat([-1, -1], ['a', 'a']), [0.02, 0.02], 1e-15);
  assert.throws(
    () => nftRHat([1, 0], ['a', 'a']),
    /rewards must be \+1 \(correct\) or −1 \(incorrect\); rewards\[1\] = 0/,
  );
});

test('loss by hand: −log R on positives, −log((1 − r̂R)/(1 − r̂)) on negatives, every token × (1 − r̂), summed', () => {
  const out = computeNftLoss(
    { old_log_prob: old, log_prob: lp, response_mask: mask, rewards, index },
    { nft: { clamp_negative: 1e-6 } },
  );
  let want = 0;
  const rHat = [0.25, 0.25, 0.25, 0.25, 0.98, 0.98];
  for (let i = 0; i < 6; i++) {
    for (let t = 0; t < 3; t++) {
      const k = i * 3 + t;
      if (!mask.data[k]) continue;
      const R = Math.exp(lp.data[k] - old.data[k]);
      const l = rewards[i] > 0 ? -Math.log(R) : -Math.log((1 - rHat[i] * R) / (1 - rHat[i]));
      want += l * (1 - rHat[i]);
    }
  }
  close(out.pg_loss, want, 1e-12);
  close(out.metrics.r_hat_mean!, (4 * 0.25 + 2 * 0.98) / 6, 1e-15);
  close(out.metrics.positive_fraction!, 0.5, 1e-15);
});

test('grad_log_prob = ∂loss/∂log π (finite differences) where no clamp is active, for sum and agg modes', () => {
  for (const mode of ['sum', 'token-mean', 'seq-mean-token-mean']) {
    const cfg = {
      nft: { clamp_negative: 1e-6, loss_agg_mode: mode, loss_scale_factor: mode === 'sum' ? 1000 : undefined },
    };
    const out = computeNftLoss({ old_log_prob: old, log_prob: lp, response_mask: mask, rewards, index }, cfg);
    const x = new Float64Array(lp.data);
    const f = (v: Float64Array) =>
      computeNftLoss(
        { old_log_prob: old, log_prob: { data: v, bs: 6, T: 3 }, response_mask: mask, rewards, index },
        cfg,
      ).pg_loss;
    closeArr(out.grad_log_prob.data, numericGrad(f, x), 1e-6, mode);
  }
});

test('straight-through clamps: forward uses max(proxy, ε), the gradient stays −∂proxy/∂log π ÷ max(proxy, ε)', () => {
  // one negative token with R = e^0.5 > 1/r̂·… so that proxy = (1 − r̂R)/(1 − r̂) < ε = 1 (NVlabs/NFT default)
  const inp = {
    old_log_prob: t64([[0], [0]]),
    log_prob: t64([[0.5], [0]]),
    response_mask: t64([[1], [1]]),
    rewards: [-1, 1],
    index: ['g', 'g'],
  };
  const out = computeNftLoss(inp);
  const rHat = 0.5,
    R = Math.exp(0.5),
    proxy = (1 - rHat * R) / (1 - rHat);
  assert.ok(proxy < 1);
  close(out.pg_losses.data[0], 0, 1e-15, 'forward −log max(proxy, 1) = 0');
  close(
    out.grad_log_prob.data[0],
    ((rHat * R) / ((1 - rHat) * 1)) * (1 - rHat),
    1e-12,
    'gradient passes straight through',
  );
  close(out.metrics.neg_clamp_frac!, 1, 1e-7);
  // log-ratio clamp at 10: R stops at e^10 and the gradient is 0 beyond it
  const big = computeNftLoss({ ...inp, log_prob: t64([[0], [12]]) });
  close(big.pg_losses.data[1], -10 * 0.5, 1e-12);
  assert.equal(big.grad_log_prob.data[1], 0);
});

test('on-policy (R = 1) NFT gradient equals the policy gradient with Dr.GRPO advantages of 0/1 rewards (paper §4)', () => {
  const out = computeNftLoss(
    { old_log_prob: old, log_prob: old, response_mask: mask, rewards, index },
    { nft: { loss_agg_mode: 'token-mean' } },
  );
  const binary = rewards.map((r) => (r > 0 ? 1 : 0));
  const adv = computeGrpoOutcomeAdvantage(
    { token_level_rewards: t64(binary.map((b) => [0, 0, b])), response_mask: mask, index },
    { norm_adv_by_std_in_grpo: false },
  ).advantages;
  const pg = computePolicyLoss(
    'gpg',
    { old_log_prob: old, log_prob: old, advantages: adv, response_mask: mask },
    { loss_agg_mode: 'token-mean', with_grad: true },
  );
  // group p is all-correct: r̂ is clamped to 0.98 there while Dr.GRPO gives 0, so compare group q only
  closeArr(out.grad_log_prob.data.subarray(0, 12), pg.grad_log_prob!.data.subarray(0, 12), 1e-12);
});

test('neg_weight 0 = RFT (negatives contribute nothing); neg_weight < 0 = DAPO-like PPO on group advantages', () => {
  const inp = { old_log_prob: old, log_prob: lp, response_mask: mask, rewards, index };
  const rft = computeNftLoss(inp, { nft: { neg_weight: 0 } });
  for (const i of [1, 2, 3])
    for (let t = 0; t < 3; t++) {
      assert.equal(rft.pg_losses.data[i * 3 + t], 0);
      assert.equal(rft.grad_log_prob.data[i * 3 + t], 0);
    }
  const nft = computeNftLoss(inp);
  closeArr(rft.pg_losses.data.subarray(0, 3), nft.pg_losses.data.subarray(0, 3), 0, 'positives unchanged');

  const dapo = computeNftLoss(inp, { clip_ratio_low: 0.2, clip_ratio_high: 0.28, nft: { neg_weight: -1 } });
  const adv = computeGrpoOutcomeAdvantage({
    token_level_rewards: t64(rewards.map((r) => [r])),
    response_mask: t64(rewards.map(() => [1])),
    index,
  }).advantages.data;
  const advT = t64([0, 1, 2, 3, 4, 5].map((i) => [0, 1, 2].map((t) => adv[i] * mask.data[i * 3 + t])));
  const ppo = computePolicyLossVanilla(
    { old_log_prob: old, log_prob: lp, advantages: advT, response_mask: mask },
    { clip_ratio_low: 0.2, clip_ratio_high: 0.28, with_grad: true },
  );
  close(dapo.pg_loss, ppo.pg_loss, 1e-12);
  closeArr(dapo.grad_log_prob.data, ppo.grad_log_prob!.data, 1e-12);
});

test('through the policy_loss registry; inputs are validated', () => {
  const out = computePolicyLoss('nft', {
    old_log_prob: old,
    log_prob: lp,
    advantages: t64(rewards.map(() => [0, 0, 0])),
    response_mask: mask,
    rewards,
    index,
  });
  close(
    out.pg_loss,
    computeNftLoss({ old_log_prob: old, log_prob: lp, response_mask: mask, rewards, index }).pg_loss,
    1e-15,
  );
  assert.ok(out.grad_log_prob);
  assert.throws(
    () => computeNftLoss({ old_log_prob: old, log_prob: lp, response_mask: mask, rewards: [1, 1], index }),
    /rewards has 2 values, expected one per sequence \(6\)/,
  );
  const bad = t64([
    [NaN, 0, 0],
    [0, 0, 0],
    [0, 0, 0],
    [0, 0, 0],
    [0, 0, 0],
    [0, 0, 0],
  ]);
  assert.throws(
    () => computeNftLoss({ old_log_prob: old, log_prob: bad, response_mask: mask, rewards, index }),
    /nft: log_prob has a non-finite value NaN at \[0, 0\]/,
  );
  assert.throws(
    () =>
      computeNftLoss(
        { old_log_prob: old, log_prob: lp, response_mask: mask, rewards, index },
        { nft: { clamp_negative: 0 } },
      ),
    /clamp_negative must be > 0/,
  );
});
