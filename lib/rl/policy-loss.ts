/**
 * Policy, value and entropy losses — reference implementations matched to verl core_algos
 * (compute_policy_loss_vanilla / _gspo / _sapo / _gpg / _cispo / _reinforce / _geo_mean /
 * _clip_cov / _kl_cov, compute_value_loss, compute_entropy_loss). The ONNX training graph must
 * agree with these numbers.
 *
 * Each policy loss returns the scalar `pg_loss`, the per-token loss matrix that was aggregated
 * (`pg_losses`, after IS weights), verl's metrics (keys without the `actor/` prefix) and, with
 * `with_grad: true`, `grad_log_prob` = ∂pg_loss/∂log π per token (autograd semantics of the
 * reference: torch.clamp passes the gradient at its bounds, max/min split ties, stop-gradients
 * where verl detaches).
 */
import { ConfigError } from '../errors.ts';
import { Rng } from '../util/rng.ts';
import { lossAggModes, type GlobalBatchInfo, type LossAggregator } from './agg.ts';
import { entropyFromLogits } from './masked.ts';
import {
  asF64,
  checkScalar,
  readMask,
  readTensor,
  type FloatArray,
  type GroupLabel,
  type Mask2D,
  type Tensor2D,
  type Tensor3D,
} from './tensor.ts';

export interface PolicyLossInput<A extends FloatArray = FloatArray> {
  /** (bs, T) log π_old (the rollout policy's log-probs for `reinforce`). */
  old_log_prob: Tensor2D<A>;
  /** (bs, T) log π_θ of the sampled tokens. */
  log_prob: Tensor2D;
  /** (bs, T) advantages. */
  advantages: Tensor2D;
  response_mask: Mask2D;
  /** (bs, T) multiplicative per-token weights (rollout IS correction, VPPO keep masks, …). */
  rollout_is_weights?: Tensor2D | null;
  /** NFT only: (bs,) rewards ±1. */
  rewards?: ArrayLike<number>;
  /** NFT only: (bs,) group labels. */
  index?: readonly GroupLabel[];
}

export interface PolicyLossConfig {
  loss_agg_mode?: string;
  /** PPO ε (default 0.2); clip_ratio_low / clip_ratio_high fall back to it when null/absent. */
  clip_ratio?: number;
  clip_ratio_low?: number | null;
  clip_ratio_high?: number | null;
  /** Dual-clip bound c > 1 (default 3.0). */
  clip_ratio_c?: number;
  /** SAPO temperatures (defaults 1.0 / 1.05). */
  tau_pos?: number;
  tau_neg?: number;
  /** Clip-Cov (defaults 0.0002, 1.0, 5.0). */
  clip_cov_ratio?: number;
  clip_cov_lb?: number;
  clip_cov_ub?: number;
  /** KL-Cov (defaults 0.0002, 0.1). */
  kl_cov_ratio?: number;
  ppo_kl_coef?: number;
  global_batch_info?: GlobalBatchInfo;
  /** Also return ∂pg_loss/∂log π. */
  with_grad?: boolean;
  /** Random source of clip_cov's priorities (`clipCovPriorities`), drawn when there are more candidates than max(⌊clip_cov_ratio·ΣM⌋, 1) (default: a fresh Rng.fromSeed(0) per call). */
  rng?: { next(): number };
  /** NFT settings (policy_loss "nft"). */
  nft?: NftConfig;
}

/** NFT (negative-aware fine-tuning, arXiv 2505.18116) settings; see nft.ts. */
export interface NftConfig {
  /** 1 = NFT, 0 = RFT (positives only), < 0 = DAPO-like (PPO clip on `advantages`, as NVlabs/NFT). Default 1. */
  neg_weight?: number;
  /** ε of the straight-through clamp max((1 − r̂R)/(1 − r̂), ε) on negatives. Default 1.0 (NVlabs/NFT scripts). */
  clamp_negative?: number;
  /** Straight-through lower clamp of R on positives. Default 0 (no clamp). */
  clamp_positive?: number;
  /** Upper clamp of the per-token log-ratio. Default 10. */
  max_log_ratio?: number;
  /** Clamp range of r̂. Default [0.02, 0.98]. */
  r_hat_min?: number;
  r_hat_max?: number;
  /** Weight every token of a group by (1 − r̂) (NVlabs/NFT normalize=1). Default true. */
  normalize?: boolean;
  /** "sum" (Σ over tokens ÷ loss_scale_factor, the NFT objective) or any loss_agg_mode. Default "sum". */
  loss_agg_mode?: string;
  /** Divisor of the "sum" aggregation (NVlabs/NFT uses 1000). Default 1. */
  loss_scale_factor?: number;
}

