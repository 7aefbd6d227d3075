/**
 * Rollout/training mismatch correction (importance sampling between the engine that sampled a
 * response and the trainer's own forward pass of the same weights).
 *
 * Per response of T tokens with trainer log-probs o [T] (old log-probs, recomputed) and engine
 * log-probs b [T] (behaviour), over its sampled tokens m [T] ∈ {0, 1}:
 *   ℓ_t = clamp(o_t − b_t, ±20),  token level: w_t = exp(ℓ_t);  sequence level: w_t = exp(Σ_s m_s ℓ_s)
 *   tis: w_t ← min(w_t, C)        (truncated IS: Yao et al. 2025, "Your Efficient RL Framework
 *                                  Secretly Brings You Off-Policy RL Training"; TRL vllm_importance_sampling_cap)
 *   mis: w_t ← w_t · [L ≤ w_t ≤ C] (masked IS, verl rollout_is_mode=mask; L = threshold_lower or 1/C)
 * w multiplies the per-token policy loss (lib/rl policy losses' `rollout_is_weights`; verl
 * compute_rollout_importance_weights). Metrics over the sampled tokens of all rows:
 *   rollout/mismatch_kl          mean of k3 = r − 1 − log r with r = exp(o − b): an estimate of
 *                                KL(π_rollout ‖ π_train) that is ≥ 0 per token (Schulman's k3)
 *   rollout/is_weight_mean       mean of w after truncation or masking
 *   rollout/is_weight_clipped_frac  share of tokens whose w was truncated or masked
 *   rollout/logprob_mismatch_abs_mean, rollout/logprob_mismatch_abs_max  mean and max of |o_t − b_t|
 *                                (0 exactly when the sampler and the trainer use the same weights
 *                                and kernels; > 0 with bf16 policy versions, policy.dtype)
 */
import { ConfigError } from '../errors.ts';

export const ROLLOUT_CORRECTION_MODES = ['off', 'tis', 'mis'] as const;
export type RolloutCorrectionMode = (typeof ROLLOUT_CORRECTION_MODES)[number];

export interface RolloutCorrectionConfig {
  mode: RolloutCorrectionMode;
  level: 'token' | 'sequence';
  threshold: number;
  threshold_lower: number | null;
}

export interface CorrectionRow {
  /** Trainer (old) log-probs of the response tokens. */
  old: ArrayLike<number>;
  /** Engine (behaviour) log-probs of the same tokens. */
  behaviour: ArrayLike<number>;
  /** 1 = a sampled token, 0 = not (an environment's tokens); absent = all sampled. */
  mask?: ArrayLike<number> | null;
}

export interface CorrectionResult {
  /** Per row, per token: the weight (1 where mode = off or the token is not sampled). */
  weights: Float32Array[];
  metrics: Record<string, number>;
}

export function rolloutCorrection(rows: readonly CorrectionRow[], cfg: RolloutCorrectionConfig): CorrectionResult {
  if (!(cfg.threshold > 1))
    throw new ConfigError(`algorithm.rollout_correction.threshold must be > 1, got ${cfg.threshold}`);
  const upper = cfg.threshold;
  const lower = cfg.threshold_lower ?? 1 / upper;
  let n = 0,
    k3 = 0,
    wSum = 0,
    clipped = 0,
    absSum = 0,
    absMax = 0;
  const weights = rows.map((r, i) => {
    const T = r.old.length;
    if (r.behaviour.length !== T)
      throw new ConfigError(
        `rollout correction row ${i}: ${T} old log-probs but ${r.behaviour.length} behaviour log-probs`,
      );
    const on = (t: number) => !r.mask || r.mask.length === 0 || r.mask[t] !== 0;
    const lr = new Float64Array(T);
    let seq = 0;
    for (let t = 0; t < T; t++) {
      if (!on(t)) continue;
      lr[t] = Math.max(-20, Math.min(20, r.old[t] - r.behaviour[t]));
      seq += lr[t];
    }
    const seqW = Math.exp(Math.max(-20, Math.min(20, seq)));
    const w = new Float32Array(T).fill(1);
    for (let t = 0; t < T; t++) {
      if (!on(t)) continue;
      const diff = Math.abs(r.old[t] - r.behaviour[t]);
      absSum += diff;
      absMax = Math.max(absMax, diff);
      const ratio = Math.exp(lr[t]);
      k3 += ratio - 1 - lr[t];
      const raw = cfg.level === 'sequence' ? seqW : ratio;
      let v = raw,
        cut = false;
      if (cfg.mode === 'tis' && raw > upper) {
        v = upper;
        cut = true;
      } else if (cfg.mode === 'mis' && (raw > upper || raw < lower)) {
        v = 0;
        cut = true;
      }
      if (cfg.mode !== 'off') w[t] = v;
      n++;
      wSum += cfg.mode === 'off' ? raw : v;
      if (cut) clipped++;
    }
    return w;
  });
  const metrics: Record<string, number> =
    n === 0
      ? {}
      : {
          'rollout/mismatch_kl': k3 / n,
          'rollout/is_weight_mean': wSum / n,
          'rollout/is_weight_clipped_frac': clipped / n,
          'rollout/logprob_mismatch_abs_mean': absSum / n,
          'rollout/logprob_mismatch_abs_max': absMax,
        };
  return { weights, metrics };
}
