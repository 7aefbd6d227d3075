/**
 * Advantage estimators (verl core_algos.compute_*_advantage), registry `adv_estimator`.
 *
 * Every estimator takes an `AdvantageInput` (the tensors it needs; the others may be absent) and an
 * `AdvantageConfig`, and returns `{ advantages, returns }` of shape (bs, T) in the dtype of
 * `token_level_rewards`. Shared conventions (verl):
 *  - outcome estimators score a sequence with s_i = Σ_t r_it over ALL T positions (the mask is not
 *    applied to the score) and broadcast the per-sequence result as adv_i·M_it; their `returns` is
 *    the same tensor as `advantages`;
 *  - group labels (`index`) are arbitrary and groups may be interleaved.
 *
 * Float32 leaks reproduced from the reference: the GRPO singleton divisor float32(1 + ε) (also in
 * float64 runs), the GPG scale α = float32(float32(1/m)·bs) and grpo_vectorized's float32 group
 * statistics. For float32 inputs the estimators follow torch's float32 arithmetic (scores, group
 * means and sums in torch's reduction order — see f32.ts —, the GAE and REINFORCE++ recursions,
 * whitening), so exact zeros (identical-score groups, tiny-variance groups) and the numbers match
 * the reference, not only to tolerance.
 */
import { ConfigError } from '../errors.ts';
import { Registry } from './registry.ts';
import {
  checkScalar,
  groupRows,
  outTensor,
  readMask,
  readTensor,
  readVector,
  type FloatArray,
  type GroupLabel,
  type Mask2D,
  type Tensor2D,
} from './tensor.ts';
import { rawMaskedWhiten } from './masked.ts';
import { torchMeanF32, torchSumF32 } from './f32.ts';

export interface AdvantageInput<A extends FloatArray = FloatArray> {
  /** (bs, T) per-token rewards (outcome rewards sit on the last valid token). */
  token_level_rewards: Tensor2D<A>;
  /** (bs, T) 1 = response token, 0 = padding or observation/tool token. */
  response_mask: Mask2D;
  /** (bs,) group labels (verl `uid`): required by the group estimators. */
  index?: readonly GroupLabel[];
  /** (bs, T) critic values: required by gae. */
  values?: Tensor2D;
  /** (bs,) reward of the greedy rollout: required by remax. */
  reward_baselines?: ArrayLike<number>;
  /** (bs, T) rollout log-probs: required by the optimal-token-baseline estimators. */
  old_log_probs?: Tensor2D;
  /** (bs, T) Σ_v π_v² per position: required by the optimal-token-baseline estimators. */
  sum_pi_squared?: Tensor2D;
  /** (bs, T) truncated importance weights (optional, OTB only). */
  rollout_is_weights?: Tensor2D | null;
}

export interface AdvantageConfig {
  /** Discount γ (gae, reinforce_plus_plus). Default 1.0. */
  gamma?: number;
  /** GAE λ. Default 1.0. */
  lam?: number;
  /** ε added to the group std (grpo*, pass@k) or the OTB denominator. Default 1e-6 (OTB: 1e-8). */
  epsilon?: number;
  /** GRPO: divide by the group std (true) or not (false = Dr.GRPO). Default true. */
  norm_adv_by_std_in_grpo?: boolean;
  /**
   * GRPO: the group std's divisor, n − 1 (`unbiased`, verl) or n (`population`, Flow-GRPO's
   * np.std in flow_grpo/stat_tracking.py). Default unbiased.
   */
  group_std?: 'unbiased' | 'population';
  /** GPG normaliser f_norm. Default 1.0. */
  f_norm?: number;
  /** OTB: zero the baseline on the unique longest member's tail. Default true. */
  handle_zero_tail?: boolean;
}

export interface AdvantageOutput<A extends FloatArray = FloatArray> {
  advantages: Tensor2D<A>;
  returns: Tensor2D<A>;
}

export type AdvantageEstimator = <A extends FloatArray>(
  input: AdvantageInput<A>,
  config?: AdvantageConfig,
) => AdvantageOutput<A>;

// ---- shared helpers --------------------------------------------------------------------------

interface Base<A extends FloatArray> {
  /** token_level_rewards and response_mask as float64 (kernels see one array type). */
  R: Float64Array;
  M: Float64Array;
  bs: number;
  T: number;
  /** The caller's rewards array: outputs take its dtype. */
  like: A;
  /** float32 inputs: reproduce torch's float32 rounding where it decides the result's structure. */
  f32: boolean;
}