export interface PolicyLossMetrics {
  pg_clipfrac?: number;
  ppo_kl?: number;
  pg_clipfrac_lower?: number;
  [key: string]: number | undefined;
}

export interface PolicyLossOutput {
  pg_loss: number;
  /** The loss matrix that was aggregated ((bs, 1) per-sequence losses for geo_mean). */
  pg_losses: Tensor2D<Float64Array>;
  metrics: PolicyLossMetrics;
  grad_log_prob?: Tensor2D<Float64Array>;
}

export type PolicyLossFn = (input: PolicyLossInput, config?: PolicyLossConfig) => PolicyLossOutput;

// ---- shared ------------------------------------------------------------------------------------

interface Prep {
  old: Float64Array;
  lp: Float64Array;
  A: Float64Array;
  M: Float64Array;
  w: Float64Array | null;
  bs: number;
  T: number;
}

function prep(name: string, input: PolicyLossInput): Prep {
  if (!input || !input.log_prob) throw new ConfigError(`policy_loss "${name}": log_prob is required`);
  const { bs, T } = input.log_prob;
  return {
    old: readTensor(`${name}: old_log_prob`, input.old_log_prob, bs, T),
    lp: readTensor(`${name}: log_prob`, input.log_prob, bs, T),
    A: readTensor(`${name}: advantages`, input.advantages, bs, T),
    M: readMask(`${name}: response_mask`, input.response_mask, bs, T),
    w: input.rollout_is_weights ? readTensor(`${name}: rollout_is_weights`, input.rollout_is_weights, bs, T) : null,
    bs,
    T,
  };
}

function clipRange(cfg: PolicyLossConfig): { low: number; high: number } {
  const eps = checkScalar('clip_ratio', cfg.clip_ratio ?? 0.2, { min: 0 });
  const low = checkScalar('clip_ratio_low', cfg.clip_ratio_low ?? eps, { min: 0 });
  const high = checkScalar('clip_ratio_high', cfg.clip_ratio_high ?? eps, { min: 0 });
  return { low, high };
}

function aggregator(mode: string | undefined): LossAggregator {
  return lossAggModes.get(mode ?? 'token-mean');
}

/** masked_mean of an indicator/value vector with verl's 1e-8 epsilon. */
function mm(sum: number, n: number): number {
  return sum / (n + 1e-8);
}

function maskTotal(M: Float64Array): number {
  let n = 0;
  for (let k = 0; k < M.length; k++) if (M[k] !== 0) n += M[k];
  return n;
}

/** Aggregate L and, when asked, scale the per-token derivatives d by the aggregation weights. */
function finish(
  p: Prep,
  agg: LossAggregator,
  info: GlobalBatchInfo,
  L: Float64Array,
  d: Float64Array | null,
  metrics: PolicyLossMetrics,
): PolicyLossOutput {
  const pgLoss = agg.value(L, p.M, p.bs, p.T, info);
  const out: PolicyLossOutput = { pg_loss: pgLoss, pg_losses: { data: L, bs: p.bs, T: p.T }, metrics };
  if (d) {
    const wts = agg.weights(p.M, p.bs, p.T, info);
    for (let k = 0; k < d.length; k++) d[k] = wts[k] === 0 ? 0 : d[k] * wts[k];
    out.grad_log_prob = { data: d, bs: p.bs, T: p.T };
  }
  return out;
}

/** Gradient of max(L1, L2) from its branches (torch.maximum splits ties). */
function dMax(L1: number, L2: number, d1: number, d2: number): number {
  return L2 > L1 ? d2 : L1 > L2 ? d1 : 0.5 * (d1 + d2);
}

function sigmoid(x: number): number {
  if (x >= 0) return 1 / (1 + Math.exp(-x));
  const e = Math.exp(x);
  return e / (1 + e);
}

// ---- PPO ---------------------------------------------------------------------------------------

