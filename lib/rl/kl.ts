/**
 * KL between the policy and the reference: per-token estimators (registry `kl_penalty`), the full
 * KL from vocabulary distributions, KL in the reward (r_t = score_t − β·kl_t) with its controller
 * (fixed / adaptive), and KL as a loss term (use_kl_loss). Matched to verl core_algos.kl_penalty,
 * compute_rewards, FixedKLController, AdaptiveKLController and ray_trainer.apply_kl_penalty.
 */
import { ConfigError } from '../errors.ts';
import { Registry } from './registry.ts';
import {
  asF64,
  checkScalar,
  outTensor,
  readMask,
  readTensor,
  type FloatArray,
  type Mask2D,
  type Tensor2D,
  type Tensor3D,
} from './tensor.ts';
import { lossAggModes, type GlobalBatchInfo } from './agg.ts';

/** One per-token estimator of KL(π‖π_ref) from x = log π − log π_ref: its value and ∂value/∂log π. */
export interface KlEstimator {
  /** True for "full": needs (bs, T, V) distributions, see klFull. */
  readonly needsDistributions?: boolean;
  value(logprob: number, ref: number): number;
  grad(logprob: number, ref: number): number;
}

/** k1 (Schulman 2020, "Approximating KL divergence"): log π − log π_ref. */
const k1: KlEstimator = { value: (lp, ref) => lp - ref, grad: () => 1 };
/** |log π − log π_ref|; gradient sign(x) with sign(0) = 0. */
const absKl: KlEstimator = { value: (lp, ref) => Math.abs(lp - ref), grad: (lp, ref) => Math.sign(lp - ref) };
/** k2: ½(log π − log π_ref)². */
const k2: KlEstimator = { value: (lp, ref) => 0.5 * (lp - ref) * (lp - ref), grad: (lp, ref) => lp - ref };
/**
 * k3 / low_var_kl: x = clamp(log π_ref − log π, −20, 20), kl = clamp(eˣ − x − 1, −10, 10).
 * Gradient 1 − eˣ, and 0 where either clamp is active (torch passes it at the boundary).
 */
const k3: KlEstimator = {
  value(lp, ref) {
    const x = Math.min(Math.max(ref - lp, -20), 20);
    return Math.min(Math.max(Math.exp(x) - x - 1, -10), 10);
  },
  grad(lp, ref) {
    const d = ref - lp;
    if (d < -20 || d > 20) return 0;
    const kld = Math.exp(d) - d - 1;
    if (kld < -10 || kld > 10) return 0;
    return 1 - Math.exp(d);
  },
};
const full: KlEstimator = {
  needsDistributions: true,
  value() {
    throw fullNeedsDistributions();
  },
  grad() {
    throw fullNeedsDistributions();
  },
};

function fullNeedsDistributions(): ConfigError {
  return new ConfigError(
    'kl_penalty "full" needs the full vocabulary distributions, not per-token log-probs: call klFull(logp_dist, ref_logp_dist) with (bs, T, V) log-probabilities',
  );
}

/** Registry `kl_penalty` (also used for `kl_loss_type`). */
export const klPenaltyModes = new Registry<KlEstimator>('kl_penalty', {
  kl: k1,
  k1,
  abs: absKl,
  mse: k2,
  k2,
  low_var_kl: k3,
  k3,
  full,
});

function estimator(mode: string): KlEstimator {
  if (typeof mode === 'string' && mode.endsWith('+')) {
    throw new ConfigError(
      `kl_penalty "${mode}": the straight-through "+" variants (forward = base estimator, gradient = k2) are not available — verl raises NotImplementedError for them at the pinned commit; use "${mode.slice(0, -1)}" (or "k2"/"mse" for the k2 gradient)`,
    );
  }
  const est = klPenaltyModes.get(mode);
  if (est.needsDistributions) throw fullNeedsDistributions();
  return est;
}

function readPair(what: string, logprob: Tensor2D, ref: Tensor2D): { lp: Float64Array; ref: Float64Array } {
  if (!logprob) throw new ConfigError(`${what}: logprob is required`);
  return {
    lp: readTensor(`${what}: logprob`, logprob, logprob.bs, logprob.T),
    ref: readTensor(`${what}: ref_logprob`, ref, logprob.bs, logprob.T),
  };
}

