/**
 * VPPO token-level reweighting ("Spotlight on Token Perception for Multimodal Reinforcement
 * Learning", arXiv 2510.09285; "TPRL" in MTRL's code).
 *
 *  1. Token visual dependency: S_t = clamp(eᵈ − d − 1, 0, 10), d = clamp(log π_aug − log π_old, ±20),
 *     where log π_aug is the log-prob of the same token under a perturbed image (a k3 KL estimate
 *     between the policy with the real and the perturbed image).
 *  2. Token gradient filtering: per response keep the top ⌈n_valid·p⌉ valid tokens by dependency
 *     (top_p_perception_tokens, default 0.2) and/or by entropy (top_p_entropy_tokens, default 0.2);
 *     with both on the masks are unioned. The keep mask multiplies the per-token loss (pass it as
 *     `rollout_is_weights`, see combineTokenWeights): dropped tokens contribute 0 but still count in
 *     the loss denominator, which is taken over response_mask.
 *  3. Trajectory advantage shaping: S̄_i = mean_t S_t over valid tokens, n_i = (S̄_i − min)/(max − min)
 *     over the batch (α = 1 for all when max − min ≤ 1e-6), β_max = β_min + (1 − β_min)/(mean n + 1e-8),
 *     α_i = β_min + n_i(β_max − β_min) (so mean α = 1), A_i ← A_i·α_i. β_min = advantage_scaling_min
 *     (MTRL's trajectory_scaling_min), default 0.8.
 *
 * Ties in the top-k are broken by position (earlier first); rows with no valid token keep nothing
 * and get α = 1 (they are excluded from the batch statistics).
 */
import { ConfigError } from '../errors.ts';
import { checkScalar, outTensor, readMask, readTensor, type FloatArray, type Mask2D, type Tensor2D } from './tensor.ts';

export interface VppoConfig {
  /** Fraction of each response's valid tokens kept by visual dependency; null/0 = off. Default 0.2. */
  top_p_perception_tokens?: number | null;
  /** Fraction kept by entropy; null/0 = off. Default 0.2. */
  top_p_entropy_tokens?: number | null;
  /** β_min of the trajectory advantage scaling (MTRL's trajectory_scaling_min). Default 0.8. */
  advantage_scaling_min?: number;
}

/** S_t = clamp(eᵈ − d − 1, 0, 10), d = clamp(aug − old, ±20), per token. */
export function tokenVisualDependency<A extends FloatArray>(
  oldLogProb: Tensor2D<A>,
  augLogProb: Tensor2D,
): Tensor2D<A> {
  if (!oldLogProb) throw new ConfigError('vppo: old_log_prob is required');
  const { bs, T } = oldLogProb;
  const o = readTensor('vppo: old_log_prob', oldLogProb, bs, T);
  const a = readTensor('vppo: aug_log_prob', augLogProb, bs, T);
  const out = new Float64Array(o.length);
  for (let k = 0; k < o.length; k++) {
    const d = Math.min(Math.max(a[k] - o[k], -20), 20);
    out[k] = Math.min(Math.max(Math.exp(d) - d - 1, 0), 10);
  }
  return outTensor(oldLogProb.data, out, bs, T);
}

function topP(name: string, p: number | null | undefined, dflt: number): number {
  const v = p === undefined ? dflt : p;
  if (v === null || v === 0) return 0;
  checkScalar(name, v, { minExclusive: 0, max: 1 });
  return v;
}

/** k = ⌈n·p⌉ (guarded against float noise such as 0.7·10 = 7.000000000000001). */
export function topKCount(nValid: number, p: number): number {
  if (p <= 0 || nValid <= 0) return 0;
  return Math.min(nValid, Math.ceil(nValid * p - 1e-9));
}

/** Marks the top-k valid positions of each row by `score` (ties: earlier position first). */
function markTopK(score: Float64Array, M: Float64Array, bs: number, T: number, p: number, out: Uint8Array): void {
  const pos: number[] = [];
  for (let i = 0; i < bs; i++) {
    pos.length = 0;
    for (let t = 0; t < T; t++) if (M[i * T + t] !== 0) pos.push(t);
    const k = topKCount(pos.length, p);
    if (k === 0) continue;
    if (k === pos.length) {
      for (const t of pos) out[i * T + t] = 1;
      continue;
    }
    pos.sort((x, y) => score[i * T + y] - score[i * T + x] || x - y);
    for (let j = 0; j < k; j++) out[i * T + pos[j]] = 1;
  }
}