/**
 * PPO clipped surrogate (Schulman et al. 2017, arXiv 1707.06347) with asymmetric clip
 * (clip_ratio_low/high, DAPO arXiv 2503.14476) and dual clip (Ye et al. 2020, arXiv 1912.09729);
 * verl compute_policy_loss_vanilla:
 *   ℓ = clamp(log π − log π_old, ±20), r = eˡ, L1 = −A·r, L2 = −A·clip(r, 1−ε_low, 1+ε_high),
 *   Lc = max(L1, L2); for A < 0: min(−A·c, Lc). pg_clipfrac = mean[L2 > L1],
 *   pg_clipfrac_lower = mean[(Lc > −A·c) ∧ A < 0], ppo_kl = mean(−ℓ) (clamped ℓ).
 */
export const computePolicyLossVanilla: PolicyLossFn = (input, cfg = {}) => {
  const p = prep('vanilla', input);
  const { low, high } = clipRange(cfg);
  const c = checkScalar('clip_ratio_c', cfg.clip_ratio_c ?? 3.0);
  if (!(c > 1)) throw new ConfigError(`clip_ratio_c (dual-clip lower bound) must be > 1.0, got ${c}`);
  const agg = aggregator(cfg.loss_agg_mode);
  const { old, lp, A, M, w } = p;
  const lo = 1 - low,
    hi = 1 + high;
  const n = p.bs * p.T;
  const L = new Float64Array(n);
  const d = cfg.with_grad ? new Float64Array(n) : null;
  let klSum = 0,
    clipSum = 0,
    lowerSum = 0,
    mTot = 0;
  for (let k = 0; k < n; k++) {
    const l = lp[k] - old[k];
    const lc = l < -20 ? -20 : l > 20 ? 20 : l;
    const r = Math.exp(lc);
    const a = A[k];
    const rc = r < lo ? lo : r > hi ? hi : r;
    const L1 = -a * r,
      L2 = -a * rc;
    const Lc = L1 > L2 ? L1 : L2;
    let loss = Lc;
    let lower = false;
    if (a < 0) {
      const L3 = -a * c;
      lower = Lc > L3;
      loss = L3 < Lc ? L3 : Lc;
    }
    L[k] = w ? loss * w[k] : loss;
    const m = M[k];
    if (m !== 0) {
      mTot += m;
      klSum += -lc * m;
      if (L2 > L1) clipSum += m;
      if (lower) lowerSum += m;
    }
    if (d) {
      const dr = l >= -20 && l <= 20 ? r : 0;
      const d1 = -a * dr,
        d2 = r >= lo && r <= hi ? -a * dr : 0;
      let g = dMax(L1, L2, d1, d2);
      if (a < 0) {
        const L3 = -a * c;
        g = L3 < Lc ? 0 : Lc < L3 ? g : 0.5 * g;
      }
      d[k] = w ? g * w[k] : g;
    }
  }
  return finish(p, agg, cfg.global_batch_info ?? {}, L, d, {
    pg_clipfrac: mm(clipSum, mTot),
    ppo_kl: mm(klSum, mTot),
    pg_clipfrac_lower: mm(lowerSum, mTot),
  });
};

/**
 * GSPO (Zheng et al. 2025, arXiv 2507.18071; verl compute_policy_loss_gspo): sequence-level ratio
 * s_i = exp(min(Σ_t ℓ·M / max(ΣM, 1), 10)) applied to every token (gradient flows per token),
 * PPO clip without dual clip, always aggregated seq-mean-token-mean. ppo_kl uses unclamped ℓ.
 */