/** Per-token KL penalty kl_t = estimator(log π_t, log π_ref,t) (verl core_algos.kl_penalty). */
export function klPenalty<A extends FloatArray>(logprob: Tensor2D<A>, refLogprob: Tensor2D, mode: string): Tensor2D<A> {
  const est = estimator(mode);
  const { lp, ref } = readPair(`kl_penalty "${mode}"`, logprob, refLogprob);
  const out = new Float64Array(lp.length);
  if (est === k3 && logprob.data instanceof Float32Array) {
    // float32 inputs: evaluate eˣ − x − 1 in float32 like the reference, so x ≈ 0 cancels to the
    // same (often exactly 0) value instead of the double-precision x²/2.
    const fr = Math.fround;
    for (let k = 0; k < lp.length; k++) {
      const x = Math.min(Math.max(fr(ref[k] - lp[k]), -20), 20);
      out[k] = Math.min(Math.max(fr(fr(fr(Math.exp(x)) - x) - 1), -10), 10);
    }
  } else if (est === k3) {
    for (let k = 0; k < lp.length; k++) {
      const x = Math.min(Math.max(ref[k] - lp[k], -20), 20);
      out[k] = Math.min(Math.max(Math.exp(x) - x - 1, -10), 10);
    }
  } else if (est === k1) {
    for (let k = 0; k < lp.length; k++) out[k] = lp[k] - ref[k];
  } else {
    for (let k = 0; k < lp.length; k++) out[k] = est.value(lp[k], ref[k]);
  }
  return outTensor(logprob.data, out, logprob.bs, logprob.T);
}

/** ∂(Σ kl)/∂log π per token, the gradient the training graph must reproduce. */
export function klPenaltyGrad<A extends FloatArray>(
  logprob: Tensor2D<A>,
  refLogprob: Tensor2D,
  mode: string,
): Tensor2D<A> {
  const est = estimator(mode);
  const { lp, ref } = readPair(`kl_penalty "${mode}"`, logprob, refLogprob);
  const out = new Float64Array(lp.length);
  if (est === k3 && logprob.data instanceof Float32Array) {
    // float32: 1 − float32(eˣ), so |x| below float32 resolution gives exactly 0 as in the reference
    const fr = Math.fround;
    for (let k = 0; k < lp.length; k++) {
      const d = fr(ref[k] - lp[k]);
      out[k] =
        d < -20 || d > 20
          ? 0
          : (() => {
              const e = fr(Math.exp(d));
              const kld = fr(fr(e - d) - 1);
              return kld > 10 ? 0 : fr(1 - e);
            })();
    }
  } else {
    for (let k = 0; k < lp.length; k++) out[k] = est.grad(lp[k], ref[k]);
  }
  return outTensor(logprob.data, out, logprob.bs, logprob.T);
}

/**
 * Full KL per token from vocabulary distributions: KL(π‖π_ref) = Σ_v π_v (log π_v − log π_ref,v),
 * with (bs, T, V) log-probabilities (use logSoftmax on logits first). The "full" kl_penalty mode.
 */
export function klFull<A extends FloatArray>(logpDist: Tensor3D<A>, refLogpDist: Tensor3D): Tensor2D<A> {
  const { bs, T, V } = logpDist;
  if (refLogpDist.bs !== bs || refLogpDist.T !== T || refLogpDist.V !== V) {
    throw new ConfigError(
      `klFull: ref distribution has shape (${refLogpDist.bs}, ${refLogpDist.T}, ${refLogpDist.V}), expected (${bs}, ${T}, ${V})`,
    );
  }
  if (logpDist.data.length !== bs * T * V || refLogpDist.data.length !== bs * T * V)
    throw new ConfigError(`klFull: data length does not match shape (${bs}, ${T}, ${V})`);
  const p = asF64(logpDist.data),
    q = asF64(refLogpDist.data);
  const out = new Float64Array(bs * T);
  for (let r = 0, base = 0; r < bs * T; r++, base += V) {
    let kl = 0;
    for (let v = 0; v < V; v++) {
      const lp = p[base + v],
        lq = q[base + v];
      if (Number.isNaN(lp) || Number.isNaN(lq) || lp === Infinity || lq === Infinity) {
        throw new ConfigError(
          `klFull: invalid log-probability at [${Math.floor(r / T)}, ${r % T}, ${v}] (${lp}, ${lq})`,
        );
      }
      if (lp === -Infinity) continue; // π_v = 0 contributes 0
      if (lq === -Infinity)
        throw new ConfigError(
          `klFull: reference assigns zero probability at [${Math.floor(r / T)}, ${r % T}, ${v}] where the policy does not; KL is infinite`,
        );
      kl += Math.exp(lp) * (lp - lq);
    }
    out[r] = kl;
  }
  return outTensor(logpDist.data, out, bs, T);
}

