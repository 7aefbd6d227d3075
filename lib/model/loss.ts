/**
 * Training losses as graph functions of per-token tensors (verl core_algos semantics; see
 * ../shared/golden/README.md). Every loss is aggregated as Σ_t w_t · ℓ_t where the aggregation
 * weights w = ∂agg_loss/∂ℓ are computed outside the graph from the response mask, the mode and
 * the global-batch normalisers (lib/rl/agg.ts `weights`), so summing the losses of micro-batches
 * gives exactly the mini-batch loss (verl's global-batch semantics).
 *
 * Metrics leave the graph as additive sums (over micro-batches) and are finalised in JS:
 * fractions and ppo_kl become masked means Σ f·M / (ΣM + 1e-8) over the whole mini-batch.
 *
 * Some policy losses fix the aggregation of their policy-gradient term whatever `lossAggMode` says
 * (verl): gspo and sapo always seq-mean-token-mean, geo_mean a plain mean over sequences. Their
 * pg term then uses its own weights `pgAggWeights` (see `pgAggWeights`), while the entropy and KL
 * terms keep `lossAggMode`'s.
 *
 * clip_cov and kl_cov select tokens by the covariance of advantage and current log-prob over the
 * tokens of one graph run, i.e. per micro-batch, as verl's dp_actor (which calls the policy loss
 * per micro-batch): with micro-batches their loss differs from the whole mini-batch's.
 *
 * Registries (config strings): `policy_loss.loss_mode` (vanilla, gspo, sapo, gpg, cispo,
 * reinforce, geo_mean, clip_cov, kl_cov, nft), `kl_loss_type` (kl/k1, abs, mse/k2, low_var_kl/k3).
 */
import { z } from 'zod';
import { ConfigError } from '../errors.ts';
import { Registry } from '../util/registry.ts';
import { lossAggModes, type GlobalBatchInfo } from '../rl/agg.ts';
import type { GraphBuilder, Var } from '../onnx/builder.ts';
import type { Dim } from '../onnx/dims.ts';

export const MASKED_EPS = 1e-8;

/** The scalar input that carries a scheduled entropy bonus coefficient (policy loss `entropyCoeffInput`). */
export const ENTROPY_COEFF_INPUT = 'entropy_coeff';

const aggMode = z.enum(['token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean', 'seq-mean-token-sum-norm']);

export const policyLossSchema = z
  .object({
    type: z.literal('policy'),
    lossMode: z
      .string()
      .default('vanilla')
      .describe(
        'policy loss registry name (vanilla, gspo, sapo, gpg, cispo, reinforce, geo_mean, clip_cov, kl_cov, nft)',
      ),
    clipRatio: z.number().positive().default(0.2).describe('PPO clip ε (fallback for low/high)'),
    clipRatioLow: z.number().nonnegative().nullable().default(null).describe('ε_low; null = clipRatio'),
    clipRatioHigh: z.number().nonnegative().nullable().default(null).describe('ε_high; null = clipRatio'),
    clipRatioC: z.number().default(3.0).describe('dual-clip constant c (> 1)'),
    tauPos: z.number().positive().default(1.0).describe('SAPO gate temperature τ for tokens with A > 0'),
    tauNeg: z.number().positive().default(1.05).describe('SAPO gate temperature τ for tokens with A ≤ 0'),
    clipCovRatio: z
      .number()
      .positive()
      .default(0.0002)
      .describe('Clip-Cov: at most max(⌊ratio·ΣM⌋, 1) tokens per micro-batch get their gradient zeroed'),
    clipCovLb: z
      .number()
      .default(1.0)
      .describe('Clip-Cov: lower bound (exclusive) of the covariance of a token that may be zeroed'),
    clipCovUb: z.number().default(5.0).describe('Clip-Cov: upper bound (exclusive) of that covariance'),
    klCovRatio: z
      .number()
      .positive()
      .default(0.0002)
      .describe('KL-Cov: the max(⌊ratio·n_valid⌋, 1) tokens of largest covariance per micro-batch get the KL penalty'),
    ppoKlCoef: z
      .number()
      .default(0.1)
      .describe('KL-Cov: coefficient of the |log π − log π_old| penalty on the selected tokens'),
    lossAggMode: aggMode.default('token-mean').describe('verl loss_agg_mode'),
    entropyCoeff: z.number().default(0).describe('entropy bonus coefficient'),
    entropyCoeffInput: z
      .boolean()
      .default(false)
      .describe(
        `the entropy bonus coefficient is the scalar graph input "${ENTROPY_COEFF_INPUT}" (a schedule, fed each step) instead of the constant entropyCoeff`,
      ),
    entropyPenaltyCoef: z
      .number()
      .default(0)
      .describe(
        'entropy penalty coefficient: adds coef · agg(−log π(token)) (the sampled-token entropy estimate; lib/rl entropyPenalty)',
      ),
    useKlLoss: z.boolean().default(false).describe('add a KL(π‖π_ref) loss term'),
    klLossCoef: z.number().nonnegative().default(0.001).describe('KL loss coefficient'),
    klLossType: z.string().default('low_var_kl').describe('kl_loss_type registry name'),
    temperature: z.number().positive().default(1).describe('logits are divided by this before log-probs (as in verl)'),
    nft: z
      .object({
        negWeight: z
          .number()
          .min(0)
          .default(1)
          .describe('1 = NFT, 0 = RFT (positives only); for the DAPO-like variant use lossMode vanilla'),
        clampNegative: z
          .number()
          .positive()
          .default(1)
          .describe('ε of the straight-through clamp max((1 − r̂R)/(1 − r̂), ε) on negatives'),
        clampPositive: z.number().min(0).default(0).describe('straight-through lower clamp of R on positives'),
        maxLogRatio: z.number().default(10).describe('upper clamp of the per-token log-ratio'),
        rHatMin: z.number().gt(0).lt(1).default(0.02).describe('lower clamp of the group accuracy r̂'),
        rHatMax: z.number().gt(0).lt(1).default(0.98).describe('upper clamp of r̂'),
        normalize: z.boolean().default(true).describe('weight every token by (1 − r̂)'),
        lossAggMode: z
          .enum(['sum', 'token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean', 'seq-mean-token-sum-norm'])
          .default('sum')
          .describe('"sum" = Σ tokens ÷ lossScaleFactor (the NFT objective), or a verl loss_agg_mode'),
        lossScaleFactor: z.number().positive().default(1).describe('divisor of the "sum" aggregation'),
      })
      .strict()
      .prefault({})
      .describe('NFT options (lossMode "nft")'),
  })
  .strict();