export const computePolicyLossGspo: PolicyLossFn = (input, cfg = {}) => {
  const p = prep('gspo', input);
  const { low, high } = clipRange(cfg);
  const agg = lossAggModes.get('seq-mean-token-mean');
  const { old, lp, A, M, w, bs, T } = p;
  const lo = 1 - low,
    hi = 1 + high;
  const L = new Float64Array(bs * T);
  const d = cfg.with_grad ? new Float64Array(bs * T) : null;
  let klSum = 0,
    clipSum = 0,
    mTot = 0;
  for (let i = 0; i < bs; i++) {
    let s = 0,
      n = 0;
    for (let k = i * T, e = k + T; k < e; k++) {
      s += (lp[k] - old[k]) * M[k];
      n += M[k];
    }
    const seqLog = s / Math.max(n, 1);
    const logRatio = Math.min(seqLog, 10);
    const passes = seqLog <= 10;
    const r = Math.exp(logRatio);
    for (let k = i * T, e = k + T; k < e; k++) {
      const a = A[k];
      const rc = r < lo ? lo : r > hi ? hi : r;
      const L1 = -a * r,
        L2 = -a * rc;
      const loss = L1 > L2 ? L1 : L2;
      L[k] = w ? loss * w[k] : loss;
      const m = M[k];
      if (m !== 0) {
        mTot += m;
        klSum += -(lp[k] - old[k]) * m;
        if (L2 > L1) clipSum += m;
      }
      if (d) {
        const dr = passes ? r : 0;
        const g = dMax(L1, L2, -a * dr, r >= lo && r <= hi ? -a * dr : 0);
        d[k] = w ? g * w[k] : g;
      }
    }
  }
  return finish(p, agg, cfg.global_batch_info ?? {}, L, d, {
    pg_clipfrac: mm(clipSum, mTot),
    ppo_kl: mm(klSum, mTot),
    pg_clipfrac_lower: 0,
  });
};

/**
 * SAPO (soft adaptive policy optimization; verl compute_policy_loss_sapo): r = e^{clamp(ℓ, ±20)},
 * τ = τ_pos if A > 0 else τ_neg, gate = σ(τ(r − 1))·4/τ, loss = −gate·A, always aggregated
 * seq-mean-token-mean. Both clip fractions are 0.
 */
export const computePolicyLossSapo: PolicyLossFn = (input, cfg = {}) => {
  const p = prep('sapo', input);
  const tauPos = checkScalar('tau_pos', cfg.tau_pos ?? 1.0, { minExclusive: 0 });
  const tauNeg = checkScalar('tau_neg', cfg.tau_neg ?? 1.05, { minExclusive: 0 });
  const agg = lossAggModes.get('seq-mean-token-mean');
  const { old, lp, A, M, w, bs, T } = p;
  const n = bs * T;
  const L = new Float64Array(n);
  const d = cfg.with_grad ? new Float64Array(n) : null;
  let klSum = 0,
    mTot = 0;
  for (let k = 0; k < n; k++) {
    const l = lp[k] - old[k];
    const lc = l < -20 ? -20 : l > 20 ? 20 : l;
    const r = Math.exp(lc);
    const a = A[k];
    const tau = a > 0 ? tauPos : tauNeg;
    const sg = sigmoid(tau * (r - 1));
    const loss = -(sg * (4 / tau)) * a;
    L[k] = w ? loss * w[k] : loss;
    const m = M[k];
    if (m !== 0) {
      mTot += m;
      klSum += -lc * m;
    }
    if (d) {
      const dr = l >= -20 && l <= 20 ? r : 0;
      const g = -a * 4 * sg * (1 - sg) * dr;
      d[k] = w ? g * w[k] : g;
    }
  }
  return finish(p, agg, cfg.global_batch_info ?? {}, L, d, {
    pg_clipfrac: 0,
    ppo_kl: mm(klSum, mTot),
    pg_clipfrac_lower: 0,
  });
};

/** GPG (Chu et al. 2025, arXiv 2504.02546; verl compute_policy_loss_gpg): loss = −log π·A (× IS weights). */
export const computePolicyLossGpg: PolicyLossFn = (input, cfg = {}) => {
  const p = prep('gpg', input);
  const agg = aggregator(cfg.loss_agg_mode);
  const { lp, A, w } = p;
  const n = p.bs * p.T;
  const L = new Float64Array(n);
  const d = cfg.with_grad ? new Float64Array(n) : null;
  for (let k = 0; k < n; k++) {
    const loss = -lp[k] * A[k];
    L[k] = w ? loss * w[k] : loss;
    if (d) d[k] = w ? -A[k] * w[k] : -A[k];
  }
  return finish(p, agg, cfg.global_batch_info ?? {}, L, d, {});
};

/**
 * CISPO (MiniMax-M1, arXiv 2506.13585; verl compute_policy_loss_cispo): loss = −sg(clip(r, 1−ε_low,
 * 1+ε_high))·A·log π (× IS weights), r = e^{clamp(ℓ, ±20)}; pg_clipfrac = mean[r ≠ clip(r)].
 */