/** compute_rewards: r_t = score_t − (log π_old − log π_ref)·kl_ratio (verl core_algos.compute_rewards). */
export function computeRewards<A extends FloatArray>(
  tokenLevelScores: Tensor2D<A>,
  oldLogProb: Tensor2D,
  refLogProb: Tensor2D,
  klRatio: number,
): Tensor2D<A> {
  if (!tokenLevelScores) throw new ConfigError('compute_rewards: token_level_scores are required');
  const { bs, T } = tokenLevelScores;
  const s = readTensor('compute_rewards: token_level_scores', tokenLevelScores, bs, T);
  const o = readTensor('compute_rewards: old_log_prob', oldLogProb, bs, T);
  const r = readTensor('compute_rewards: ref_log_prob', refLogProb, bs, T);
  checkScalar('kl_ratio', klRatio);
  const out = new Float64Array(s.length);
  if (tokenLevelScores.data instanceof Float32Array) {
    const fr = Math.fround,
      k32 = fr(klRatio);
    for (let k = 0; k < s.length; k++) out[k] = fr(s[k] - fr(fr(o[k] - r[k]) * k32));
  } else {
    for (let k = 0; k < s.length; k++) out[k] = s[k] - (o[k] - r[k]) * klRatio;
  }
  return outTensor(tokenLevelScores.data, out, bs, T);
}

// ---- controllers -------------------------------------------------------------------------------

/** A KL coefficient controller; immutable — `update` returns the next controller. */
export interface KlController {
  readonly type: 'fixed' | 'adaptive';
  readonly value: number;
  update(currentKl: number, nSteps: number): KlController;
}

/** Fixed β (verl FixedKLController): update is a no-op. */
export class FixedKlController implements KlController {
  readonly type = 'fixed' as const;
  constructor(readonly value: number) {
    checkScalar('kl_ctrl.kl_coef', value, { min: 0 });
  }
  update(currentKl: number, nSteps: number): FixedKlController {
    checkScalar('current_kl', currentKl);
    checkScalar('n_steps', nSteps, { min: 0 });
    return this;
  }
}

/**
 * Adaptive β (Ziegler et al. 2019, arXiv 1909.08593; verl AdaptiveKLController):
 * e = clip(KL/target − 1, −0.2, 0.2), β ← β·(1 + e·n_steps/horizon).
 */
export class AdaptiveKlController implements KlController {
  readonly type = 'adaptive' as const;
  constructor(
    readonly value: number,
    readonly target: number,
    readonly horizon: number,
  ) {
    checkScalar('kl_ctrl.kl_coef', value, { min: 0 });
    checkScalar('kl_ctrl.target_kl', target, { minExclusive: 0 });
    checkScalar('kl_ctrl.horizon', horizon, { minExclusive: 0 });
  }
  update(currentKl: number, nSteps: number): AdaptiveKlController {
    checkScalar('current_kl', currentKl);
    checkScalar('n_steps', nSteps, { min: 0 });
    const err = Math.min(Math.max(currentKl / this.target - 1, -0.2), 0.2);
    const mult = 1 + (err * nSteps) / this.horizon;
    return new AdaptiveKlController(this.value * mult, this.target, this.horizon);
  }
}

export interface KlCtrlConfig {
  type: 'fixed' | 'adaptive';
  kl_coef: number;
  target_kl?: number;
  horizon?: number;
}

/** verl get_kl_controller: `algorithm.kl_ctrl` → a controller. */
export function makeKlController(cfg: KlCtrlConfig): KlController {
  if (cfg.type === 'fixed') return new FixedKlController(cfg.kl_coef);
  if (cfg.type === 'adaptive') {
    if (cfg.target_kl === undefined || cfg.horizon === undefined)
      throw new ConfigError('kl_ctrl.type "adaptive" needs target_kl and horizon');
    return new AdaptiveKlController(cfg.kl_coef, cfg.target_kl, cfg.horizon);
  }
  throw new ConfigError(`unknown kl_ctrl.type "${String((cfg as { type: unknown }).type)}" — valid: adaptive, fixed`);
}

// ---- KL in the reward --------------------------------------------------------------------------

export interface KlInRewardInput<A extends FloatArray = FloatArray> {
  token_level_scores: Tensor2D<A>;
  old_log_probs: Tensor2D;
  ref_log_prob: Tensor2D;
  response_mask: Mask2D;
}

export interface KlInRewardOutput<A extends FloatArray = FloatArray> {
  token_level_rewards: Tensor2D<A>;
  /** kl_t·M_t */
  kld: Tensor2D<A>;
  /** mean over sequences of masked_mean(kl·M, M, axis=-1): the statistic fed to the controller. */
  current_kl: number;
  beta: number;
  metrics: { 'actor/reward_kl_penalty': number; 'actor/reward_kl_penalty_coeff': number };
  /** The controller after `update(current_kl, bs)`. */
  next_controller: KlController;
}