export const valueLossSchema = z
  .object({
    type: z.literal('value'),
    cliprangeValue: z.number().nonnegative().default(0.5).describe('value clip range'),
    lossAggMode: aggMode.default('token-mean').describe('verl loss_agg_mode'),
  })
  .strict();

export const sftLossSchema = z
  .object({
    type: z.literal('sft'),
    lossAggMode: aggMode.default('token-mean').describe('verl loss_agg_mode'),
    temperature: z.number().positive().default(1).describe('logits are divided by this before log-probs'),
  })
  .strict();

export const lossConfigSchema = z.discriminatedUnion('type', [policyLossSchema, valueLossSchema, sftLossSchema]);
export type LossConfigInput = z.input<typeof lossConfigSchema>;
export type LossConfig = z.output<typeof lossConfigSchema>;
export type PolicyLossConfig = z.output<typeof policyLossSchema>;
export type ValueLossConfig = z.output<typeof valueLossSchema>;

export function lossConfig(input: LossConfigInput): LossConfig {
  const r = lossConfigSchema.safeParse(input);
  if (!r.success)
    throw new ConfigError(
      `loss config: ${r.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ')}`,
    );
  const c = r.data;
  if (c.type === 'policy') {
    policyLossGraphs.get(c.lossMode);
    if (c.useKlLoss) klLossTypes.get(c.klLossType);
    if (c.lossMode === 'vanilla' && !(c.clipRatioC > 1))
      throw new ConfigError(`loss config: clipRatioC must be > 1 for dual clip, got ${c.clipRatioC}`);
  }
  return c;
}

/** Per-token graph inputs, all [N] (N = B·T, flattened) in the builder's float dtype. */
export interface TokenTensors {
  /** log π(token) under the current policy (differentiable). */
  logprob?: Var;
  /** entropy of π at the position (differentiable). */
  entropy?: Var | null;
  /** value prediction (differentiable; critic). */
  vpred?: Var;
  /** response mask M (0/1). */
  mask: Var;
  /** aggregation weights w = ∂agg_loss/∂ℓ (0 where M = 0). */
  aggWeights: Var;
  /** aggregation weights of the policy-gradient term when the loss fixes its own (`pgAggWeights`); default aggWeights. */
  pgAggWeights?: Var;
  /** the [B, T] row layout of the flat [N] tensors (sequence-level losses: gspo, geo_mean). */
  rowShape?: readonly [Dim, Dim];
  advantages?: Var;
  oldLogprobs?: Var;
  refLogprobs?: Var;
  /** per-token importance / filtering weights multiplied into the policy-gradient loss. */
  lossWeights?: Var;
  values?: Var;
  returns?: Var;
  /** clip_cov: each token's random priority (a permutation of 0..N−1, lib/rl clipCovPriorities); the lowest-priority candidates are zeroed. */
  clipCovPriority?: Var;
  /** NFT: the row's clamped group accuracy r̂, and 1 for a positive (correct) row, 0 otherwise. */
  nftRHat?: Var;
  nftPositive?: Var;
}

export interface LossGraph {
  /** The scalar to differentiate (this micro-batch's share of the mini-batch loss). */
  loss: Var;
  /** Additive scalar sums, finalised by `finalizeMetrics`. */
  sums: Record<string, Var>;
}