export const computePolicyLossCispo: PolicyLossFn = (input, cfg = {}) => {
  const p = prep('cispo', input);
  const { low, high } = clipRange(cfg);
  const agg = aggregator(cfg.loss_agg_mode);
  const { old, lp, A, M, w } = p;
  const lo = 1 - low,
    hi = 1 + high;
  const n = p.bs * p.T;
  const L = new Float64Array(n);
  const d = cfg.with_grad ? new Float64Array(n) : null;
  let klSum = 0,
    clipSum = 0,
    mTot = 0;
  for (let k = 0; k < n; k++) {
    const l = lp[k] - old[k];
    const lc = l < -20 ? -20 : l > 20 ? 20 : l;
    const r = Math.exp(lc);
    const rc = r < lo ? lo : r > hi ? hi : r;
    const loss = -rc * A[k] * lp[k];
    L[k] = w ? loss * w[k] : loss;
    const m = M[k];
    if (m !== 0) {
      mTot += m;
      klSum += -lc * m;
      if (r !== rc) clipSum += m;
    }
    if (d) d[k] = w ? -rc * A[k] * w[k] : -rc * A[k];
  }
  return finish(p, agg, cfg.global_batch_info ?? {}, L, d, {
    pg_clipfrac: mm(clipSum, mTot),
    ppo_kl: mm(klSum, mTot),
    pg_clipfrac_lower: 0,
  });
};

/**
 * REINFORCE with optional IS correction (verl compute_policy_loss_reinforce): loss = −A·log π (× w);
 * `old_log_prob` is the rollout policy's log-prob, ppo_kl = mean(log π_rollout − log π).
 */
export const computePolicyLossReinforce: PolicyLossFn = (input, cfg = {}) => {
  const p = prep('reinforce', input);
  const agg = aggregator(cfg.loss_agg_mode);
  const { old, lp, A, M, w } = p;
  const n = p.bs * p.T;
  const L = new Float64Array(n);
  const d = cfg.with_grad ? new Float64Array(n) : null;
  let klSum = 0,
    mTot = 0;
  for (let k = 0; k < n; k++) {
    L[k] = w ? -A[k] * lp[k] * w[k] : -A[k] * lp[k];
    const m = M[k];
    if (m !== 0) {
      mTot += m;
      klSum += -(lp[k] - old[k]) * m;
    }
    if (d) d[k] = w ? -A[k] * w[k] : -A[k];
  }
  return finish(p, agg, cfg.global_batch_info ?? {}, L, d, { ppo_kl: mm(klSum, mTot) });
};

/**
 * GMPO, geometric-mean policy optimization (Zhao et al. 2025, arXiv 2507.20673; verl
 * compute_policy_loss_geo_mean): token clip in log space m = sgn(A)·min(sgn(A)·ℓ, sgn(A)·clamp(ℓ,
 * −ε_low, ε_high)) (ℓ unclamped), ratio_i = exp(Σ m·M/(ΣM + 1e-8)), Ā_i = Σ A·M/(ΣM + 1e-8),
 * loss = plain mean over all rows of −Ā_i·ratio_i (× per-row geometric mean of the IS weights).
 * loss_agg_mode is ignored.
 */
