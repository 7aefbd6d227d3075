/**
 * NFT — negative-aware fine-tuning (Chen et al. 2025, arXiv 2505.18116; reference implementation
 * NVlabs/NFT dp_actor.py, ratio_type "token").
 *
 * Rewards are ±1 per response. Per group r̂ = (mean reward + 1)/2 (the group accuracy), clamped to
 * [0.02, 0.98]. Per token R_t = π/π_old = exp(min(log π − log π_old, 10)). The loss is
 *
 *   L = Σ_pos Σ_t −log R_t  +  neg_weight · Σ_neg Σ_t −log max((1 − r̂R_t)/(1 − r̂), ε)
 *
 * with each token weighted by (1 − r̂) (normalize) and the clamps straight-through (forward value
 * clamped, gradient as if not: x + sg(clamp(x) − x)). neg_weight 1 = NFT, 0 = RFT (positives only),
 * < 0 = DAPO-like: the PPO clipped loss on `advantages`, as in NVlabs/NFT.
 *
 * `grad_log_prob` is ∂L/∂log π per token, for the training graph:
 *   positive: −R_t·[ℓ ≤ 10] / max(R_t, clamp_positive)
 *   negative: neg_weight · r̂R_t·[ℓ ≤ 10] / ((1 − r̂)·max(proxy_t, ε))
 * times (1 − r̂), the IS/keep weight and the aggregation weight.
 */
import { ConfigError } from '../errors.ts';
import { lossAggModes } from './agg.ts';
import { computeGrpoOutcomeAdvantage } from './advantage.ts';
import {
  computePolicyLossVanilla,
  type NftConfig,
  type PolicyLossConfig,
  type PolicyLossMetrics,
} from './policy-loss.ts';
import {
  checkScalar,
  groupRows,
  readMask,
  readTensor,
  type FloatArray,
  type GroupLabel,
  type Mask2D,
  type Tensor2D,
} from './tensor.ts';

export type { NftConfig } from './policy-loss.ts';

export interface NftInput<A extends FloatArray = FloatArray> {
  old_log_prob: Tensor2D<A>;
  log_prob: Tensor2D;
  response_mask: Mask2D;
  /** (bs,) +1 for a correct response, −1 for an incorrect one. */
  rewards: ArrayLike<number>;
  /** (bs,) group labels. */
  index: readonly GroupLabel[];
  /** (bs, T) only for neg_weight < 0 (DAPO-like); default: GRPO advantages of `rewards`. */
  advantages?: Tensor2D;
  /** (bs, T) multiplicative per-token weights (IS correction, VPPO keep mask). */
  rollout_is_weights?: Tensor2D | null;
}

export interface NftOutput {
  pg_loss: number;
  /** Per-token losses after the (1 − r̂) and IS weights (what was aggregated). */
  pg_losses: Tensor2D<Float64Array>;
  /** ∂pg_loss/∂log π per token. */
  grad_log_prob: Tensor2D<Float64Array>;
  /** (bs,) clamped group accuracy r̂ of each row. */
  r_hat: Float64Array;
  metrics: PolicyLossMetrics;
}

function checkRewards(rewards: ArrayLike<number> | undefined, bs: number): ArrayLike<number> {
  if (!rewards) throw new ConfigError('nft: rewards (one ±1 reward per response) are required');
  if (rewards.length !== bs)
    throw new ConfigError(`nft: rewards has ${rewards.length} values, expected one per sequence (${bs})`);
  for (let i = 0; i < bs; i++) {
    if (rewards[i] !== 1 && rewards[i] !== -1)
      throw new ConfigError(
        `nft: rewards must be +1 (correct) or −1 (incorrect); rewards[${i}] = ${rewards[i]} — map verifier outcomes to ±1 first`,
      );
  }
  return rewards;
}

/** r̂_i = clamp((mean_{group(i)} reward + 1)/2, r_hat_min, r_hat_max) for ±1 rewards. */
export function nftRHat(
  rewards: ArrayLike<number>,
  index: readonly GroupLabel[],
  cfg: Pick<NftConfig, 'r_hat_min' | 'r_hat_max'> = {},
): Float64Array {
  const bs = rewards.length;
  checkRewards(rewards, bs);
  const lo = checkScalar('nft.r_hat_min', cfg.r_hat_min ?? 0.02, { minExclusive: 0, maxExclusive: 1 });
  const hi = checkScalar('nft.r_hat_max', cfg.r_hat_max ?? 0.98, { minExclusive: 0, maxExclusive: 1 });
  if (lo > hi) throw new ConfigError(`nft: r_hat_min (${lo}) must be ≤ r_hat_max (${hi})`);
  const { order, start, nGroups } = groupRows(index, bs, 'nft: index');
  const out = new Float64Array(bs);
  for (let g = 0; g < nGroups; g++) {
    let s = 0;
    for (let j = start[g]; j < start[g + 1]; j++) s += rewards[order[j]];
    const acc = (s / (start[g + 1] - start[g]) + 1) / 2;
    const r = Math.min(Math.max(acc, lo), hi);
    for (let j = start[g]; j < start[g + 1]; j++) out[order[j]] = r;
  }
  return out;
}