function need(t: TokenTensors, k: keyof TokenTensors, what: string): Var {
  const v = t[k];
  if (!v) throw new ConfigError(`${what} needs batch field "${k}"`);
  return v as Var;
}

/** Σ w·where(M≠0, ℓ, 0): masked positions never contribute, even when ℓ is not finite there. */
export function aggregate(b: GraphBuilder, perToken: Var, t: TokenTensors): Var {
  const m = b.greater(t.mask, 0);
  return b.reduceSum(b.mul(b.where(m, perToken, 0), t.aggWeights), [0]);
}

function maskedSum(b: GraphBuilder, x: Var, mask: Var): Var {
  return b.reduceSum(b.mul(b.where(b.greater(mask, 0), x, 0), mask), [0]);
}

function boolSum(b: GraphBuilder, cond: Var, mask: Var): Var {
  return maskedSum(b, b.cast(cond, mask.dtype), mask);
}

// ─────────────────────────── policy losses (per token) ───────────────────────────

export interface PolicyLossFn {
  (b: GraphBuilder, t: TokenTensors, c: PolicyLossConfig): { perToken: Var; sums: Record<string, Var> };
}

/**
 * Vanilla PPO (Schulman et al. 2017) with asymmetric clip and dual clip (Ye et al. 2020):
 * ℓ = clamp(lp − old, ±20), r = eˣ; L1 = −A r, L2 = −A clamp(r, 1−ε_lo, 1+ε_hi); Lc = max(L1, L2);
 * L3 = −A c; loss = min(L3, Lc) where A < 0, else Lc; × loss weights.
 */
const vanilla: PolicyLossFn = (b, t, c) => {
  const lp = need(t, 'logprob', 'vanilla PPO'),
    old = need(t, 'oldLogprobs', 'vanilla PPO'),
    A = need(t, 'advantages', 'vanilla PPO');
  const lo = c.clipRatioLow ?? c.clipRatio,
    hi = c.clipRatioHigh ?? c.clipRatio;
  const logRatio = b.clip(b.sub(lp, old), -20, 20);
  const ratio = b.exp(logRatio);
  const negA = b.neg(A);
  const l1 = b.mul(negA, ratio);
  const l2 = b.mul(negA, b.clip(ratio, 1 - lo, 1 + hi));
  const lc = b.max(l1, l2);
  const l3 = b.mul(negA, c.clipRatioC);
  const lc2 = b.min(l3, lc);
  const aNeg = b.less(A, 0);
  let perToken = b.where(aNeg, lc2, lc);
  if (t.lossWeights) perToken = b.mul(perToken, t.lossWeights);
  return {
    perToken,
    sums: {
      pg_clipfrac: boolSum(b, b.greater(l2, l1), t.mask),
      pg_clipfrac_lower: boolSum(b, b.and(b.greater(lc, l3), aNeg), t.mask),
      ppo_kl: maskedSum(b, b.neg(logRatio), t.mask),
    },
  };
};

/** GPG (Chu et al. 2025): −lp·A (× loss weights). */
const gpg: PolicyLossFn = (b, t) => {
  let perToken = b.neg(b.mul(need(t, 'logprob', 'gpg'), need(t, 'advantages', 'gpg')));
  if (t.lossWeights) perToken = b.mul(perToken, t.lossWeights);
  return { perToken, sums: {} };
};

/** REINFORCE: −A·lp (× loss weights); ppo_kl = masked_mean(old − lp). */
const reinforce: PolicyLossFn = (b, t) => {
  const lp = need(t, 'logprob', 'reinforce');
  let perToken = b.neg(b.mul(need(t, 'advantages', 'reinforce'), lp));
  if (t.lossWeights) perToken = b.mul(perToken, t.lossWeights);
  const sums: Record<string, Var> = {};
  if (t.oldLogprobs) sums.ppo_kl = maskedSum(b, b.sub(t.oldLogprobs, lp), t.mask);
  return { perToken, sums };
};

/** The flat [N] tensor x as [B, T] rows. */
function rows(b: GraphBuilder, t: TokenTensors, x: Var, what: string): Var {
  if (!t.rowShape)
    throw new ConfigError(
      `${what} is a sequence-level loss and needs the batch's [B, T] row layout (TokenTensors.rowShape)`,
    );
  return b.reshape(x, t.rowShape);
}

/** Σ_t x·M per row, [B, 1] (masked positions never contribute, even when x is not finite there). */
function rowMaskedSum(b: GraphBuilder, x2: Var, m2: Var): Var {
  return b.reduceSum(b.mul(b.where(b.greater(m2, 0), x2, 0), m2), [1], true);
}

/**
 * GSPO (Zheng et al. 2025, arXiv 2507.18071; verl compute_policy_loss_gspo), matched to lib/rl:
 * ℓ = lp − old [B, T]; s_i = sg(Σ_t ℓ·M / max(ΣM, 1)) [B, 1]; log s_i,t = lp − sg(lp) + s_i
 * (value s_i, gradient 1 per token), clamped above at 10; r = e^{log s}; L1 = −A r,
 * L2 = −A clip(r, 1−ε_lo, 1+ε_hi); loss = max(L1, L2) (no dual clip) × loss weights. The pg term is
 * always aggregated seq-mean-token-mean. ppo_kl = mean(−ℓ) (unclamped); pg_clipfrac_lower = 0.
 */