export const computePolicyLossGeoMean: PolicyLossFn = (input, cfg = {}) => {
  const p = prep('geo_mean', input);
  const { low, high } = clipRange(cfg);
  const { old, lp, A, M, w, bs, T } = p;
  const rows = new Float64Array(bs);
  const d = cfg.with_grad ? new Float64Array(bs * T) : null;
  let klSum = 0,
    clipSum = 0,
    lowerSum = 0,
    mTot = 0;
  for (let i = 0; i < bs; i++) {
    let sm = 0,
      sa = 0,
      n = 0,
      sw = 0;
    for (let k = i * T, e = k + T; k < e; k++) {
      const l = lp[k] - old[k],
        a = A[k],
        m = M[k];
      const lcl = l < -low ? -low : l > high ? high : l;
      const sgn = Math.sign(a);
      const u = sgn * l,
        v = sgn * lcl;
      const mn = sgn * (u < v ? u : v);
      sm += mn * m;
      sa += a * m;
      n += m;
      if (w) sw += Math.log(w[k] + 1e-10) * m;
      if (m !== 0) {
        mTot += m;
        klSum += -l * m;
        if (l !== lcl) {
          if (a > 0) clipSum += m;
          else if (a < 0) lowerSum += m;
        }
      }
    }
    const ratio = Math.exp(sm / (n + 1e-8));
    const aBar = sa / (n + 1e-8);
    const seqW = w ? Math.exp(sw / (n + 1e-8)) : 1;
    rows[i] = -aBar * ratio * seqW;
    if (d) {
      const scale = (-aBar * ratio * seqW) / (n + 1e-8) / bs;
      for (let k = i * T, e = k + T; k < e; k++) {
        const m = M[k];
        if (m === 0) continue;
        const l = lp[k] - old[k],
          a = A[k];
        if (a === 0) continue;
        const inRange = l >= -low && l <= high;
        const lcl = l < -low ? -low : l > high ? high : l;
        const u = Math.sign(a) * l,
          v = Math.sign(a) * lcl;
        const dm = u < v ? 1 : u > v ? (inRange ? 1 : 0) : (1 + (inRange ? 1 : 0)) / 2;
        d[k] = scale * dm * m;
      }
    }
  }
  let total = 0;
  for (let i = 0; i < bs; i++) total += rows[i];
  const out: PolicyLossOutput = {
    pg_loss: bs > 0 ? total / bs : NaN,
    pg_losses: { data: rows, bs, T: 1 },
    metrics: { pg_clipfrac: mm(clipSum, mTot), ppo_kl: mm(klSum, mTot), pg_clipfrac_lower: mm(lowerSum, mTot) },
  };
  if (d) out.grad_log_prob = { data: d, bs, T };
  return out;
};

/**
 * clip_cov's random priorities: a uniformly random permutation of 0..n−1 over the n = bs·T tokens
 * (row-major), drawn with `rng` by Fisher–Yates (n draws of rng.next()). When there are more
 * candidates than clip_num, the clip_num candidates of lowest priority are zeroed — a uniform
 * random subset, as verl's torch.randperm, that the ONNX training graph reproduces exactly from
 * the same priorities (lib/model/loss.ts; the trainer draws them with this function).
 */
export function clipCovPriorities(n: number, rng: { next(): number }): Float64Array {
  const p = new Float64Array(n);
  for (let k = 0; k < n; k++) p[k] = k;
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(rng.next() * (i + 1));
    const t = p[i];
    p[i] = p[j];
    p[j] = t;
  }
  return p;
}

/**
 * Clip-Cov (Cui et al. 2025, arXiv 2505.22617; verl compute_policy_loss_clip_cov): PPO clip
 * without dual clip on unclamped ℓ; cov = (A − mean A)(log π − mean log π) over valid tokens, −∞ at
 * masked and already-clipped tokens; up to max(⌊ratio·ΣM⌋, 1) tokens with lb < cov < ub (when there
 * are more, those of lowest `clipCovPriorities` priority drawn with cfg.rng) get their loss (and
 * gradient) zeroed. pg_clipfrac = fraction zeroed. verl selects per micro-batch (each call).
 */