/**
 * KL in the reward (verl ray_trainer.apply_kl_penalty): kld = kl_penalty(old, ref)·M,
 * r_t = score_t − β·kld_t, current_kl = mean_i masked_mean(kld_i, M_i); the controller is then
 * updated with (current_kl, bs).
 */
export function applyKlPenalty<A extends FloatArray>(
  input: KlInRewardInput<A>,
  cfg: { kl_penalty: string; controller: KlController },
): KlInRewardOutput<A> {
  if (!input || !input.token_level_scores) throw new ConfigError('apply_kl_penalty: token_level_scores are required');
  const { bs, T } = input.token_level_scores;
  const s = readTensor('apply_kl_penalty: token_level_scores', input.token_level_scores, bs, T);
  readTensor('apply_kl_penalty: old_log_probs', input.old_log_probs, bs, T);
  const M = readMask('apply_kl_penalty: response_mask', input.response_mask, bs, T);
  const kl = asF64(klPenalty(input.old_log_probs, input.ref_log_prob, cfg.kl_penalty).data);
  const beta = cfg.controller.value;
  const kld = new Float64Array(bs * T),
    rewards = new Float64Array(bs * T);
  let sumRowMeans = 0;
  for (let i = 0; i < bs; i++) {
    let rowSum = 0,
      n = 0;
    for (let k = i * T, e = k + T; k < e; k++) {
      const d = kl[k] * M[k];
      kld[k] = d;
      rewards[k] = s[k] - beta * d;
      if (M[k] !== 0) {
        rowSum += d * M[k];
        n += M[k];
      }
    }
    sumRowMeans += rowSum / (n + 1e-8);
  }
  const currentKl = bs > 0 ? sumRowMeans / bs : 0;
  const like = input.token_level_scores.data;
  return {
    token_level_rewards: outTensor(like, rewards, bs, T),
    kld: outTensor(like, kld, bs, T),
    current_kl: currentKl,
    beta,
    metrics: { 'actor/reward_kl_penalty': currentKl, 'actor/reward_kl_penalty_coeff': beta },
    next_controller: cfg.controller.update(currentKl, bs),
  };
}

// ---- KL as a loss ------------------------------------------------------------------------------

export interface KlLossConfig {
  /** Estimator (`kl_loss_type`), default "low_var_kl". */
  kl_loss_type?: string;
  /** Weight of the KL term in the actor loss (`kl_loss_coef`), default 0.001. */
  kl_loss_coef?: number;
  loss_agg_mode?: string;
  global_batch_info?: GlobalBatchInfo;
}

export interface KlLossOutput {
  /** agg_loss(kl_penalty(log π, log π_ref), M). */
  kl_loss: number;
  /** kl_loss_coef · kl_loss: the term added to the policy loss. */
  weighted_loss: number;
  /** ∂(kl_loss_coef · kl_loss)/∂log π per token. */
  grad_log_prob: Tensor2D<Float64Array>;
  metrics: { 'actor/kl_loss': number; 'actor/kl_coef': number };
}

/**
 * KL as a loss (verl dp_actor, use_kl_loss): L_kl = agg_loss(kl_penalty(log π, log π_ref, kl_loss_type), M),
 * added to the policy loss as kl_loss_coef·L_kl.
 */
export function computeKlLoss(
  input: { log_prob: Tensor2D; ref_log_prob: Tensor2D; response_mask: Mask2D },
  cfg: KlLossConfig = {},
): KlLossOutput {
  if (!input || !input.log_prob) throw new ConfigError('kl_loss: log_prob is required');
  const { bs, T } = input.log_prob;
  const M = readMask('kl_loss: response_mask', input.response_mask, bs, T);
  const type = cfg.kl_loss_type ?? 'low_var_kl';
  const coef = checkScalar('kl_loss_coef', cfg.kl_loss_coef ?? 0.001);
  const agg = lossAggModes.get(cfg.loss_agg_mode ?? 'token-mean');
  const info = cfg.global_batch_info ?? {};
  const kl = asF64(klPenalty(input.log_prob, input.ref_log_prob, type).data);
  const g = asF64(klPenaltyGrad(input.log_prob, input.ref_log_prob, type).data);
  const klLoss = agg.value(kl, M, bs, T, info);
  const w = agg.weights(M, bs, T, info);
  const grad = new Float64Array(bs * T);
  for (let k = 0; k < grad.length; k++) grad[k] = w[k] === 0 ? 0 : coef * w[k] * g[k];
  return {
    kl_loss: klLoss,
    weighted_loss: coef * klLoss,
    grad_log_prob: { data: grad, bs, T },
    metrics: { 'actor/kl_loss': klLoss, 'actor/kl_coef': coef },
  };
}