function base<A extends FloatArray>(name: string, input: AdvantageInput<A>): Base<A> {
  if (!input || !input.token_level_rewards)
    throw new ConfigError(`adv_estimator "${name}": token_level_rewards is required`);
  const { bs, T } = input.token_level_rewards;
  const R = readTensor(`${name}: token_level_rewards`, input.token_level_rewards, bs, T);
  const M = readMask(`${name}: response_mask`, input.response_mask, bs, T);
  const like = input.token_level_rewards.data;
  return { R, M, bs, T, like, f32: like instanceof Float32Array };
}

const id = (x: number) => x;

/** s_i = Σ_t r_it over all T positions (for float32 inputs: torch's float32 sum, bit-exact). */
function scoresOf(R: Float64Array, bs: number, T: number, f32: boolean): Float64Array {
  const s = new Float64Array(bs);
  for (let i = 0; i < bs; i++) {
    if (f32) {
      s[i] = torchSumF32(R, i * T, T);
      continue;
    }
    let acc = 0;
    for (let k = i * T, e = k + T; k < e; k++) acc += R[k];
    s[i] = acc;
  }
  return s;
}

/** adv_i · M_it as a (bs, T) tensor in the dtype of `like`; returns is the same tensor (verl). */
function outcome<A extends FloatArray>(
  like: A,
  adv: Float64Array,
  M: Float64Array,
  bs: number,
  T: number,
): AdvantageOutput<A> {
  const out = new Float64Array(bs * T);
  for (let i = 0; i < bs; i++) {
    const a = adv[i];
    for (let k = i * T, e = k + T; k < e; k++) out[k] = a * M[k];
  }
  const t = outTensor(like, out, bs, T);
  return { advantages: t, returns: t };
}

function eps(cfg: AdvantageConfig, dflt: number): number {
  return checkScalar('epsilon', cfg.epsilon ?? dflt, { min: 0 });
}

/** The group's values in batch order (torch.stack of the group's 0-dim scores). */
function gather(s: Float64Array, order: Int32Array, a: number, b: number): Float64Array {
  const out = new Float64Array(b - a);
  for (let j = a; j < b; j++) out[j - a] = s[order[j]];
  return out;
}

/** Mean of the group's scores (torch.mean; float32 accumulation order for float32 inputs). */
function groupMean(s: Float64Array, order: Int32Array, a: number, b: number, f32: boolean): number {
  if (f32) return torchMeanF32(gather(s, order, a, b));
  let acc = 0;
  for (let j = a; j < b; j++) acc += s[order[j]];
  return acc / (b - a);
}

/**
 * Unbiased std (torch.std, N−1): torch takes the mean with torch.mean (float32 for float32 input),
 * accumulates Σ(x − mean)² in double and rounds the result to the input dtype.
 */
function groupStd(s: Float64Array, order: Int32Array, a: number, b: number, f32: boolean, population = false): number {
  const n = b - a;
  const mean = groupMean(s, order, a, b, f32);
  let v = 0;
  for (let j = a; j < b; j++) {
    const d = s[order[j]] - mean;
    v += d * d;
  }
  const std = Math.sqrt(v / (population ? n : n - 1));
  return f32 ? Math.fround(std) : std;
}

// ---- GAE ---------------------------------------------------------------------------------------

/**
 * GAE (Schulman et al. 2016, arXiv 1506.02438; verl compute_gae_advantage_return):
 * δ_t = r_t + γ·V_next − V_t, A_t = δ_t + γλ·A_next, run backwards; where M_t = 0 the running
 * V_next and A_next carry over unchanged (observation tokens are skipped, masked positions hold the
 * carried value). returns = A + V (not whitened); advantages = masked_whiten(A, M) over the batch.
 */