const gspo: PolicyLossFn = (b, t, c) => {
  const lp = need(t, 'logprob', 'gspo'),
    old = need(t, 'oldLogprobs', 'gspo'),
    A = need(t, 'advantages', 'gspo');
  const lo = c.clipRatioLow ?? c.clipRatio,
    hi = c.clipRatioHigh ?? c.clipRatio;
  const logRatio = b.sub(lp, old);
  const m2 = rows(b, t, t.mask, 'gspo');
  const seqLen = b.max(b.reduceSum(m2, [1], true), 1);
  const seqLog = b.stopGradient(b.div(rowMaskedSum(b, rows(b, t, logRatio, 'gspo'), m2), seqLen));
  const lp2 = rows(b, t, lp, 'gspo');
  const tokenSeqLog = b.reshape(b.add(b.sub(lp2, b.stopGradient(lp2)), seqLog), t.mask.shape);
  const ratio = b.exp(b.clip(tokenSeqLog, undefined, 10));
  const negA = b.neg(A);
  const l1 = b.mul(negA, ratio);
  const l2 = b.mul(negA, b.clip(ratio, 1 - lo, 1 + hi));
  let perToken = b.max(l1, l2);
  if (t.lossWeights) perToken = b.mul(perToken, t.lossWeights);
  return {
    perToken,
    sums: {
      pg_clipfrac: boolSum(b, b.greater(l2, l1), t.mask),
      pg_clipfrac_lower: b.const(0, t.mask.dtype),
      ppo_kl: maskedSum(b, b.neg(logRatio), t.mask),
    },
  };
};

/**
 * SAPO, soft adaptive policy optimization (verl compute_policy_loss_sapo), matched to lib/rl:
 * ℓ = clamp(lp − old, ±20), r = eˡ; τ = τ_pos where A > 0 else τ_neg; gate = σ(τ(r − 1))·4/τ;
 * loss = −gate·A × loss weights. The pg term is always aggregated seq-mean-token-mean; both clip
 * fractions are 0.
 */
const sapo: PolicyLossFn = (b, t, c) => {
  const lp = need(t, 'logprob', 'sapo'),
    old = need(t, 'oldLogprobs', 'sapo'),
    A = need(t, 'advantages', 'sapo');
  const logRatio = b.clip(b.sub(lp, old), -20, 20);
  const ratio = b.exp(logRatio);
  const gate = (tau: number) => b.mul(b.sigmoid(b.mul(b.sub(ratio, 1), tau)), 4 / tau);
  let perToken = b.neg(b.mul(b.where(b.greater(A, 0), gate(c.tauPos), gate(c.tauNeg)), A));
  if (t.lossWeights) perToken = b.mul(perToken, t.lossWeights);
  const zero = b.const(0, t.mask.dtype);
  return {
    perToken,
    sums: { pg_clipfrac: zero, pg_clipfrac_lower: zero, ppo_kl: maskedSum(b, b.neg(logRatio), t.mask) },
  };
};

/**
 * CISPO (MiniMax-M1, arXiv 2506.13585; verl compute_policy_loss_cispo), matched to lib/rl:
 * ℓ = clamp(lp − old, ±20), r = eˡ; loss = −sg(clip(r, 1−ε_lo, 1+ε_hi))·A·lp × loss weights
 * (gradient −sg(clip(r))·A per token). pg_clipfrac = mean[r outside the clip range]; ppo_kl = mean(−ℓ).
 */
const cispo: PolicyLossFn = (b, t, c) => {
  const lp = need(t, 'logprob', 'cispo'),
    old = need(t, 'oldLogprobs', 'cispo'),
    A = need(t, 'advantages', 'cispo');
  const lo = c.clipRatioLow ?? c.clipRatio,
    hi = c.clipRatioHigh ?? c.clipRatio;
  const logRatio = b.clip(b.sub(lp, old), -20, 20);
  const ratio = b.exp(logRatio);
  const clipped = b.stopGradient(b.clip(ratio, 1 - lo, 1 + hi));
  let perToken = b.neg(b.mul(b.mul(clipped, A), lp));
  if (t.lossWeights) perToken = b.mul(perToken, t.lossWeights);
  return {
    perToken,
    sums: {
      pg_clipfrac: boolSum(b, b.or(b.less(ratio, 1 - lo), b.greater(ratio, 1 + hi)), t.mask),
      pg_clipfrac_lower: b.const(0, t.mask.dtype),
      ppo_kl: maskedSum(b, b.neg(logRatio), t.mask),
    },
  };
};