/** The NFT loss and its per-token gradient w.r.t. log π (see the module comment). */
export function computeNftLoss(input: NftInput, cfg: PolicyLossConfig = {}): NftOutput {
  const nft = cfg.nft ?? {};
  if (!input || !input.log_prob) throw new ConfigError('nft: log_prob is required');
  const { bs, T } = input.log_prob;
  const old = readTensor('nft: old_log_prob', input.old_log_prob, bs, T);
  const lp = readTensor('nft: log_prob', input.log_prob, bs, T);
  const M = readMask('nft: response_mask', input.response_mask, bs, T);
  const rewards = checkRewards(input.rewards, bs);
  const rHat = nftRHat(rewards, input.index, nft);
  const negWeight = checkScalar('nft.neg_weight', nft.neg_weight ?? 1);
  const w = input.rollout_is_weights ? readTensor('nft: rollout_is_weights', input.rollout_is_weights, bs, T) : null;

  if (negWeight < 0) {
    // DAPO-like: PPO clipped surrogate (clip-higher via clip_ratio_low/high) on group advantages.
    let adv = input.advantages;
    if (!adv) {
      const a = computeGrpoOutcomeAdvantage({
        token_level_rewards: { data: Float64Array.from(rewards), bs, T: 1 },
        response_mask: { data: new Float64Array(bs).fill(1), bs, T: 1 },
        index: input.index,
      }).advantages.data;
      const data = new Float64Array(bs * T);
      for (let i = 0; i < bs; i++) for (let k = i * T; k < (i + 1) * T; k++) data[k] = a[i] * M[k];
      adv = { data, bs, T };
    }
    const out = computePolicyLossVanilla(
      {
        old_log_prob: input.old_log_prob,
        log_prob: input.log_prob,
        advantages: adv,
        response_mask: input.response_mask,
        rollout_is_weights: input.rollout_is_weights ?? null,
      },
      {
        ...cfg,
        loss_agg_mode:
          nft.loss_agg_mode && nft.loss_agg_mode !== 'sum' ? nft.loss_agg_mode : (cfg.loss_agg_mode ?? 'token-mean'),
        with_grad: true,
      },
    );
    return {
      pg_loss: out.pg_loss,
      pg_losses: out.pg_losses,
      grad_log_prob: out.grad_log_prob!,
      r_hat: rHat,
      metrics: { ...out.metrics, r_hat_mean: mean(rHat) },
    };
  }

  const eps = checkScalar('nft.clamp_negative', nft.clamp_negative ?? 1.0, { minExclusive: 0 });
  const cp = checkScalar('nft.clamp_positive', nft.clamp_positive ?? 0, { min: 0 });
  const maxLr = checkScalar('nft.max_log_ratio', nft.max_log_ratio ?? 10);
  const normalize = nft.normalize ?? true;
  const mode = nft.loss_agg_mode ?? 'sum';
  const scale = checkScalar('nft.loss_scale_factor', nft.loss_scale_factor ?? 1, { minExclusive: 0 });

  const L = new Float64Array(bs * T),
    d = new Float64Array(bs * T);
  let klSum = 0,
    mTot = 0,
    negTok = 0,
    negClamped = 0,
    nPos = 0;
  for (let i = 0; i < bs; i++) {
    const r = rHat[i];
    const pos = rewards[i] > 0;
    if (pos) nPos++;
    const rowW = normalize ? 1 - r : 1;
    for (let k = i * T, e = k + T; k < e; k++) {
      const l = lp[k] - old[k];
      const pass = l <= maxLr;
      const R = Math.exp(pass ? l : maxLr);
      let loss: number, g: number;
      if (pos) {
        const y = R > cp ? R : cp;
        loss = -Math.log(y);
        g = pass ? -R / y : 0;
      } else {
        const proxy = (1 - r * R) / (1 - r);
        const y = proxy > eps ? proxy : eps;
        loss = negWeight === 0 ? 0 : negWeight * -Math.log(y);
        g = negWeight === 0 || !pass ? 0 : (negWeight * r * R) / ((1 - r) * y);
        if (M[k] !== 0) {
          negTok += M[k];
          if (proxy < eps) negClamped += M[k];
        }
      }
      const tw = rowW * (w ? w[k] : 1);
      L[k] = loss * tw;
      d[k] = g * tw;
      if (M[k] !== 0) {
        mTot += M[k];
        klSum += -l * M[k];
      }
    }
  }

  let pgLoss: number, wts: Float64Array;
  if (mode === 'sum') {
    let s = 0;
    for (let k = 0; k < L.length; k++) if (M[k] !== 0) s += L[k] * M[k];
    pgLoss = s / scale;
    const ww = new Float64Array(bs * T);
    for (let k = 0; k < ww.length; k++) ww[k] = M[k] / scale;
    wts = ww;
  } else {
    const agg = lossAggModes.get(mode);
    const info = cfg.global_batch_info ?? {};
    pgLoss = agg.value(L, M, bs, T, info);
    wts = agg.weights(M, bs, T, info);
  }
  for (let k = 0; k < d.length; k++) d[k] = wts[k] === 0 ? 0 : d[k] * wts[k];
  return {
    pg_loss: pgLoss,
    pg_losses: { data: L, bs, T },
    grad_log_prob: { data: d, bs, T },
    r_hat: rHat,
    metrics: {
      ppo_kl: klSum / (mTot + 1e-8),
      r_hat_mean: mean(rHat),
      positive_fraction: bs > 0 ? nPos / bs : 0,
      neg_clamp_frac: negClamped / (negTok + 1e-8),
    },
  };
}

function mean(a: Float64Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i];
  return a.length > 0 ? s / a.length : 0;
}