export const computeGaeAdvantageReturn: AdvantageEstimator = (input, cfg = {}) => {
  const { R, M, bs, T, like, f32 } = base('gae', input);
  const V = readTensor('gae: values', input.values, bs, T);
  const gamma = checkScalar('gamma', cfg.gamma ?? 1.0);
  const lam = checkScalar('lam', cfg.lam ?? 1.0);
  const adv = new Float64Array(bs * T);
  if (f32) {
    // float32 recursion, op by op as the reference (python scalars are cast to float32)
    const fr = Math.fround,
      g32 = fr(gamma),
      gl32 = fr(gamma * lam);
    for (let i = 0; i < bs; i++) {
      let nextValue = 0,
        lastGae = 0;
      for (let t = T - 1; t >= 0; t--) {
        const k = i * T + t;
        const v = V[k],
          m = M[k],
          om = fr(1 - m);
        const delta = fr(fr(R[k] + fr(g32 * nextValue)) - v);
        const g = fr(delta + fr(gl32 * lastGae));
        nextValue = fr(fr(v * m) + fr(om * nextValue));
        lastGae = fr(fr(g * m) + fr(om * lastGae));
        adv[k] = lastGae;
      }
    }
  } else {
    const gl = gamma * lam;
    for (let i = 0; i < bs; i++) {
      let nextValue = 0,
        lastGae = 0;
      for (let t = T - 1; t >= 0; t--) {
        const k = i * T + t;
        const v = V[k],
          m = M[k];
        const delta = R[k] + gamma * nextValue - v;
        const g = delta + gl * lastGae;
        nextValue = v * m + (1 - m) * nextValue;
        lastGae = g * m + (1 - m) * lastGae;
        adv[k] = lastGae;
      }
    }
  }
  const returns = new Float64Array(bs * T);
  for (let k = 0; k < bs * T; k++) returns[k] = f32 ? Math.fround(adv[k] + V[k]) : adv[k] + V[k];
  const advantages = new Float64Array(bs * T);
  rawMaskedWhiten(adv, M, advantages, true, f32);
  return { advantages: outTensor(like, advantages, bs, T), returns: outTensor(like, returns, bs, T) };
};

// ---- GRPO family -------------------------------------------------------------------------------

/**
 * GRPO (Shao et al. 2024, arXiv 2402.03300; verl compute_grpo_outcome_advantage):
 * A_i = (s_i − mean_g)/(std_g + ε) with the unbiased group std (group_std = population: divided by
 * n, as Flow-GRPO, Liu et al. 2025, arXiv 2505.05470), or s_i − mean_g when
 * norm_adv_by_std_in_grpo = false (Dr.GRPO, arXiv 2503.20783). A singleton group uses mean 0,
 * std 1 (divisor float32(1 + ε)); a group of identical scores gives 0.
 */
export const computeGrpoOutcomeAdvantage: AdvantageEstimator = (input, cfg = {}) => {
  const { R, M, bs, T, like, f32 } = base('grpo', input);
  const e = eps(cfg, 1e-6);
  const norm = cfg.norm_adv_by_std_in_grpo ?? true;
  const pop = cfg.group_std === 'population';
  const r = f32 ? Math.fround : id;
  const s = scoresOf(R, bs, T, f32);
  const { order, start, nGroups } = groupRows(input.index, bs, 'grpo: index');
  const adv = new Float64Array(bs);
  const singletonDivisor = Math.fround(1 + Math.fround(e));
  for (let g = 0; g < nGroups; g++) {
    const a = start[g],
      b = start[g + 1];
    let mean: number, divisor: number;
    if (b - a === 1) {
      mean = 0;
      divisor = singletonDivisor;
    } else {
      mean = groupMean(s, order, a, b, f32);
      divisor = f32
        ? Math.fround(groupStd(s, order, a, b, true, pop) + Math.fround(e))
        : groupStd(s, order, a, b, false, pop) + e;
    }
    for (let j = a; j < b; j++) {
      const i = order[j];
      const d = r(s[i] - mean);
      adv[i] = norm ? r(d / divisor) : d;
    }
  }
  return outcome(like, adv, M, bs, T);
};

/**
 * GRPO, vectorized variant (verl compute_grpo_vectorized_outcome_advantage + utils.groupwise):
 * statistics in float32; var = (Σs² − (Σs)²/n)/max(n−1, 1), σ = sqrt(max(var, ε)), then
 * (s − μ)/(σ + ε) — ε floors the variance inside the sqrt and is added again outside. Singletons
 * use μ = 0, σ = 1. Differs from `grpo` when var < ε.
 */
export const computeGrpoVectorizedOutcomeAdvantage: AdvantageEstimator = (input, cfg = {}) => {
  const { R, M, bs, T, like, f32 } = base('grpo_vectorized', input);
  const e = eps(cfg, 1e-6);
  const norm = cfg.norm_adv_by_std_in_grpo ?? true;
  const fr = Math.fround;
  const s = scoresOf(R, bs, T, f32);
  const { gid, nGroups } = groupRows(input.index, bs, 'grpo_vectorized: index');
  const count = new Float64Array(nGroups),
    s1 = new Float64Array(nGroups),
    s2 = new Float64Array(nGroups);
  for (let i = 0; i < bs; i++) {
    // index_add_ in float32, batch order
    const g = gid[i],
      x = fr(s[i]);
    count[g] += 1;
    s1[g] = fr(s1[g] + x);
    s2[g] = fr(s2[g] + fr(x * x));
  }
  const mean = new Float64Array(nGroups),
    std = new Float64Array(nGroups);
  const e32 = fr(e);
  for (let g = 0; g < nGroups; g++) {
    if (count[g] <= 1) {
      mean[g] = 0;
      std[g] = 1;
      continue;
    }
    const c = count[g];
    mean[g] = fr(s1[g] / c);
    const varNum = fr(s2[g] - fr(fr(s1[g] * s1[g]) / c));
    const variance = fr(varNum / Math.max(c - 1, 1));
    std[g] = fr(Math.sqrt(Math.max(variance, e32)));
  }
  const r = f32 ? fr : id;
  const adv = new Float64Array(bs);
  for (let i = 0; i < bs; i++) {
    const g = gid[i];
    const d = r(s[i] - mean[g]);
    adv[i] = norm ? r(d / fr(std[g] + e32)) : d;
  }
  return outcome(like, adv, M, bs, T);
};