/**
 * GMPO, geometric-mean policy optimization (Zhao et al. 2025, arXiv 2507.20673; verl
 * compute_policy_loss_geo_mean), matched to lib/rl: ℓ = lp − old (unclamped) [B, T];
 * m = sgn(A)·min(sgn(A)·ℓ, sgn(A)·clamp(ℓ, −ε_lo, ε_hi)); n_i = ΣM;
 * ratio_i = exp(Σ m·M / (n_i + 1e-8)), Ā_i = Σ A·M / (n_i + 1e-8) [B, 1];
 * row_i = −Ā_i·ratio_i (× exp(Σ log(w + 1e-10)·M / (n_i + 1e-8)), the geometric mean of the loss
 * weights); every token of row i carries row_i, and the pg weights (M / (n_i·B_total)) make the pg
 * term the plain mean over the mini-batch's sequences. pg_clipfrac / _lower = mean[ℓ clamped ∧ A ≷ 0].
 */
const geoMean: PolicyLossFn = (b, t, c) => {
  const lp = need(t, 'logprob', 'geo_mean'),
    old = need(t, 'oldLogprobs', 'geo_mean'),
    A = need(t, 'advantages', 'geo_mean');
  const lo = c.clipRatioLow ?? c.clipRatio,
    hi = c.clipRatioHigh ?? c.clipRatio;
  const logRatio = b.sub(lp, old);
  const clamped = b.clip(logRatio, -lo, hi);
  const sgn = b.sign(A);
  const m = b.mul(sgn, b.min(b.mul(sgn, logRatio), b.mul(sgn, clamped)));
  const m2 = rows(b, t, t.mask, 'geo_mean');
  const denom = b.add(b.reduceSum(m2, [1], true), 1e-8);
  const ratio = b.exp(b.div(rowMaskedSum(b, rows(b, t, m, 'geo_mean'), m2), denom));
  const aBar = b.div(rowMaskedSum(b, rows(b, t, A, 'geo_mean'), m2), denom);
  let row = b.neg(b.mul(aBar, ratio));
  if (t.lossWeights)
    row = b.mul(
      row,
      b.exp(b.div(rowMaskedSum(b, rows(b, t, b.log(b.add(t.lossWeights, 1e-10)), 'geo_mean'), m2), denom)),
    );
  const perToken = b.reshape(b.expand(row, m2.shape), t.mask.shape);
  const isClipped = b.not(b.equal(logRatio, clamped));
  return {
    perToken,
    sums: {
      pg_clipfrac: boolSum(b, b.and(isClipped, b.greater(A, 0)), t.mask),
      pg_clipfrac_lower: boolSum(b, b.and(isClipped, b.less(A, 0)), t.mask),
      ppo_kl: maskedSum(b, b.neg(logRatio), t.mask),
    },
  };
};

/**
 * NFT, negative-aware fine-tuning (Chen et al. 2025; NVlabs/NFT, ratio_type "token"), matched to
 * lib/rl/nft.ts: R = exp(min(lp − old, max_log_ratio)); positives −log max(R, c₊); negatives
 * neg_weight · −log max((1 − r̂R)/(1 − r̂), ε); both clamps straight-through (the forward value
 * is clamped, the gradient is the unclamped one); every token × (1 − r̂) when normalize, × loss
 * weights.
 */
const nft: PolicyLossFn = (b, t, c) => {
  const o = c.nft;
  const old = need(t, 'oldLogprobs', 'nft'),
    rhat = need(t, 'nftRHat', 'nft'),
    pos = need(t, 'nftPositive', 'nft');
  // masked positions (padding) get ratio 1: their target is often a token the sampling mask removes
  // (log-prob ≈ −1e9), and R = 0 there makes −log R infinite, which 0 · ∞ turns into a NaN loss and gradient
  const lp = b.where(b.greater(t.mask, 0), need(t, 'logprob', 'nft'), old);
  const logRatio = b.sub(lp, old);
  const R = b.exp(b.min(logRatio, o.maxLogRatio));
  const straightThrough = (x: Var, lo: number) => b.add(x, b.stopGradient(b.sub(b.max(x, lo), x)));
  const lossPos = b.neg(b.log(o.clampPositive > 0 ? straightThrough(R, o.clampPositive) : R));
  const proxy = b.div(b.sub(1, b.mul(rhat, R)), b.sub(1, rhat));
  const lossNeg = b.mul(b.neg(b.log(straightThrough(proxy, o.clampNegative))), o.negWeight);
  let perToken = b.where(b.greater(pos, 0), lossPos, lossNeg);
  if (o.normalize) perToken = b.mul(perToken, b.sub(1, rhat));
  if (t.lossWeights) perToken = b.mul(perToken, t.lossWeights);
  const negMask = b.mul(t.mask, b.sub(1, pos));
  return {
    perToken,
    sums: {
      ppo_kl: maskedSum(b, b.neg(logRatio), t.mask),
      nft_neg_tokens: b.reduceSum(negMask, [0]),
      nft_neg_clamped: b.reduceSum(b.mul(negMask, b.cast(b.less(proxy, o.clampNegative), negMask.dtype)), [0]),
    },
  };
};