export const computePolicyLossClipCov: PolicyLossFn = (input, cfg = {}) => {
  const p = prep('clip_cov', input);
  const { low, high } = clipRange(cfg);
  const ratio = checkScalar('clip_cov_ratio', cfg.clip_cov_ratio ?? 0.0002, { minExclusive: 0 });
  const lb = checkScalar('clip_cov_lb', cfg.clip_cov_lb ?? 1.0);
  const ub = checkScalar('clip_cov_ub', cfg.clip_cov_ub ?? 5.0);
  const agg = aggregator(cfg.loss_agg_mode);
  const { old, lp, A, M, w } = p;
  const n = p.bs * p.T;
  const lo = 1 - low,
    hi = 1 + high;
  let sumA = 0,
    sumLp = 0,
    mTot = 0,
    klSum = 0;
  for (let k = 0; k < n; k++) {
    const m = M[k];
    if (m !== 0) {
      sumA += A[k] * m;
      sumLp += lp[k] * m;
      mTot += m;
      klSum += -(lp[k] - old[k]) * m;
    }
  }
  const meanA = mm(sumA, mTot),
    meanLp = mm(sumLp, mTot);
  const L1 = new Float64Array(n),
    L2 = new Float64Array(n);
  const candidates: number[] = [];
  for (let k = 0; k < n; k++) {
    const r = Math.exp(lp[k] - old[k]);
    const rc = r < lo ? lo : r > hi ? hi : r;
    L1[k] = -A[k] * r;
    L2[k] = -A[k] * rc;
    if (!(M[k] > 0) || L2[k] > L1[k]) continue; // cov = −∞
    const cov = (A[k] - meanA) * (lp[k] - meanLp);
    if (cov < ub && cov > lb) candidates.push(k);
  }
  const clipNum = Math.max(Math.trunc(ratio * maskTotal(M)), 1);
  const corr = new Uint8Array(n).fill(1);
  if (candidates.length <= clipNum) for (const k of candidates) corr[k] = 0;
  else {
    // the clipNum candidates of lowest random priority (a uniform subset, as verl's randperm)
    const prio = clipCovPriorities(n, cfg.rng ?? Rng.fromSeed(0));
    candidates.sort((x, y) => prio[x] - prio[y]);
    for (let j = 0; j < clipNum; j++) corr[candidates[j]] = 0;
  }
  const L = new Float64Array(n);
  const d = cfg.with_grad ? new Float64Array(n) : null;
  let zeroSum = 0;
  for (let k = 0; k < n; k++) {
    const loss = (L1[k] > L2[k] ? L1[k] : L2[k]) * corr[k];
    L[k] = w ? loss * w[k] : loss;
    if (M[k] !== 0 && corr[k] === 0) zeroSum += M[k];
    if (d) {
      if (corr[k] === 0) continue;
      const r = Math.exp(lp[k] - old[k]);
      const g = dMax(L1[k], L2[k], -A[k] * r, r >= lo && r <= hi ? -A[k] * r : 0);
      d[k] = w ? g * w[k] : g;
    }
  }
  return finish(p, agg, cfg.global_batch_info ?? {}, L, d, { pg_clipfrac: mm(zeroSum, mTot), ppo_kl: mm(klSum, mTot) });
};

/**
 * KL-Cov (Cui et al. 2025, arXiv 2505.22617; verl compute_policy_loss_kl_cov): loss = −A·r with
 * no clipping (unclamped ℓ); the top-k valid tokens by cov = (A − mean A)(log π − mean log π) (plain
 * means over valid tokens, row-major), k = max(1, ⌊n_valid·kl_cov_ratio⌋), get +ppo_kl_coef·|ℓ|.
 * ppo_kl = mean |ℓ|.
 */
export const computePolicyLossKlCov: PolicyLossFn = (input, cfg = {}) => {
  const p = prep('kl_cov', input);
  const ratio = checkScalar('kl_cov_ratio', cfg.kl_cov_ratio ?? 0.0002, { minExclusive: 0 });
  const coef = checkScalar('ppo_kl_coef', cfg.ppo_kl_coef ?? 0.1);
  const agg = aggregator(cfg.loss_agg_mode);
  const { old, lp, A, M, w } = p;
  const n = p.bs * p.T;
  const valid: number[] = [];
  let absSum = 0,
    mTot = 0,
    sumA = 0,
    sumLp = 0;
  for (let k = 0; k < n; k++) {
    const m = M[k];
    if (m !== 0) {
      mTot += m;
      absSum += Math.abs(lp[k] - old[k]) * m;
    }
    if (m > 0) {
      valid.push(k);
      sumA += A[k];
      sumLp += lp[k];
    }
  }
  const selected = new Uint8Array(n);
  if (valid.length > 0) {
    const meanA = sumA / valid.length,
      meanLp = sumLp / valid.length;
    const cov = new Float64Array(valid.length);
    for (let j = 0; j < valid.length; j++) cov[j] = (A[valid[j]] - meanA) * (lp[valid[j]] - meanLp);
    const kk = Math.max(1, Math.trunc(valid.length * ratio));
    const idx = Array.from({ length: valid.length }, (_, j) => j);
    idx.sort((x, y) => cov[y] - cov[x] || x - y);
    for (let j = 0; j < kk && j < idx.length; j++) selected[valid[idx[j]]] = 1;
  }
  const L = new Float64Array(n);
  const d = cfg.with_grad ? new Float64Array(n) : null;
  for (let k = 0; k < n; k++) {
    const l = lp[k] - old[k];
    const r = Math.exp(l);
    let loss = -A[k] * r;
    if (selected[k]) loss = -A[k] * r + coef * Math.abs(l);
    L[k] = w ? loss * w[k] : loss;
    if (d) {
      const g = -A[k] * r + (selected[k] ? coef * Math.sign(l) : 0);
      d[k] = w ? g * w[k] : g;
    }
  }
  return finish(p, agg, cfg.global_batch_info ?? {}, L, d, { ppo_kl: mm(absSum, mTot) });
};