/**
 * GRPO for pass@k (Chen et al. 2025, arXiv 2503.19595; verl compute_grpo_passk_outcome_advantage):
 * only the group's top scorer gets r_max − r_2nd (÷ (unbiased std + ε) when normalising); everyone
 * else gets 0, a tie at the max gives 0. Groups need ≥ 2 members.
 */
export const computeGrpoPasskOutcomeAdvantage: AdvantageEstimator = (input, cfg = {}) => {
  const { R, M, bs, T, like, f32 } = base('grpo_passk', input);
  const e = eps(cfg, 1e-6);
  const norm = cfg.norm_adv_by_std_in_grpo ?? true;
  const r = f32 ? Math.fround : id;
  const s = scoresOf(R, bs, T, f32);
  const { order, start, nGroups, labels } = groupRows(input.index, bs, 'grpo_passk: index');
  const adv = new Float64Array(bs);
  for (let g = 0; g < nGroups; g++) {
    const a = start[g],
      b = start[g + 1];
    if (b - a < 2)
      throw new ConfigError(
        `grpo_passk: pass@k requires at least 2 samples per group; group "${String(labels[g])}" has ${b - a}`,
      );
    let iMax = order[a],
      rMax = -Infinity,
      r2 = -Infinity;
    for (let j = a; j < b; j++) {
      const v = s[order[j]];
      if (v > rMax) {
        r2 = rMax;
        rMax = v;
        iMax = order[j];
      } else if (v > r2) r2 = v;
    }
    let advantage = r(rMax - r2);
    if (norm)
      advantage = r(
        advantage /
          (f32 ? Math.fround(groupStd(s, order, a, b, true) + Math.fround(e)) : groupStd(s, order, a, b, false) + e),
      );
    adv[iMax] = advantage;
  }
  return outcome(like, adv, M, bs, T);
};

// ---- leave-one-out / baselines -----------------------------------------------------------------

/**
 * RLOO (Ahmadian et al. 2024, arXiv 2402.14740; verl compute_rloo_outcome_advantage):
 * A_i = s_i·n/(n−1) − mean_g·n/(n−1) = s_i − mean of the others. A singleton keeps its raw score.
 */
export const computeRlooOutcomeAdvantage: AdvantageEstimator = (input) => {
  const { R, M, bs, T, like, f32 } = base('rloo', input);
  const r = f32 ? Math.fround : id;
  const s = scoresOf(R, bs, T, f32);
  const { order, start, nGroups } = groupRows(input.index, bs, 'rloo: index');
  const adv = new Float64Array(bs);
  for (let g = 0; g < nGroups; g++) {
    const a = start[g],
      b = start[g + 1],
      n = b - a;
    if (n === 1) {
      adv[order[a]] = s[order[a]];
      continue;
    }
    const mean = groupMean(s, order, a, b, f32);
    const meanTerm = r(r(mean * n) / (n - 1));
    for (let j = a; j < b; j++) {
      const i = order[j];
      adv[i] = r(r(r(s[i] * n) / (n - 1)) - meanTerm);
    }
  }
  return outcome(like, adv, M, bs, T);
};

/**
 * RLOO, vectorized variant (verl compute_rloo_vectorized_outcome_advantage):
 * A_i = (n·s_i − Σ_g s)/max(n−1, 1)·[n > 1] — singletons get 0 (the loop variant keeps the score).
 */