/**
 * bool [N]: x_i is among the k largest (`largest`) or smallest values of x [N], ties to the lower
 * index (ONNX TopK's rule, = lib/rl's stable sort); k is int64 [1] with 1 ≤ k ≤ N. No gradient.
 */
function topKMask(b: GraphBuilder, x: Var, k: Var, largest: boolean): Var {
  const K = b.unknownDim();
  const [, idx] = b.op('TopK', [x, k], { axis: 0, largest: largest ? 1 : 0, sorted: 1 }, [
    { dtype: x.dtype, shape: [K] },
    { dtype: 'int64', shape: [K] },
  ]);
  const ones = b.op('Expand', [b.const(1, x.dtype), b.shape(idx)], {}, { dtype: x.dtype, shape: [K] });
  return b.greater(
    b.op('ScatterElements', [b.zerosLike(x), idx, ones], { axis: 0 }, { dtype: x.dtype, shape: x.shape }),
    0,
  );
}

/**
 * int64 [1]: min(max(⌊count·ratio⌋, 1), N) for the [N] vector x; the product is taken in float64
 * as lib/rl does in JS (count is an exact integer, so the floor agrees bit for bit).
 */
function selectCount(b: GraphBuilder, count: Var, ratio: number, x: Var): Var {
  const prod = b.mul(b.cast(b.stopGradient(count), 'float64'), ratio);
  const k = b.max(b.op('Floor', [prod], {}, { dtype: 'float64', shape: prod.shape }), 1);
  return b.op('Min', [b.reshape(b.cast(k, 'int64'), [1]), b.shape(x)], {}, { dtype: 'int64', shape: [1] });
}

/**
 * Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617;
 * verl compute_policy_loss_clip_cov), matched to lib/rl: ℓ = lp − old (unclamped), r = eˡ,
 * L1 = −A r, L2 = −A clip(r, 1−ε_lo, 1+ε_hi) [N]; cov = (A − Ā)(sg(lp) − l̄p) with masked means
 * Σx·M/(ΣM + 1e-8) over this run's tokens; candidates: M > 0, ¬(L2 > L1), lb < cov < ub; the
 * max(⌊ratio·ΣM⌋, 1) candidates of lowest priority (clipCovPriority, all candidates when fewer)
 * get corr = 0; loss = max(L1, L2)·corr × loss weights. pg_clipfrac = mean[corr = 0].
 */
const clipCov: PolicyLossFn = (b, t, c) => {
  const lp = need(t, 'logprob', 'clip_cov'),
    old = need(t, 'oldLogprobs', 'clip_cov'),
    A = need(t, 'advantages', 'clip_cov');
  const prio = need(t, 'clipCovPriority', 'clip_cov');
  const lo = c.clipRatioLow ?? c.clipRatio,
    hi = c.clipRatioHigh ?? c.clipRatio;
  const logRatio = b.sub(lp, old);
  const ratio = b.exp(logRatio);
  const negA = b.neg(A);
  const l1 = b.mul(negA, ratio);
  const l2 = b.mul(negA, b.clip(ratio, 1 - lo, 1 + hi));
  const M = t.mask,
    lpd = b.stopGradient(lp);
  const mSum = b.reduceSum(b.where(b.equal(M, 0), 0, M), [0]);
  const denom = b.add(mSum, MASKED_EPS);
  const cov = b.mul(b.sub(A, b.div(maskedSum(b, A, M), denom)), b.sub(lpd, b.div(maskedSum(b, lpd, M), denom)));
  const cand = b.and(
    b.and(b.greater(M, 0), b.not(b.greater(l2, l1))),
    b.and(b.greater(cov, c.clipCovLb), b.less(cov, c.clipCovUb)),
  );
  const candPrio = b.where(cand, b.stopGradient(prio), Infinity);
  const zeroed = b.and(cand, topKMask(b, candPrio, selectCount(b, mSum, c.clipCovRatio, candPrio), false));
  let perToken = b.where(zeroed, 0, b.max(l1, l2));
  if (t.lossWeights) perToken = b.mul(perToken, t.lossWeights);
  return { perToken, sums: { pg_clipfrac: boolSum(b, zeroed, M), ppo_kl: maskedSum(b, b.neg(logRatio), M) } };
};

/**
 * KL-Cov (Cui et al. 2025, arXiv 2505.22617; verl compute_policy_loss_kl_cov), matched to lib/rl:
 * ℓ = lp − old (unclamped), r = eˡ; over the valid tokens (M > 0) of this run,
 * cov = (A − Ā)(sg(lp) − l̄p) with plain means; the k = max(⌊ratio·n_valid⌋, 1) valid tokens of
 * largest cov (ties to the lower row-major index) get loss −A r + coef·|ℓ|, the others −A r
 * (no clipping) × loss weights. ppo_kl = mean |ℓ|.
 */