export interface TokenFilterOutput {
  /** (bs, T) 1 = the token's gradient is kept (always 0 where response_mask is 0). */
  keep_mask: Tensor2D<Float64Array>;
  metrics: { perception_token_fraction: number; entropy_token_fraction: number; kept_token_fraction: number };
}

/**
 * Token gradient filtering: per row keep the top ⌈n_valid·p⌉ tokens by dependency and/or entropy
 * (union when both are on). With both criteria off every valid token is kept.
 */
export function tokenGradientMask(
  responseMask: Mask2D,
  scores: { dependency?: Tensor2D | null; entropy?: Tensor2D | null },
  cfg: VppoConfig = {},
): TokenFilterOutput {
  if (!responseMask) throw new ConfigError('vppo: response_mask is required');
  const { bs, T } = responseMask;
  const M = readMask('vppo: response_mask', responseMask, bs, T);
  const pPer = topP('top_p_perception_tokens', cfg.top_p_perception_tokens, 0.2);
  const pEnt = topP('top_p_entropy_tokens', cfg.top_p_entropy_tokens, 0.2);
  if (pPer > 0 && !scores.dependency)
    throw new ConfigError(
      'vppo: top_p_perception_tokens is on but no token dependency was given (compute it with tokenVisualDependency, or set top_p_perception_tokens: null)',
    );
  if (pEnt > 0 && !scores.entropy)
    throw new ConfigError(
      'vppo: top_p_entropy_tokens is on but no token entropy was given (set top_p_entropy_tokens: null to disable)',
    );
  const byPer = new Uint8Array(bs * T),
    byEnt = new Uint8Array(bs * T);
  if (pPer > 0) markTopK(readTensor('vppo: dependency', scores.dependency, bs, T), M, bs, T, pPer, byPer);
  if (pEnt > 0) markTopK(readTensor('vppo: entropy', scores.entropy, bs, T), M, bs, T, pEnt, byEnt);
  const keep = new Float64Array(bs * T);
  let nValid = 0,
    nPer = 0,
    nEnt = 0,
    nKeep = 0;
  const none = pPer === 0 && pEnt === 0;
  for (let k = 0; k < bs * T; k++) {
    if (M[k] === 0) continue;
    nValid++;
    nPer += byPer[k];
    nEnt += byEnt[k];
    if (none || byPer[k] || byEnt[k]) {
      keep[k] = 1;
      nKeep++;
    }
  }
  const frac = (x: number) => (nValid > 0 ? x / nValid : 0);
  return {
    keep_mask: { data: keep, bs, T },
    metrics: {
      perception_token_fraction: frac(nPer),
      entropy_token_fraction: frac(nEnt),
      kept_token_fraction: frac(nKeep),
    },
  };
}

export interface TrajectoryScalingOutput<A extends FloatArray = FloatArray> {
  advantages: Tensor2D<A>;
  /** (bs,) α_i. */
  alpha: Float64Array;
  /** (bs,) S̄_i (0 for rows without valid tokens). */
  mean_dependency: Float64Array;
  metrics: { sensitivity_score_mean: number; scaling_factor_mean: number };
}