export const computeRlooVectorizedOutcomeAdvantage: AdvantageEstimator = (input) => {
  const { R, M, bs, T, like, f32 } = base('rloo_vectorized', input);
  const s = scoresOf(R, bs, T, f32);
  const { gid, nGroups } = groupRows(input.index, bs, 'rloo_vectorized: index');
  const r = f32 ? Math.fround : id;
  const c = new Float64Array(nGroups),
    sum = new Float64Array(nGroups);
  for (let i = 0; i < bs; i++) {
    c[gid[i]] += 1;
    sum[gid[i]] = r(sum[gid[i]] + s[i]);
  } // bincount: batch order
  const adv = new Float64Array(bs);
  for (let i = 0; i < bs; i++) {
    const n = c[gid[i]];
    adv[i] = n > 1 ? r(r(r(n * s[i]) - sum[gid[i]]) / Math.max(n - 1, 1)) : 0;
  }
  return outcome(like, adv, M, bs, T);
};

/**
 * REINFORCE++ (Hu 2025, arXiv 2501.03262; verl compute_reinforce_plus_plus_outcome_advantage):
 * G_t = r_t + γ·G_{t+1} backwards with the running return reset by a masked token (rewards do not
 * flow across masked/observation tokens); advantages = masked_whiten(G, M)·M over the batch.
 */
export const computeReinforcePlusPlusOutcomeAdvantage: AdvantageEstimator = (input, cfg = {}) => {
  const { R, M, bs, T, like, f32 } = base('reinforce_plus_plus', input);
  const gamma = checkScalar('gamma', cfg.gamma ?? 1.0);
  const ret = new Float64Array(bs * T);
  const r = f32 ? Math.fround : id;
  const g = r(gamma);
  for (let i = 0; i < bs; i++) {
    let G = 0;
    for (let t = T - 1; t >= 0; t--) {
      const k = i * T + t;
      G = r(R[k] + r(g * G));
      ret[k] = G;
      G = r(G * M[k]);
    }
  }
  const advantages = new Float64Array(bs * T);
  rawMaskedWhiten(ret, M, advantages, true, f32);
  for (let k = 0; k < bs * T; k++) advantages[k] *= M[k];
  return { advantages: outTensor(like, advantages, bs, T), returns: outTensor(like, ret, bs, T) };
};

/**
 * REINFORCE++ with a group baseline (arXiv 2501.03262; verl
 * compute_reinforce_plus_plus_baseline_outcome_advantage): (s_i − mean_g)·M (singleton mean 0),
 * then masked_whiten(·, M)·M over the batch.
 */
export const computeReinforcePlusPlusBaselineOutcomeAdvantage: AdvantageEstimator = (input) => {
  const { R, M, bs, T, like, f32 } = base('reinforce_plus_plus_baseline', input);
  const s = scoresOf(R, bs, T, f32);
  const { order, start, nGroups } = groupRows(input.index, bs, 'reinforce_plus_plus_baseline: index');
  const r = f32 ? Math.fround : id;
  const centred = new Float64Array(bs);
  for (let g = 0; g < nGroups; g++) {
    const a = start[g],
      b = start[g + 1];
    const mean = b - a === 1 ? 0 : groupMean(s, order, a, b, f32);
    for (let j = a; j < b; j++) centred[order[j]] = r(s[order[j]] - mean);
  }
  const tiled = new Float64Array(bs * T);
  for (let i = 0; i < bs; i++) for (let k = i * T, e = k + T; k < e; k++) tiled[k] = centred[i] * M[k];
  const out = new Float64Array(bs * T);
  rawMaskedWhiten(tiled, M, out, true, f32);
  for (let k = 0; k < bs * T; k++) out[k] *= M[k];
  const t = outTensor(like, out, bs, T);
  return { advantages: t, returns: t };
};

/**
 * ReMax (Li et al. 2023, arXiv 2310.10505; verl compute_remax_outcome_advantage):
 * returns = reverse-cumsum(r·M) along T (masked positions hold the suffix sum);
 * advantages = returns − b_i·M with b the greedy rollout's reward.
 */
export const computeRemaxOutcomeAdvantage: AdvantageEstimator = (input) => {
  const { R, M, bs, T, like, f32 } = base('remax', input);
  const b = readVector('remax: reward_baselines (reward of the greedy rollout)', input.reward_baselines, bs);
  const returns = new Float64Array(bs * T),
    advantages = new Float64Array(bs * T);
  const r = f32 ? Math.fround : id;
  for (let i = 0; i < bs; i++) {
    let G = 0; // torch's cumsum accumulates in double and rounds each output
    for (let t = T - 1; t >= 0; t--) {
      const k = i * T + t;
      G += r(R[k] * M[k]);
      returns[k] = G;
      advantages[k] = r(r(G) - r(b[i] * M[k]));
    }
  }
  return { advantages: outTensor(like, advantages, bs, T), returns: outTensor(like, returns, bs, T) };
};