const klCov: PolicyLossFn = (b, t, c) => {
  const lp = need(t, 'logprob', 'kl_cov'),
    old = need(t, 'oldLogprobs', 'kl_cov'),
    A = need(t, 'advantages', 'kl_cov');
  const logRatio = b.sub(lp, old);
  const absKl = b.abs(logRatio);
  const M = t.mask,
    lpd = b.stopGradient(lp);
  const valid = b.greater(M, 0);
  const nValid = b.reduceSum(b.cast(valid, M.dtype), [0]);
  const mean = (x: Var) => b.div(b.reduceSum(b.where(valid, x, 0), [0]), nValid);
  // n_valid = 0: cov is NaN everywhere, but every token is then −∞ and none is selected
  const cov = b.where(valid, b.mul(b.sub(A, mean(A)), b.sub(lpd, mean(lpd))), -Infinity);
  const selected = b.and(valid, topKMask(b, cov, selectCount(b, nValid, c.klCovRatio, cov), true));
  let perToken = b.neg(b.mul(A, b.exp(logRatio)));
  perToken = b.add(perToken, b.where(selected, b.mul(absKl, c.ppoKlCoef), 0));
  if (t.lossWeights) perToken = b.mul(perToken, t.lossWeights);
  return { perToken, sums: { ppo_kl: maskedSum(b, absKl, M) } };
};

const POLICY_LOSS_GRAPHS = {
  vanilla,
  gspo,
  sapo,
  gpg,
  cispo,
  reinforce,
  geo_mean: geoMean,
  clip_cov: clipCov,
  kl_cov: klCov,
  nft,
};
/** The policy losses of the training graph by name (algorithm.policy_loss; lib/rl/policy-loss-registry.ts is the reference). */
export const policyLossGraphs = new Registry<PolicyLossFn>('policy_loss.loss_mode', POLICY_LOSS_GRAPHS);
export type PolicyLossName = keyof typeof POLICY_LOSS_GRAPHS;
/** The names algorithm.policy_loss accepts: the training graph's losses. */
export const POLICY_LOSS_NAMES = Object.keys(POLICY_LOSS_GRAPHS) as [PolicyLossName, ...PolicyLossName[]];

/**
 * The aggregation a policy loss fixes for its pg term whatever lossAggMode says (verl): gspo and
 * sapo seq-mean-token-mean, geo_mean "seq-mean" (a plain mean over all sequences, empty ones
 * included); null = lossAggMode.
 */
export function fixedPgAggMode(c: PolicyLossConfig): 'seq-mean-token-mean' | 'seq-mean' | null {
  if (c.lossMode === 'gspo' || c.lossMode === 'sapo') return 'seq-mean-token-mean';
  if (c.lossMode === 'geo_mean') return 'seq-mean';
  return null;
}

/**
 * Aggregation weights [B·T] of the pg term when the loss fixes an aggregation other than
 * lossAggMode (null: the pg term uses aggWeights). M is the whole mini-batch's [B, T] loss mask;
 * "seq-mean" weights are M / (ΣM_i · B), so Σ_t w·row_i = row_i / B for every non-empty row
 * (an empty row's value is 0 in geo_mean).
 */
export function pgAggWeights(
  c: PolicyLossConfig,
  M: Float64Array,
  B: number,
  T: number,
  info: GlobalBatchInfo,
): Float64Array | null {
  const mode = fixedPgAggMode(c);
  if (mode === null || mode === c.lossAggMode) return null;
  if (mode === 'seq-mean-token-mean') return lossAggModes.get(mode).weights(M, B, T, info);
  const w = new Float64Array(B * T);
  for (let i = 0; i < B; i++) {
    let n = 0;
    for (let k = i * T; k < (i + 1) * T; k++) n += M[k];
    if (n > 0) for (let k = i * T; k < (i + 1) * T; k++) w[k] = M[k] / n / B;
  }
  return w;
}

/** Which per-token batch fields a policy loss reads (besides log-probs and masks). */
export function policyLossNeeds(c: PolicyLossConfig): {
  advantages: boolean;
  oldLogprobs: boolean;
  nft: boolean;
  pgAggWeights: boolean;
  clipCovPriority: boolean;
} {
  const fixed = fixedPgAggMode(c);
  return {
    advantages: c.lossMode !== 'nft',
    oldLogprobs: true,
    nft: c.lossMode === 'nft',
    pgAggWeights: fixed !== null && fixed !== c.lossAggMode,
    clipCovPriority: c.lossMode === 'clip_cov',
  };
}

// ─────────────────────────── KL loss estimators ───────────────────────────

