/**
 * Reward and loss shaping terms: DAPO's overlong reward shaping and the entropy penalty.
 */
import { ConfigError } from '../errors.ts';
import { lossAggModes, type GlobalBatchInfo } from './agg.ts';
import { checkScalar, readMask, readTensor, type Mask2D, type Tensor2D } from './tensor.ts';

export interface OverlongConfig {
  /** Maximum response length L_max (tokens). */
  max_response_length: number;
  /** Soft-punishment buffer L_cache (tokens), > 0. */
  overlong_buffer_len: number;
  /** Penalty at the hard limit (DAPO: 1.0). */
  overlong_penalty_factor: number;
}

function checkOverlong(cfg: OverlongConfig): void {
  checkScalar('max_response_length', cfg.max_response_length, { minExclusive: 0 });
  checkScalar('overlong_buffer_len', cfg.overlong_buffer_len, { minExclusive: 0 });
  checkScalar('overlong_penalty_factor', cfg.overlong_penalty_factor, { min: 0 });
  if (cfg.overlong_buffer_len > cfg.max_response_length) {
    throw new ConfigError(
      `overlong_buffer_len (${cfg.overlong_buffer_len}) must not exceed max_response_length (${cfg.max_response_length})`,
    );
  }
}

/**
 * DAPO overlong reward shaping (Yu et al. 2025, arXiv 2503.14476; verl DAPORewardManager):
 * penalty(|y|) = min(−(|y| − (L_max − L_cache))/L_cache · factor, 0) — 0 up to L_max − L_cache,
 * then linear down to −factor at L_max.
 */
export function overlongPenalty(responseLength: number, cfg: OverlongConfig): number {
  checkOverlong(cfg);
  checkScalar('response length', responseLength, { min: 0 });
  const expected = cfg.max_response_length - cfg.overlong_buffer_len;
  const exceed = responseLength - expected;
  return Math.min((-exceed / cfg.overlong_buffer_len) * cfg.overlong_penalty_factor, 0) + 0; // + 0 turns −0 into 0
}

/** Adds the overlong penalty to each sequence reward; lengths are valid response lengths. */
export function applyOverlongShaping(
  rewards: ArrayLike<number>,
  lengths: ArrayLike<number>,
  cfg: OverlongConfig,
): {
  rewards: Float64Array;
  penalties: Float64Array;
  metrics: { 'reward/overlong_fraction': number; 'reward/overlong_penalty_mean': number };
} {
  checkOverlong(cfg);
  if (rewards.length !== lengths.length)
    throw new ConfigError(`overlong shaping: ${rewards.length} rewards for ${lengths.length} lengths`);
  const n = rewards.length;
  const out = new Float64Array(n),
    pen = new Float64Array(n);
  let over = 0,
    sum = 0;
  for (let i = 0; i < n; i++) {
    if (!Number.isFinite(rewards[i])) throw new ConfigError(`overlong shaping: reward ${i} is ${rewards[i]}`);
    const L = lengths[i];
    if (!Number.isFinite(L) || L < 0)
      throw new ConfigError(`overlong shaping: response length ${i} is ${L}; lengths must be finite and ≥ 0`);
    const p = overlongPenalty(L, cfg);
    pen[i] = p;
    out[i] = rewards[i] + p;
    if (p < 0) over++;
    sum += p;
  }
  return {
    rewards: out,
    penalties: pen,
    metrics: { 'reward/overlong_fraction': n ? over / n : 0, 'reward/overlong_penalty_mean': n ? sum / n : 0 },
  };
}

export interface EntropyPenaltyOutput {
  /** entropy_penalty_coef · agg(−log p): the term added to the loss. */
  penalty: number;
  /** agg(−log p, M): the sampled-token entropy estimate. */
  entropy: number;
  /** ∂penalty/∂log p per token. */
  grad_log_prob: Tensor2D<Float64Array>;
}

/**
 * Entropy penalty: entropy_penalty_coef · mean(−log p) over response tokens (the Monte-Carlo
 * entropy estimate of the sampled tokens); "mean" is token-mean unless another loss_agg_mode is given.
 */
export function entropyPenalty(
  logProb: Tensor2D,
  responseMask: Mask2D,
  coef: number,
  lossAggMode = 'token-mean',
  info: GlobalBatchInfo = {},
): EntropyPenaltyOutput {
  if (!logProb) throw new ConfigError('entropy_penalty: log_prob is required');
  const { bs, T } = logProb;
  const lp = readTensor('entropy_penalty: log_prob', logProb, bs, T);
  const M = readMask('entropy_penalty: response_mask', responseMask, bs, T);
  checkScalar('entropy_penalty_coef', coef);
  const agg = lossAggModes.get(lossAggMode);
  const nll = new Float64Array(bs * T);
  for (let k = 0; k < nll.length; k++) nll[k] = -lp[k];
  const entropy = agg.value(nll, M, bs, T, info);
  const w = agg.weights(M, bs, T, info);
  const g = new Float64Array(bs * T);
  for (let k = 0; k < g.length; k++) g[k] = w[k] === 0 ? 0 : -coef * w[k];
  return { penalty: coef * entropy, entropy, grad_log_prob: { data: g, bs, T } };
}