/**
 * OPO (Hao et al. 2025, arXiv 2505.23585; verl compute_opo_outcome_advantage): length-weighted
 * baseline b_g = Σ_j |y_j|·s_j / Σ_j |y_j| with |y| = ΣM per row; singleton baseline 0;
 * A_i = (s_i − b_g)·M. (A group whose rows are all empty gets baseline 0 rather than 0/0.)
 */
export const computeOpoOutcomeAdvantage: AdvantageEstimator = (input) => {
  const { R, M, bs, T, like, f32 } = base('opo', input);
  const s = scoresOf(R, bs, T, f32);
  const len = new Float64Array(bs);
  for (let i = 0; i < bs; i++) {
    let n = 0;
    for (let k = i * T, e = k + T; k < e; k++) n += M[k];
    len[i] = n;
  }
  const { order, start, nGroups } = groupRows(input.index, bs, 'opo: index');
  const r = f32 ? Math.fround : id;
  const adv = new Float64Array(bs);
  for (let g = 0; g < nGroups; g++) {
    const a = start[g],
      b = start[g + 1];
    let baseline = 0;
    if (b - a > 1) {
      let num = 0,
        den = 0;
      if (f32) {
        const prod = new Float64Array(b - a),
          lens = new Float64Array(b - a);
        for (let j = a; j < b; j++) {
          const i = order[j];
          prod[j - a] = r(len[i] * s[i]);
          lens[j - a] = len[i];
        }
        num = torchSumF32(prod);
        den = torchSumF32(lens);
      } else {
        for (let j = a; j < b; j++) {
          const i = order[j];
          num += len[i] * s[i];
          den += len[i];
        }
      }
      baseline = den > 0 ? r(num / den) : 0;
    }
    for (let j = a; j < b; j++) adv[order[j]] = r(s[order[j]] - baseline);
  }
  return outcome(like, adv, M, bs, T);
};

/**
 * GPG (Chu et al. 2025, arXiv 2504.02546; verl compute_gpg_outcome_advantage):
 * A_i = α·(s_i − mean_g)/f_norm with α = bs / max(#nonzero scores, 1), computed in float32 as
 * float32(float32(1/m)·bs) like the reference; singleton mean 0. (verl's `alpha` argument is
 * overwritten and `epsilon` is unused.)
 */
export const computeGpgOutcomeAdvantage: AdvantageEstimator = (input, cfg = {}) => {
  const { R, M, bs, T, like, f32 } = base('gpg', input);
  const fNorm = checkScalar('f_norm', cfg.f_norm ?? 1.0);
  if (fNorm === 0) throw new ConfigError('gpg: f_norm must be non-zero');
  const s = scoresOf(R, bs, T, f32);
  let m = 0;
  for (let i = 0; i < bs; i++) if (s[i] !== 0) m++;
  const alpha = Math.fround(Math.fround(1 / Math.max(m, 1)) * bs);
  const { order, start, nGroups } = groupRows(input.index, bs, 'gpg: index');
  const adv = new Float64Array(bs);
  const r = f32 ? Math.fround : id;
  for (let g = 0; g < nGroups; g++) {
    const a = start[g],
      b = start[g + 1];
    const mean = b - a === 1 ? 0 : groupMean(s, order, a, b, f32);
    for (let j = a; j < b; j++) {
      const i = order[j];
      adv[i] = r(r(alpha * r(s[i] - mean)) / fNorm);
    }
  }
  return outcome(like, adv, M, bs, T);
};

// ---- optimal token baseline --------------------------------------------------------------------

interface OtbParts {
  G: Float64Array;
  W: Float64Array;
}

/** G = reverse-cumsum(r·M); w_t = (1 − 2·e^{logπ_t} + Σπ²_t)·ρ_t²; W = cumsum(w·M). */
function otbParts(
  name: string,
  input: AdvantageInput,
  bs: number,
  T: number,
  R: Float64Array,
  M: Float64Array,
): OtbParts {
  const lp = readTensor(`${name}: old_log_probs`, input.old_log_probs, bs, T);
  const sp = readTensor(`${name}: sum_pi_squared`, input.sum_pi_squared, bs, T);
  const rho = input.rollout_is_weights
    ? readTensor(`${name}: rollout_is_weights`, input.rollout_is_weights, bs, T)
    : null;
  const G = new Float64Array(bs * T),
    W = new Float64Array(bs * T);
  for (let i = 0; i < bs; i++) {
    let g = 0;
    for (let t = T - 1; t >= 0; t--) {
      const k = i * T + t;
      g += R[k] * M[k];
      G[k] = g;
    }
    let w = 0;
    for (let t = 0; t < T; t++) {
      const k = i * T + t;
      let wt = 1 - 2 * Math.exp(lp[k]) + sp[k];
      if (rho) wt *= rho[k] * rho[k];
      w += wt * M[k];
      W[k] = w;
    }
  }
  return { G, W };
}