export type KlFn = (b: GraphBuilder, lp: Var, ref: Var) => Var;
/** k1 = lp − ref; abs = |lp − ref|; k2 = ½(lp − ref)²; k3 = clamp(eˣ − x − 1, ±10), x = clamp(ref − lp, ±20) (Schulman 2020). */
const k1: KlFn = (b, lp, ref) => b.sub(lp, ref);
const absKl: KlFn = (b, lp, ref) => b.abs(b.sub(lp, ref));
const k2: KlFn = (b, lp, ref) => {
  const d = b.sub(lp, ref);
  return b.mul(b.mul(d, d), 0.5);
};
const k3: KlFn = (b, lp, ref) => {
  const x = b.clip(b.sub(ref, lp), -20, 20);
  return b.clip(b.sub(b.sub(b.exp(x), x), 1), -10, 10);
};
export const klLossTypes = new Registry<KlFn>('kl_loss_type', {
  kl: k1,
  k1,
  abs: absKl,
  mse: k2,
  k2,
  low_var_kl: k3,
  k3,
});

// ─────────────────────────── full losses ───────────────────────────

/** Actor loss: pg_loss − entropy_coeff·entropy + kl_coef·kl_loss (verl dp_actor) + entropy_penalty_coef·agg(−log π). */
export function policyLossGraph(b: GraphBuilder, t: TokenTensors, c: PolicyLossConfig): LossGraph {
  return b.scope('loss', () => {
    const { perToken, sums } = policyLossGraphs.get(c.lossMode)(b, t, c);
    const pgLoss = aggregate(b, perToken, t.pgAggWeights ? { ...t, aggWeights: t.pgAggWeights } : t);
    let loss = pgLoss;
    const out: Record<string, Var> = { pg_loss: pgLoss, ...sums };
    if (t.entropy) {
      const ent = aggregate(b, t.entropy, t);
      out.entropy = ent;
      if (c.entropyCoeffInput) loss = b.sub(loss, b.mul(ent, b.input(ENTROPY_COEFF_INPUT, b.float, [])));
      else if (c.entropyCoeff !== 0) loss = b.sub(loss, b.mul(ent, c.entropyCoeff));
    }
    if (c.useKlLoss) {
      const kl = aggregate(
        b,
        klLossTypes.get(c.klLossType)(b, need(t, 'logprob', 'KL loss'), need(t, 'refLogprobs', 'KL loss')),
        t,
      );
      out.kl_loss = kl;
      loss = b.add(loss, b.mul(kl, c.klLossCoef));
    }
    if (c.entropyPenaltyCoef !== 0) {
      // the sampled-token entropy estimate agg(−log π), in the configured aggregation (lib/rl/shaping.ts entropyPenalty)
      const pen = b.mul(aggregate(b, b.neg(need(t, 'logprob', 'entropy penalty')), t), c.entropyPenaltyCoef);
      out.entropy_penalty = pen;
      loss = b.add(loss, pen);
    }
    out.loss = loss;
    return { loss, sums: out };
  });
}

/** Critic loss: ½·agg(max((v − R)², (clip(v, V ± c) − R)²)) (verl compute_value_loss). */
export function valueLossGraph(b: GraphBuilder, t: TokenTensors, c: ValueLossConfig): LossGraph {
  return b.scope('loss', () => {
    const v = need(t, 'vpred', 'value loss'),
      R = need(t, 'returns', 'value loss'),
      V = need(t, 'values', 'value loss');
    const clipped = b.max(b.min(v, b.add(V, c.cliprangeValue)), b.sub(V, c.cliprangeValue));
    const d1 = b.sub(v, R),
      d2 = b.sub(clipped, R);
    const l1 = b.mul(d1, d1),
      l2 = b.mul(d2, d2);
    const vf = b.mul(aggregate(b, b.max(l1, l2), t), 0.5);
    return {
      loss: vf,
      sums: {
        vf_loss: vf,
        vf_clipfrac: boolSum(b, b.greater(l2, l1), t.mask),
        vpred_mean: maskedSum(b, v, t.mask),
        loss: vf,
      },
    };
  });
}

/** Supervised cross-entropy −agg(lp) with token accuracy (argmax = target) as a metric. */
export function sftLossGraph(b: GraphBuilder, t: TokenTensors, correct: Var | null): LossGraph {
  return b.scope('loss', () => {
    const loss = aggregate(b, b.neg(need(t, 'logprob', 'sft loss')), t);
    const sums: Record<string, Var> = { sft_loss: loss, loss };
    if (correct) sums.token_acc = boolSum(b, correct, t.mask);
    return { loss, sums };
  });
}

/** Metrics that are masked means (Σ f·M over the mini-batch, divided by ΣM + 1e-8 in JS). */
const MASKED_MEAN_METRICS = new Set([
  'pg_clipfrac',
  'pg_clipfrac_lower',
  'ppo_kl',
  'vf_clipfrac',
  'vpred_mean',
  'token_acc',
]);

/** Turn additive sums (over micro-batches) into metrics. */
export function finalizeMetrics(sums: Record<string, number>, maskSum: number): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(sums)) out[k] = MASKED_MEAN_METRICS.has(k) ? v / (maskSum + MASKED_EPS) : v;
  if ('nft_neg_tokens' in sums) {
    out.neg_clamp_frac = sums.nft_neg_clamped / (sums.nft_neg_tokens + MASKED_EPS);
    delete out.nft_neg_tokens;
    delete out.nft_neg_clamped;
  }
  return out;
}