/** Trajectory advantage shaping: A_i ← A_i·α_i with α from the batch-normalised mean dependency. */
export function trajectoryAdvantageScaling<A extends FloatArray>(
  advantages: Tensor2D<A>,
  dependency: Tensor2D,
  responseMask: Mask2D,
  cfg: VppoConfig = {},
): TrajectoryScalingOutput<A> {
  if (!advantages) throw new ConfigError('vppo: advantages are required');
  const { bs, T } = advantages;
  const A = readTensor('vppo: advantages', advantages, bs, T);
  const S = readTensor('vppo: dependency', dependency, bs, T);
  const M = readMask('vppo: response_mask', responseMask, bs, T);
  const betaMin = checkScalar('advantage_scaling_min', cfg.advantage_scaling_min ?? 0.8, { min: 0, max: 1 });
  const sBar = new Float64Array(bs);
  const valid = new Uint8Array(bs);
  let min = Infinity,
    max = -Infinity,
    sTok = 0,
    nTok = 0;
  for (let i = 0; i < bs; i++) {
    let s = 0,
      n = 0;
    for (let k = i * T, e = k + T; k < e; k++)
      if (M[k] !== 0) {
        s += S[k] * M[k];
        n += M[k];
      }
    sTok += s;
    nTok += n;
    if (n > 0) {
      valid[i] = 1;
      sBar[i] = s / n;
      if (sBar[i] < min) min = sBar[i];
      if (sBar[i] > max) max = sBar[i];
    }
  }
  const alpha = new Float64Array(bs).fill(1);
  if (max - min > 1e-6) {
    let nSum = 0,
      nRows = 0;
    for (let i = 0; i < bs; i++)
      if (valid[i]) {
        nSum += (sBar[i] - min) / (max - min);
        nRows++;
      }
    const meanN = nSum / nRows;
    const betaMax = betaMin + (1 - betaMin) / (meanN + 1e-8);
    for (let i = 0; i < bs; i++)
      if (valid[i]) alpha[i] = betaMin + ((sBar[i] - min) / (max - min)) * (betaMax - betaMin);
  }
  const out = new Float64Array(bs * T);
  let aSum = 0,
    aRows = 0;
  for (let i = 0; i < bs; i++) {
    for (let k = i * T, e = k + T; k < e; k++) out[k] = A[k] * alpha[i];
    if (valid[i]) {
      aSum += alpha[i];
      aRows++;
    }
  }
  return {
    advantages: outTensor(advantages.data, out, bs, T),
    alpha,
    mean_dependency: sBar,
    metrics: { sensitivity_score_mean: nTok > 0 ? sTok / nTok : 0, scaling_factor_mean: aRows > 0 ? aSum / aRows : 1 },
  };
}

export interface VppoInput<A extends FloatArray = FloatArray> {
  advantages: Tensor2D<A>;
  response_mask: Mask2D;
  /** log π_old of the sampled tokens with the original image. */
  old_log_prob: Tensor2D;
  /** log-probs of the same tokens with the perturbed image. */
  aug_log_prob: Tensor2D;
  /** (bs, T) token entropies (needed when top_p_entropy_tokens is on). */
  entropy?: Tensor2D | null;
}

export interface VppoOutput<A extends FloatArray = FloatArray> {
  advantages: Tensor2D<A>;
  keep_mask: Tensor2D<Float64Array>;
  dependency: Tensor2D;
  alpha: Float64Array;
  metrics: {
    entropy_token_fraction: number;
    perception_token_fraction: number;
    kept_token_fraction: number;
    sensitivity_score_mean: number;
    scaling_factor_mean: number;
  };
}

/** The whole VPPO step: dependency → keep mask → shaped advantages, with the paper's metrics. */
export function vppoReweight<A extends FloatArray>(input: VppoInput<A>, cfg: VppoConfig = {}): VppoOutput<A> {
  const dependency = tokenVisualDependency(input.old_log_prob, input.aug_log_prob);
  const filt = tokenGradientMask(input.response_mask, { dependency, entropy: input.entropy ?? null }, cfg);
  const scaled = trajectoryAdvantageScaling(input.advantages, dependency, input.response_mask, cfg);
  return {
    advantages: scaled.advantages,
    keep_mask: filt.keep_mask,
    dependency,
    alpha: scaled.alpha,
    metrics: { ...filt.metrics, ...scaled.metrics },
  };
}

/** Element-wise product of optional per-token weights (e.g. IS weights × VPPO keep mask). */
export function combineTokenWeights(a?: Tensor2D | null, b?: Tensor2D | null): Tensor2D<Float64Array> | null {
  if (!a && !b) return null;
  const x = (a ?? b)!;
  const { bs, T } = x;
  const da = a ? readTensor('combineTokenWeights: a', a, bs, T) : null;
  const db = b ? readTensor('combineTokenWeights: b', b, bs, T) : null;
  const out = new Float64Array(bs * T);
  for (let k = 0; k < out.length; k++) out[k] = (da ? da[k] : 1) * (db ? db[k] : 1);
  return { data: out, bs, T };
}