/**
 * b = Σ G·W / (Σ W + ε). For float32 inputs the sums, the ε addition and the quotient are rounded to
 * float32 as in the reference, so ε vanishes next to a sizeable Σ W and a group whose members share
 * the same return gets exactly b = G (advantage 0).
 */
function otbRatio(num: number, den: number, e: number, f32: boolean): number {
  if (!f32) return num / (den + e);
  const fr = Math.fround;
  return fr(fr(num) / fr(fr(den) + fr(e)));
}

/** Index (within `members`) of the unique longest member if it is strictly longer than the 2nd; else −1. */
function zeroTailOwner(lengths: ArrayLike<number>): { owner: number; second: number } {
  let max = -Infinity,
    second = -Infinity,
    owner = -1,
    ties = 0;
  for (let j = 0; j < lengths.length; j++) {
    const L = lengths[j];
    if (L > max) {
      second = max;
      max = L;
      owner = j;
      ties = 1;
    } else if (L === max) {
      ties++;
      second = L;
    } else if (L > second) second = L;
  }
  return ties === 1 && max > second ? { owner, second: Math.trunc(second) } : { owner: -1, second: 0 };
}

/**
 * Optimal token baseline (verl compute_optimal_token_baseline_advantage): per group and position,
 * b_t = Σ_i G_it·W_it·M_it / (Σ_i W_it·M_it + ε) with G the reward-to-go and W the cumulative
 * path-variance proxy W_t = Σ_{j≤t} (1 − 2π_j + Σπ²_j)·ρ_j²; singleton groups get b = 0;
 * handle_zero_tail zeroes the baseline of a unique longest member from the 2nd-longest length on.
 * advantages = (G − b)·M, returns = G.
 */
export const computeOptimalTokenBaselineAdvantage: AdvantageEstimator = (input, cfg = {}) => {
  const { R, M, bs, T, like, f32 } = base('optimal_token_baseline', input);
  const e = eps(cfg, 1e-8);
  const zeroTail = cfg.handle_zero_tail ?? true;
  const { G, W } = otbParts('optimal_token_baseline', input, bs, T, R, M);
  const { order, start, nGroups } = groupRows(input.index, bs, 'optimal_token_baseline: index');
  const baseline = new Float64Array(bs * T);
  const num = new Float64Array(T),
    den = new Float64Array(T);
  for (let g = 0; g < nGroups; g++) {
    const a = start[g],
      b = start[g + 1];
    if (b - a === 1) continue;
    num.fill(0);
    den.fill(0);
    for (let j = a; j < b; j++) {
      const i = order[j];
      for (let t = 0; t < T; t++) {
        const k = i * T + t;
        const wm = W[k] * M[k];
        num[t] += G[k] * wm;
        den[t] += wm;
      }
    }
    for (let t = 0; t < T; t++) num[t] = otbRatio(num[t], den[t], e, f32);
    for (let j = a; j < b; j++) {
      const i = order[j];
      baseline.set(num, i * T);
    }
    if (zeroTail) {
      const lengths = new Float64Array(b - a);
      for (let j = a; j < b; j++) {
        const i = order[j];
        let n = 0;
        for (let t = 0; t < T; t++) n += M[i * T + t];
        lengths[j - a] = n;
      }
      const { owner, second } = zeroTailOwner(lengths);
      if (owner >= 0) {
        const i = order[a + owner];
        baseline.fill(0, i * T + second, (i + 1) * T);
      }
    }
  }
  const advantages = new Float64Array(bs * T);
  const r = f32 ? Math.fround : id;
  for (let k = 0; k < bs * T; k++) advantages[k] = r(r(G[k]) - baseline[k]) * M[k];
  return { advantages: outTensor(like, advantages, bs, T), returns: outTensor(like, G, bs, T) };
};

/**
 * Multi-turn (tool-integrated) optimal token baseline (verl
 * compute_multi_turn_optimal_token_baseline_advantage): like `optimal_token_baseline`, but each
 * row's valid tokens are first compacted (left-aligned in mask order) so the baseline is per
 * valid-token ordinal; rows with no valid token are skipped. handle_zero_tail defaults to true.
 */