// ---- value and entropy losses ------------------------------------------------------------------

export interface ValueLossInput {
  vpreds: Tensor2D;
  returns: Tensor2D;
  /** Values from the rollout-time critic (the clip centre). */
  values: Tensor2D;
  response_mask: Mask2D;
}

export interface ValueLossOutput {
  vf_loss: number;
  vf_clipfrac: number;
  /** ∂vf_loss/∂vpreds per token (with_grad). */
  grad_vpreds?: Tensor2D<Float64Array>;
}

/**
 * Clipped value loss (PPO; verl compute_value_loss): v̂ = clip(v, V_old − c, V_old + c),
 * vf_loss = ½·agg_loss(max((v − R)², (v̂ − R)²)), vf_clipfrac = mean[(v̂ − R)² > (v − R)²].
 */
export function computeValueLoss(
  input: ValueLossInput,
  cfg: { cliprange_value: number; loss_agg_mode?: string; global_batch_info?: GlobalBatchInfo; with_grad?: boolean },
): ValueLossOutput {
  if (!input || !input.vpreds) throw new ConfigError('value_loss: vpreds are required');
  const { bs, T } = input.vpreds;
  const v = readTensor('value_loss: vpreds', input.vpreds, bs, T);
  const R = readTensor('value_loss: returns', input.returns, bs, T);
  const V = readTensor('value_loss: values', input.values, bs, T);
  const M = readMask('value_loss: response_mask', input.response_mask, bs, T);
  const c = checkScalar('cliprange_value', cfg.cliprange_value, { min: 0 });
  const agg = aggregator(cfg.loss_agg_mode);
  const info = cfg.global_batch_info ?? {};
  const n = bs * T;
  const L = new Float64Array(n);
  const d = cfg.with_grad ? new Float64Array(n) : null;
  let clipSum = 0,
    mTot = 0;
  for (let k = 0; k < n; k++) {
    const lo = V[k] - c,
      hi = V[k] + c;
    const vc = Math.max(Math.min(v[k], hi), lo);
    const l1 = (v[k] - R[k]) ** 2,
      l2 = (vc - R[k]) ** 2;
    L[k] = l1 > l2 ? l1 : l2;
    if (M[k] !== 0) {
      mTot += M[k];
      if (l2 > l1) clipSum += M[k];
    }
    if (d) {
      const d1 = 2 * (v[k] - R[k]);
      const d2 = v[k] >= lo && v[k] <= hi ? 2 * (vc - R[k]) : 0;
      d[k] = 0.5 * dMax(l1, l2, d1, d2);
    }
  }
  const out: ValueLossOutput = { vf_loss: 0.5 * agg.value(L, M, bs, T, info), vf_clipfrac: mm(clipSum, mTot) };
  if (d) {
    const wts = agg.weights(M, bs, T, info);
    for (let k = 0; k < n; k++) d[k] = wts[k] === 0 ? 0 : d[k] * wts[k];
    out.grad_vpreds = { data: d, bs, T };
  }
  return out;
}

/** Entropy loss (verl compute_entropy_loss): agg_loss(entropy_from_logits(z), M, mode). */
export function computeEntropyLoss(
  logits: Tensor3D,
  responseMask: Mask2D,
  lossAggMode = 'token-mean',
  info: GlobalBatchInfo = {},
): number {
  const agg = aggregator(lossAggMode);
  const M = readMask('entropy_loss: response_mask', responseMask, logits.bs, logits.T);
  const H = entropyFromLogits(logits);
  return agg.value(asF64(H.data), M, logits.bs, logits.T, info);
}
