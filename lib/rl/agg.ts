/**
 * Loss aggregation (verl core_algos.agg_loss): a (bs, T) per-token loss matrix L and its mask M
 * become one scalar. Registry `loss_agg_mode`:
 *
 *  - token-mean:              Σ where(M≠0, L, 0)·M / (batch_num_tokens ?? ΣM) · dp_size
 *                             (no epsilon: an all-zero mask gives NaN, as in verl).
 *  - seq-mean-token-sum:      S_i = Σ_t L·M; Σ_{i: ΣM_i>0} S_i / (global_batch_size ?? #non-empty rows) · dp_size
 *  - seq-mean-token-mean:     S_i = Σ_t L·M / (ΣM_i + 1e-8); same row averaging as above
 *  - seq-mean-token-sum-norm: Σ_all L·M / (loss_scale_factor ?? T)   (no batch or dp_size factor)
 *
 * The seq-* modes form L·M, so a NaN at a masked position of a non-empty row propagates (verl);
 * token-mean ignores it.
 */
import { ConfigError } from '../errors.ts';
import { Registry } from './registry.ts';
import { asF64, assertShape, readMask, type Mask2D, type Tensor2D } from './tensor.ts';
import { MASKED_EPS } from './masked.ts';

export type LossAggMode = 'token-mean' | 'seq-mean-token-sum' | 'seq-mean-token-mean' | 'seq-mean-token-sum-norm';

/** verl's `global_batch_info`: normalisers that make the loss invariant to data parallelism. */
export interface GlobalBatchInfo {
  dp_size?: number;
  batch_num_tokens?: number | null;
  global_batch_size?: number | null;
  loss_scale_factor?: number | null;
}

/** A loss aggregator over float64 arrays: value and ∂value/∂L (zero where a token does not count). */
export interface LossAggregator {
  value(L: Float64Array, M: Float64Array, bs: number, T: number, info: GlobalBatchInfo): number;
  weights(M: Float64Array, bs: number, T: number, info: GlobalBatchInfo): Float64Array;
}

function dpSize(info: GlobalBatchInfo): number {
  const dp = info.dp_size ?? 1;
  if (!Number.isFinite(dp) || dp <= 0)
    throw new ConfigError(`global_batch_info.dp_size must be a positive number, got ${dp}`);
  return dp;
}
function optPositive(name: string, v: number | null | undefined): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (!Number.isFinite(v) || v <= 0)
    throw new ConfigError(`global_batch_info.${name} must be a positive number or null, got ${v}`);
  return v;
}

function sumOf(M: Float64Array): number {
  let s = 0;
  for (let k = 0; k < M.length; k++) s += M[k];
  return s;
}

const tokenMean: LossAggregator = {
  value(L, M, _bs, _T, info) {
    const dp = dpSize(info);
    let s = 0,
      n = 0;
    for (let k = 0; k < M.length; k++) {
      const m = M[k];
      if (m !== 0) {
        s += L[k] * m;
        n += m;
      }
    }
    const denom = optPositive('batch_num_tokens', info.batch_num_tokens) ?? n;
    return (s / denom) * dp;
  },
  weights(M, _bs, _T, info) {
    const dp = dpSize(info);
    const denom = optPositive('batch_num_tokens', info.batch_num_tokens) ?? sumOf(M);
    const w = new Float64Array(M.length);
    for (let k = 0; k < M.length; k++) if (M[k] !== 0) w[k] = (M[k] / denom) * dp;
    return w;
  },
};

function seqMean(tokenMeanInRow: boolean): LossAggregator {
  return {
    value(L, M, bs, T, info) {
      const dp = dpSize(info);
      let total = 0,
        nonEmpty = 0;
      for (let i = 0; i < bs; i++) {
        let s = 0,
          n = 0;
        for (let k = i * T, e = k + T; k < e; k++) {
          s += L[k] * M[k];
          n += M[k];
        }
        if (n > 0) {
          total += tokenMeanInRow ? s / (n + MASKED_EPS) : s;
          nonEmpty++;
        }
      }
      const denom = optPositive('global_batch_size', info.global_batch_size) ?? nonEmpty;
      return (total / denom) * dp;
    },
    weights(M, bs, T, info) {
      const dp = dpSize(info);
      const n = new Float64Array(bs);
      let nonEmpty = 0;
      for (let i = 0; i < bs; i++) {
        let s = 0;
        for (let k = i * T, e = k + T; k < e; k++) s += M[k];
        n[i] = s;
        if (s > 0) nonEmpty++;
      }
      const denom = optPositive('global_batch_size', info.global_batch_size) ?? nonEmpty;
      const w = new Float64Array(M.length);
      for (let i = 0; i < bs; i++) {
        if (!(n[i] > 0)) continue;
        const rowScale = ((tokenMeanInRow ? 1 / (n[i] + MASKED_EPS) : 1) / denom) * dp;
        for (let k = i * T, e = k + T; k < e; k++) w[k] = M[k] * rowScale;
      }
      return w;
    },
  };
}

const seqMeanTokenSumNorm: LossAggregator = {
  value(L, M, _bs, T, info) {
    dpSize(info);
    let s = 0;
    for (let k = 0; k < M.length; k++) s += L[k] * M[k];
    return s / (optPositive('loss_scale_factor', info.loss_scale_factor) ?? T);
  },
  weights(M, _bs, T, info) {
    const scale = optPositive('loss_scale_factor', info.loss_scale_factor) ?? T;
    const w = new Float64Array(M.length);
    for (let k = 0; k < M.length; k++) w[k] = M[k] / scale;
    return w;
  },
};

/** Registry `loss_agg_mode`. */
export const lossAggModes = new Registry<LossAggregator>('loss_agg_mode', {
  'token-mean': tokenMean,
  'seq-mean-token-sum': seqMean(false),
  'seq-mean-token-mean': seqMean(true),
  'seq-mean-token-sum-norm': seqMeanTokenSumNorm,
});

/**
 * agg_loss(L, M, mode, global_batch_info) → scalar (verl core_algos.agg_loss). `loss_mat` may hold
 * NaN/Inf (verl semantics apply: token-mean ignores masked positions, the seq-* modes propagate).
 */
export function aggLoss(lossMat: Tensor2D, lossMask: Mask2D, mode: string, info: GlobalBatchInfo = {}): number {
  const agg = lossAggModes.get(mode);
  assertShape('agg_loss: loss_mat', lossMat, lossMat?.bs, lossMat?.T);
  const M = readMask('agg_loss: loss_mask', lossMask, lossMat.bs, lossMat.T);
  return agg.value(asF64(lossMat.data), M, lossMat.bs, lossMat.T, info);
}

/**
 * ∂agg_loss/∂L_it for a mask and mode: agg_loss(L) = Σ w ⊙ L for finite L. The training graph
 * multiplies per-token loss gradients by these weights.
 */
export function aggLossWeights(lossMask: Mask2D, mode: string, info: GlobalBatchInfo = {}): Tensor2D<Float64Array> {
  const agg = lossAggModes.get(mode);
  const M = readMask('agg_loss: loss_mask', lossMask, lossMask?.bs, lossMask?.T);
  return { data: agg.weights(M, lossMask.bs, lossMask.T, info), bs: lossMask.bs, T: lossMask.T };
}