export const computeMultiTurnOptimalTokenBaselineAdvantage: AdvantageEstimator = (input, cfg = {}) => {
  const { R, M, bs, T, like, f32 } = base('tir_optimal_token_baseline', input);
  const e = eps(cfg, 1e-8);
  const zeroTail = cfg.handle_zero_tail ?? true;
  const { G, W } = otbParts('tir_optimal_token_baseline', input, bs, T, R, M);
  // Compact: pos[i][k] = the k-th valid position of row i.
  const len = new Int32Array(bs);
  const pos = new Int32Array(bs * T);
  let Lmax = 0;
  for (let i = 0; i < bs; i++) {
    let n = 0;
    for (let t = 0; t < T; t++) if (M[i * T + t] !== 0) pos[i * T + n++] = t;
    len[i] = n;
    if (n > Lmax) Lmax = n;
  }
  const index = input.index;
  const rows: number[] = [],
    labels: GroupLabel[] = [];
  if (!index || index.length !== bs) groupRows(index, bs, 'tir_optimal_token_baseline: index'); // throws the clear error
  for (let i = 0; i < bs; i++)
    if (len[i] > 0) {
      rows.push(i);
      labels.push(index![i]);
    }
  const { order, start, nGroups } = groupRows(labels, rows.length, 'tir_optimal_token_baseline: index');
  const baseline = new Float64Array(bs * Lmax); // per row, per ordinal
  const num = new Float64Array(Lmax),
    den = new Float64Array(Lmax);
  for (let g = 0; g < nGroups; g++) {
    const a = start[g],
      b = start[g + 1];
    if (b - a === 1) continue;
    num.fill(0);
    den.fill(0);
    for (let j = a; j < b; j++) {
      const i = rows[order[j]];
      for (let k = 0; k < len[i]; k++) {
        const p = i * T + pos[i * T + k];
        num[k] += G[p] * W[p];
        den[k] += W[p];
      }
    }
    for (let k = 0; k < Lmax; k++) num[k] = otbRatio(num[k], den[k], e, f32);
    for (let j = a; j < b; j++) {
      const i = rows[order[j]];
      baseline.set(num, i * Lmax);
    }
    if (zeroTail) {
      const lengths = new Float64Array(b - a);
      for (let j = a; j < b; j++) lengths[j - a] = len[rows[order[j]]];
      const { owner, second } = zeroTailOwner(lengths);
      if (owner >= 0) {
        const i = rows[order[a + owner]];
        baseline.fill(0, i * Lmax + second, (i + 1) * Lmax);
      }
    }
  }
  const advantages = new Float64Array(bs * T);
  for (let i = 0; i < bs; i++) {
    for (let k = 0; k < len[i]; k++) {
      const p = i * T + pos[i * T + k];
      advantages[p] =
        (f32 ? Math.fround(Math.fround(G[p]) - baseline[i * Lmax + k]) : G[p] - baseline[i * Lmax + k]) * M[p];
    }
  }
  return { advantages: outTensor(like, advantages, bs, T), returns: outTensor(like, G, bs, T) };
};

// ---- registry ----------------------------------------------------------------------------------

/** Registry `adv_estimator` (names as in verl's AdvantageEstimator enum). */
const ESTIMATORS = {
  gae: computeGaeAdvantageReturn,
  grpo: computeGrpoOutcomeAdvantage,
  grpo_vectorized: computeGrpoVectorizedOutcomeAdvantage,
  grpo_passk: computeGrpoPasskOutcomeAdvantage,
  rloo: computeRlooOutcomeAdvantage,
  rloo_vectorized: computeRlooVectorizedOutcomeAdvantage,
  reinforce_plus_plus: computeReinforcePlusPlusOutcomeAdvantage,
  reinforce_plus_plus_baseline: computeReinforcePlusPlusBaselineOutcomeAdvantage,
  remax: computeRemaxOutcomeAdvantage,
  opo: computeOpoOutcomeAdvantage,
  gpg: computeGpgOutcomeAdvantage,
  optimal_token_baseline: computeOptimalTokenBaselineAdvantage,
  tir_optimal_token_baseline: computeMultiTurnOptimalTokenBaselineAdvantage,
};
export const advEstimators = new Registry<AdvantageEstimator>('adv_estimator', ESTIMATORS);
export type AdvEstimatorName = keyof typeof ESTIMATORS;
/** The names algorithm.adv_estimator accepts. */
export const ADV_ESTIMATOR_NAMES = Object.keys(ESTIMATORS) as [AdvEstimatorName, ...AdvEstimatorName[]];

/** Looks the estimator up by config name and runs it. */
export function computeAdvantage<A extends FloatArray>(
  name: string,
  input: AdvantageInput<A>,
  config: AdvantageConfig = {},
): AdvantageOutput<A> {
  return advEstimators.get(name)(input, config);
}
