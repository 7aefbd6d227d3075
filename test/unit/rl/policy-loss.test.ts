/**
 * Policy / value / entropy losses and loss aggregation: worked examples, the gradients w.r.t. log π
 * (checked against finite differences), aggregation weights, registries and input validation.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  aggLoss,
  aggLossWeights,
  computeEntropyLoss,
  computePolicyLoss,
  computePolicyLossClipCov,
  computePolicyLossVanilla,
  computeValueLoss,
  entropyFromLogits,
  lossAggModes,
  policyLosses,
  tensor3d,
  type PolicyLossConfig,
  type PolicyLossInput,
} from '../../../lib/rl/index.ts';
import { close, closeArr, numericGrad, t32, t64 } from './helpers.ts';

const mask = t64([
  [1, 1, 1, 0],
  [1, 0, 1, 1],
  [0, 0, 0, 0],
]);
const old = t64([
  [-1, -2, -0.5, -1],
  [-0.75, -1.2, -2, -0.3],
  [-1, -1, -1, -1],
]);
const lp = t64([
  [-0.85, -2.5, -0.5, -3],
  [-0.9, -1, -1.6, -0.2],
  [-1, -1, -1, -1],
]);
const adv = t64([
  [1.5, -0.7, 0.4, 2],
  [-1.2, 0.3, 0.8, -0.5],
  [1, 1, 1, 1],
]);
const base: PolicyLossInput = { old_log_prob: old, log_prob: lp, advantages: adv, response_mask: mask };

test('registries: policy_loss and loss_agg_mode names; unknown names list the valid ones', () => {
  assert.deepEqual(policyLosses.names(), [
    'cispo',
    'clip_cov',
    'geo_mean',
    'gpg',
    'gspo',
    'kl_cov',
    'nft',
    'ppo',
    'reinforce',
    'sapo',
    'vanilla',
  ]);
  assert.throws(() => policyLosses.get('dpo'), /unknown policy_loss "dpo" — valid: cispo, clip_cov, /);
  assert.deepEqual(lossAggModes.names(), [
    'seq-mean-token-mean',
    'seq-mean-token-sum',
    'seq-mean-token-sum-norm',
    'token-mean',
  ]);
  assert.throws(() => aggLoss(adv, mask, 'sum'), /unknown loss_agg_mode "sum" — valid: seq-mean-token-mean, /);
});

test('PPO by hand: asymmetric clip, dual clip and the three metrics', () => {
  // one row, four tokens: r = e^ℓ
  const o = t64([[0, 0, 0, 0]]);
  const l = t64([[Math.log(1.5), Math.log(0.5), Math.log(5), 0]]);
  const a = t64([[1, -1, -1, 2]]);
  const m = t64([[1, 1, 1, 1]]);
  const out = computePolicyLossVanilla(
    { old_log_prob: o, log_prob: l, advantages: a, response_mask: m },
    { clip_ratio_low: 0.2, clip_ratio_high: 0.28, clip_ratio_c: 3 },
  );
  // t0: A>0, r=1.5 → max(−1.5, −1.28) = −1.28 (clipped). t1: A<0, r=0.5 → max(0.5, 0.8) = 0.8 (clipped).
  // t2: A<0, r=5 → max(5, 1.28) = 5, dual clip min(3, 5) = 3. t3: r=1 → −2.
  closeArr(out.pg_losses.data, [-1.28, 0.8, 3, -2], 1e-12);
  close(out.pg_loss, (-1.28 + 0.8 + 3 - 2) / 4, 1e-12);
  close(out.metrics.pg_clipfrac!, 2 / 4, 1e-8);
  close(out.metrics.pg_clipfrac_lower!, 1 / 4, 1e-8);
  close(out.metrics.ppo_kl!, -(Math.log(1.5) + Math.log(0.5) + Math.log(5)) / 4, 1e-8);
  assert.equal(
    computePolicyLoss(
      'ppo',
      { old_log_prob: o, log_prob: l, advantages: a, response_mask: m },
      { clip_ratio_high: 0.28 },
    ).pg_loss,
    out.pg_loss,
    '"ppo" is an alias of "vanilla"',
  );
});

test('PPO: log-ratio clamped at ±20 for the ratio and ppo_kl; clip_ratio_c must exceed 1', () => {
  const out = computePolicyLossVanilla(
    {
      old_log_prob: t64([[0, 0]]),
      log_prob: t64([[25, -25]]),
      advantages: t64([[1, 1]]),
      response_mask: t64([[1, 1]]),
    },
    { clip_ratio: 0.2 },
  );
  close(out.metrics.ppo_kl!, 0, 1e-12);
  close(out.pg_losses.data[1], -Math.exp(-20), 1e-12);
  assert.throws(() => computePolicyLossVanilla(base, { clip_ratio_c: 1 }), /clip_ratio_c .* must be > 1.0, got 1/);
});

const allModes = ['token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean', 'seq-mean-token-sum-norm'];

test('policy losses without stop-gradients: grad_log_prob equals the finite-difference gradient of pg_loss', () => {
  const cases: [string, PolicyLossConfig][] = [
    ['vanilla', { clip_ratio_low: 0.2, clip_ratio_high: 0.28, clip_ratio_c: 3 }],
    ['sapo', { tau_pos: 1, tau_neg: 1.05 }],
    ['gpg', {}],
    ['reinforce', {}],
    ['geo_mean', { clip_ratio: 0.2 }],
    ['clip_cov', { clip_cov_ratio: 1, clip_cov_lb: -10, clip_cov_ub: 10 }],
    ['kl_cov', { kl_cov_ratio: 0.3, ppo_kl_coef: 0.5 }],
  ];
  const w = t64([
    [0.9, 1.1, 1, 1],
    [1.2, 1, 0.8, 1],
    [1, 1, 1, 1],
  ]);
  for (const [name, cfg] of cases) {
    for (const mode of allModes) {
      for (const weights of [null, w]) {
        const c = { ...cfg, loss_agg_mode: mode, with_grad: true };
        const inp = { ...base, rollout_is_weights: weights };
        const out = computePolicyLoss(name, inp, c);
        const x = new Float64Array(lp.data);
        // selection-based losses keep their token selection fixed while differentiating
        const f = (v: Float64Array) =>
          computePolicyLoss(name, { ...inp, log_prob: { data: v, bs: 3, T: 4 } }, { ...c, with_grad: false }).pg_loss;
        closeArr(
          out.grad_log_prob!.data,
          numericGrad(f, x, 1e-6),
          2e-6,
          `${name} ${mode} ${weights ? 'weighted' : ''}`,
        );
      }
    }
  }
});

test('stop-gradient losses: gspo = token-level PPO at the detached sequence ratio; cispo = gpg on sg(clip(r))·A', () => {
  const w = t64([
    [0.9, 1.1, 1, 1],
    [1.2, 1, 0.8, 1],
    [1, 1, 1, 1],
  ]);
  // GSPO: log s_i,t = log π − sg(log π) + sg(s_i) — its gradient is PPO's with old' = log π − s_i (no dual clip)
  const s = [0, 1, 2].map((i) => {
    let num = 0,
      n = 0;
    for (let t = 0; t < 4; t++) {
      num += (lp.data[i * 4 + t] - old.data[i * 4 + t]) * mask.data[i * 4 + t];
      n += mask.data[i * 4 + t];
    }
    return num / Math.max(n, 1);
  });
  const oldPrime = t64([0, 1, 2].map((i) => [0, 1, 2, 3].map((t) => lp.data[i * 4 + t] - s[i])));
  for (const weights of [null, w]) {
    const g = computePolicyLoss(
      'gspo',
      { ...base, rollout_is_weights: weights },
      { clip_ratio_high: 0.28, with_grad: true },
    );
    const p = computePolicyLossVanilla(
      { ...base, old_log_prob: oldPrime, rollout_is_weights: weights },
      { clip_ratio_high: 0.28, clip_ratio_c: 1e9, loss_agg_mode: 'seq-mean-token-mean', with_grad: true },
    );
    close(g.pg_loss, p.pg_loss, 1e-12);
    closeArr(g.grad_log_prob!.data, p.grad_log_prob!.data, 1e-12, 'gspo');
    // CISPO: −sg(clip(r))·A·log π → the gradient of gpg with A' = clip(r)·A
    for (const mode of allModes) {
      const c = computePolicyLoss(
        'cispo',
        { ...base, rollout_is_weights: weights },
        { clip_ratio_high: 0.28, loss_agg_mode: mode, with_grad: true },
      );
      const clipped = t64(
        [0, 1, 2].map((i) =>
          [0, 1, 2, 3].map((t) => {
            const r = Math.exp(lp.data[i * 4 + t] - old.data[i * 4 + t]);
            return Math.min(Math.max(r, 0.8), 1.28) * adv.data[i * 4 + t];
          }),
        ),
      );
      const gp = computePolicyLoss(
        'gpg',
        { ...base, advantages: clipped, rollout_is_weights: weights },
        { loss_agg_mode: mode, with_grad: true },
      );
      close(c.pg_loss, gp.pg_loss, 1e-12);
      closeArr(c.grad_log_prob!.data, gp.grad_log_prob!.data, 1e-12, `cispo ${mode}`);
    }
  }
});

test('agg_loss: Σ w·L with aggLossWeights for every mode; verl conventions for empty rows, dp_size, scale factors', () => {
  const L = t64([
    [1, 2, 3, 100],
    [4, 100, 5, 6],
    [7, 8, 9, 10],
  ]);
  for (const mode of allModes) {
    for (const info of [{}, { dp_size: 2, batch_num_tokens: 10, global_batch_size: 4, loss_scale_factor: 16 }]) {
      const w = aggLossWeights(mask, mode, info).data;
      close(
        aggLoss(L, mask, mode, info),
        Array.from(w).reduce((s, v, k) => s + v * L.data[k], 0),
        1e-12,
        mode,
      );
    }
  }
  close(aggLoss(L, mask, 'token-mean'), (1 + 2 + 3 + 4 + 5 + 6) / 6, 1e-15);
  close(aggLoss(L, mask, 'seq-mean-token-sum'), (6 + 15) / 2, 1e-15, 'the empty row is excluded');
  close(aggLoss(L, mask, 'seq-mean-token-mean'), (6 / 3 + 15 / 3) / 2, 1e-8);
  close(aggLoss(L, mask, 'seq-mean-token-sum-norm'), 21 / 4, 1e-15, 'divided by T, not by the batch');
  close(aggLoss(L, mask, 'token-mean', { dp_size: 3, batch_num_tokens: 12 }), (21 / 12) * 3, 1e-15);
  assert.ok(
    Number.isNaN(
      aggLoss(
        L,
        t64([
          [0, 0, 0, 0],
          [0, 0, 0, 0],
          [0, 0, 0, 0],
        ]),
        'token-mean',
      ),
    ),
    'an all-zero mask gives NaN, as in verl',
  );
  const withNaN = t64([
    [1, 2, 3, NaN],
    [4, NaN, 5, 6],
    [NaN, 0, 0, 0],
  ]);
  close(aggLoss(withNaN, mask, 'token-mean'), 21 / 6, 1e-15, 'token-mean ignores NaN at masked positions');
  assert.ok(Number.isNaN(aggLoss(withNaN, mask, 'seq-mean-token-sum')), 'seq modes propagate NaN of non-empty rows');
  assert.throws(() => aggLoss(L, mask, 'token-mean', { dp_size: 0 }), /dp_size must be a positive number/);
});

test('value loss: ½·agg(max((v−R)², (clip(v, V±c)−R)²)) and the clip fraction; grad w.r.t. vpreds', () => {
  const inp = {
    vpreds: t64([[1, 0.2, -1]]),
    returns: t64([[0, 0, 0]]),
    values: t64([[0.5, 0, 0]]),
    response_mask: t64([[1, 1, 1]]),
  };
  const out = computeValueLoss(inp, { cliprange_value: 0.2, with_grad: true });
  // t0: v=1 clipped to 0.7 → max(1, 0.49) = 1; t1: 0.2 in range → 0.04; t2: −1 → clip −0.2 → max(1, 0.04) = 1
  close(out.vf_loss, (0.5 * (1 + 0.04 + 1)) / 3, 1e-12);
  close(out.vf_clipfrac, 0, 1e-12);
  const x = new Float64Array(inp.vpreds.data);
  const f = (v: Float64Array) =>
    computeValueLoss({ ...inp, vpreds: { data: v, bs: 1, T: 3 } }, { cliprange_value: 0.2 }).vf_loss;
  closeArr(out.grad_vpreds!.data, numericGrad(f, x), 1e-6);
  // v̂ = clip(v, 0.4, 0.6): t0 0.9 → 0.6 (further from R = 1: counted), t1 0.55 in range, t2 0.95 → 0.6 (counted)
  const far = computeValueLoss(
    { ...inp, vpreds: t64([[0.9, 0.55, 0.95]]), returns: t64([[1, 1, 1]]), values: t64([[0.5, 0.5, 0.5]]) },
    { cliprange_value: 0.1 },
  );
  close(far.vf_clipfrac, 2 / 3, 1e-8, 'a clipped prediction further from the return counts');
});

test('entropy: uniform logits give log V; a one-hot-like row gives exactly 0; entropy loss aggregates it', () => {
  const z = tensor3d(new Float64Array([0, 0, 0, 0, 80, -1, -2, 0.5]), 1, 2, 4);
  const H = entropyFromLogits(z).data;
  close(H[0], Math.log(4), 1e-15);
  assert.equal(H[1], 0);
  close(computeEntropyLoss(z, t64([[1, 0]]), 'token-mean'), Math.log(4), 1e-15);
});

test('clip_cov: candidates beyond ratio·ΣM are drawn with the seeded RNG (deterministic for a given rng)', () => {
  const c = { clip_cov_ratio: 0.2, clip_cov_lb: -100, clip_cov_ub: 100 };
  const a = computePolicyLossClipCov(base, c),
    b = computePolicyLossClipCov(base, c);
  assert.equal(a.pg_loss, b.pg_loss);
  close(a.metrics.pg_clipfrac!, 1 / 6, 1e-8, 'max(⌊0.2·6⌋, 1) = 1 of the 6 valid tokens zeroed');
});

test('validation: non-finite inputs and shape mismatches are rejected with names and positions', () => {
  const badLp = t64([
    [-0.85, -2.5, -0.5, -3],
    [-0.9, -1, Infinity, -0.2],
    [-1, -1, -1, -1],
  ]);
  assert.throws(
    () => computePolicyLossVanilla({ ...base, log_prob: badLp }),
    /vanilla: log_prob has a non-finite value Infinity at \[1, 2\]/,
  );
  assert.throws(
    () => computePolicyLoss('gspo', { ...base, advantages: t64([[1]]) }),
    /gspo: advantages has shape \(1, 1\), expected \(3, 4\)/,
  );
  assert.throws(() => computePolicyLoss('sapo', base, { tau_pos: 0 }), /tau_pos must be > 0/);
  assert.throws(() => computePolicyLoss('nft', base), /needs rewards \(±1 per response\) and index/);
});

test('float32 inputs are accepted and agree with float64 to float32 precision', () => {
  const f32: PolicyLossInput = {
    old_log_prob: t32([[-1, -2]]),
    log_prob: t32([[-0.8, -2.5]]),
    advantages: t32([[1.5, -0.7]]),
    response_mask: t32([[1, 1]]),
  };
  const f64: PolicyLossInput = {
    old_log_prob: t64([[-1, -2]]),
    log_prob: t64([[Math.fround(-0.8), -2.5]]),
    advantages: t64([[1.5, Math.fround(-0.7)]]),
    response_mask: t64([[1, 1]]),
  };
  for (const name of policyLosses.names().filter((n) => n !== 'nft'))
    close(computePolicyLoss(name, f32).pg_loss, computePolicyLoss(name, f64).pg_loss, 1e-12, name);
});
