/**
 * Masked reductions and small tensor helpers, matched to verl.utils.torch_functional
 * (masked_sum / masked_mean / masked_var / masked_whiten / clip_by_value / entropy_from_logits).
 *
 * Conventions (verl): masked_sum = Σ where(M≠0, x, 0)·M, so NaN/Inf at masked positions are
 * ignored; masked_mean divides by ΣM + 1e-8 (an empty mask gives 0); masked_var is over all
 * elements; masked_whiten is applied to every element, masked ones included.
 */
import { ConfigError } from '../errors.ts';
import { torchSumF32 } from './f32.ts';
import {
  asF64,
  outTensor,
  readMask,
  readTensor,
  toDtypeOf,
  type FloatArray,
  type Mask2D,
  type Tensor2D,
  type Tensor3D,
} from './tensor.ts';

/** verl's epsilon in masked_mean's denominator and masked_whiten's rsqrt. */
export const MASKED_EPS = 1e-8;

// ---- float64 kernels (used by the other modules; no validation) ------------------------------

/** Σ where(M≠0, x, 0)·M over all elements. */
export function rawMaskedSum(x: Float64Array, M: Float64Array): number {
  let s = 0;
  for (let k = 0; k < M.length; k++) {
    const m = M[k];
    if (m !== 0) s += x[k] * m;
  }
  return s;
}

/** masked_sum(x, M) / (ΣM + 1e-8). */
export function rawMaskedMean(x: Float64Array, M: Float64Array): number {
  let s = 0,
    n = 0;
  for (let k = 0; k < M.length; k++) {
    const m = M[k];
    if (m !== 0) {
      s += x[k] * m;
      n += m;
    }
  }
  return s / (n + MASKED_EPS);
}

/** verl masked_var over all elements (unbiased: × n/(n−1); an error for ΣM ∈ {0, 1}). */
export function rawMaskedVar(x: Float64Array, M: Float64Array, unbiased = true): number {
  let s = 0,
    n = 0;
  for (let k = 0; k < M.length; k++) {
    const m = M[k];
    if (m !== 0) {
      s += x[k] * m;
      n += m;
    }
  }
  const mean = s / (n + MASKED_EPS);
  let v = 0;
  for (let k = 0; k < M.length; k++) {
    const m = M[k];
    if (m !== 0) {
      const d = x[k] - mean;
      v += d * d * m;
    }
  }
  let variance = v / (n + MASKED_EPS);
  if (unbiased) {
    checkUnbiased(n);
    variance = variance * (n / (n - 1));
  }
  return variance;
}

function checkUnbiased(n: number): void {
  if (n === 0) throw new ConfigError('masked_var: at least one element in the mask has to be 1 (the mask is empty)');
  if (n === 1)
    throw new ConfigError(
      'masked_var: the sum of the mask is one, which makes the unbiased variance a division by zero',
    );
}

/**
 * (x − μ)·rsqrt(var_unbiased + 1e-8) for every element (+μ back when !shiftMean), into `out`.
 * With f32 = true the whole computation follows torch's float32 evaluation (reduction order and
 * rounding; see f32.ts), so an element equal to the batch mean whitens to the reference's value.
 */
export function rawMaskedWhiten(
  x: Float64Array,
  M: Float64Array,
  out: Float64Array,
  shiftMean = true,
  f32 = false,
): void {
  if (f32) {
    rawMaskedWhitenF32(x, M, out, shiftMean);
    return;
  }
  const mean = rawMaskedMean(x, M);
  const variance = rawMaskedVar(x, M, true);
  const inv = 1 / Math.sqrt(variance + MASKED_EPS);
  if (shiftMean) for (let k = 0; k < x.length; k++) out[k] = (x[k] - mean) * inv;
  else for (let k = 0; k < x.length; k++) out[k] = (x[k] - mean) * inv + mean;
}

function rawMaskedWhitenF32(x: Float64Array, M: Float64Array, out: Float64Array, shiftMean: boolean): void {
  const fr = Math.fround;
  const n = x.length;
  const prod = new Float64Array(n);
  for (let k = 0; k < n; k++) prod[k] = M[k] !== 0 ? fr(fr(x[k]) * M[k]) : 0;
  const maskSum = torchSumF32(M);
  checkUnbiased(maskSum);
  const denom = fr(maskSum + fr(MASKED_EPS));
  const mean = fr(torchSumF32(prod) / denom);
  for (let k = 0; k < n; k++) {
    const c = fr(fr(x[k]) - mean);
    prod[k] = M[k] !== 0 ? fr(fr(c * c) * M[k]) : 0;
  }
  let variance = fr(torchSumF32(prod) / denom);
  variance = fr(variance * fr(maskSum / fr(maskSum - 1)));
  const inv = fr(1 / fr(Math.sqrt(fr(variance + fr(MASKED_EPS)))));
  for (let k = 0; k < n; k++) {
    const w = fr(fr(fr(x[k]) - mean) * inv);
    out[k] = shiftMean ? w : fr(w + mean);
  }
}

// ---- public API ------------------------------------------------------------------------------

function read(name: string, values: Tensor2D, mask: Mask2D): { x: Float64Array; M: Float64Array } {
  if (!values) throw new ConfigError(`${name}: values are required`);
  return {
    x: readTensor(`${name}: values`, values, values.bs, values.T),
    M: readMask(`${name}: mask`, mask, values.bs, values.T),
  };
}

/** masked_sum(x, M) = Σ where(M≠0, x, 0)·M over all elements (verl torch_functional.masked_sum). */
export function maskedSum(values: Tensor2D, mask: Mask2D): number {
  const { x, M } = read('masked_sum', values, mask);
  return rawMaskedSum(x, M);
}

/** masked_sum along the last axis: one value per row, in the dtype of `values`. */
export function maskedSumRows<A extends FloatArray>(values: Tensor2D<A>, mask: Mask2D): A {
  const { x, M } = read('masked_sum', values, mask);
  const { bs, T } = values;
  const out = new Float64Array(bs);
  for (let i = 0; i < bs; i++) {
    let s = 0;
    for (let k = i * T, e = k + T; k < e; k++) {
      const m = M[k];
      if (m !== 0) s += x[k] * m;
    }
    out[i] = s;
  }
  return toDtypeOf(values.data, out);
}

/** masked_mean(x, M) = masked_sum / (ΣM + 1e-8) (verl torch_functional.masked_mean). */
export function maskedMean(values: Tensor2D, mask: Mask2D): number {
  const { x, M } = read('masked_mean', values, mask);
  return rawMaskedMean(x, M);
}

/** masked_mean along the last axis: per row Σ(x·M)/(ΣM_i + 1e-8); empty rows give 0. */
export function maskedMeanRows<A extends FloatArray>(values: Tensor2D<A>, mask: Mask2D): A {
  const { x, M } = read('masked_mean', values, mask);
  const { bs, T } = values;
  const out = new Float64Array(bs);
  for (let i = 0; i < bs; i++) {
    let s = 0,
      n = 0;
    for (let k = i * T, e = k + T; k < e; k++) {
      const m = M[k];
      if (m !== 0) {
        s += x[k] * m;
        n += m;
      }
    }
    out[i] = s / (n + MASKED_EPS);
  }
  return toDtypeOf(values.data, out);
}

/**
 * masked_var(x, M) = masked_mean((x − μ)², M), × n/(n−1) when unbiased, over all elements
 * (verl torch_functional.masked_var). Unbiased with ΣM ∈ {0, 1} is an error.
 */
export function maskedVar(values: Tensor2D, mask: Mask2D, unbiased = true): number {
  const { x, M } = read('masked_var', values, mask);
  return rawMaskedVar(x, M, unbiased);
}

/**
 * masked_whiten(x, M) = (x − μ)·rsqrt(var_unbiased + 1e-8), applied to every element (masked ones
 * included); with shiftMean = false μ is added back (verl torch_functional.masked_whiten).
 */
export function maskedWhiten<A extends FloatArray>(values: Tensor2D<A>, mask: Mask2D, shiftMean = true): Tensor2D<A> {
  const { x, M } = read('masked_whiten', values, mask);
  const out = new Float64Array(x.length);
  rawMaskedWhiten(x, M, out, shiftMean, values.data instanceof Float32Array);
  return outTensor(values.data, out, values.bs, values.T);
}

/** clip_by_value(x, lo, hi) = max(min(x, hi), lo), element-wise (verl torch_functional.clip_by_value). */
export function clipByValue<A extends FloatArray>(x: Tensor2D<A>, lo: Tensor2D, hi: Tensor2D): Tensor2D<A> {
  const a = readTensor('clip_by_value: x', x, x.bs, x.T);
  const l = readTensor('clip_by_value: tensor_min', lo, x.bs, x.T);
  const h = readTensor('clip_by_value: tensor_max', hi, x.bs, x.T);
  const out = new Float64Array(a.length);
  for (let k = 0; k < a.length; k++) out[k] = Math.max(Math.min(a[k], h[k]), l[k]);
  return outTensor(x.data, out, x.bs, x.T);
}

function read3(name: string, t: Tensor3D): Float64Array {
  const { bs, T, V, data } = t;
  if (!data || data.length !== bs * T * V)
    throw new ConfigError(
      `${name}: logits have ${data?.length} elements, shape (${bs}, ${T}, ${V}) needs ${bs * T * V}`,
    );
  return asF64(data);
}

/**
 * Categorical entropy per token from logits (bs, T, V): H = logsumexp(z) − Σ softmax(z)·z
 * (verl torch_functional.entropy_from_logits).
 */
export function entropyFromLogits<A extends FloatArray>(logits: Tensor3D<A>): Tensor2D<A> {
  const z = read3('entropy_from_logits', logits);
  const { bs, T, V } = logits;
  const out = new Float64Array(bs * T);
  for (let r = 0, base = 0; r < bs * T; r++, base += V) {
    let max = -Infinity;
    for (let v = 0; v < V; v++) {
      const x = z[base + v];
      if (x > max) max = x;
    }
    if (!Number.isFinite(max))
      throw new ConfigError(
        `entropy_from_logits: logits row [${Math.floor(r / T)}, ${r % T}] has no finite maximum (${max})`,
      );
    let s = 0;
    for (let v = 0; v < V; v++) s += Math.exp(z[base + v] - max);
    // H = logsumexp(z) − Σ_v softmax(z)_v·z_v, formed in this order (as verl) so that a one-hot
    // row gives exactly 0 (the tiny probabilities are absorbed by the leading term).
    const lse = max + Math.log(s);
    let pz = 0;
    for (let v = 0; v < V; v++) {
      const x = z[base + v];
      pz += (Math.exp(x - max) / s) * x;
    }
    if (!Number.isFinite(pz))
      throw new ConfigError(`entropy_from_logits: non-finite logits at [${Math.floor(r / T)}, ${r % T}]`);
    out[r] = lse - pz;
  }
  return outTensor(logits.data, out, bs, T);
}

/** log_softmax over the last axis of (bs, T, V) logits. */
export function logSoftmax<A extends FloatArray>(logits: Tensor3D<A>): Tensor3D<A> {
  const z = read3('log_softmax', logits);
  const { bs, T, V } = logits;
  const out = new Float64Array(z.length);
  for (let r = 0, base = 0; r < bs * T; r++, base += V) {
    let max = -Infinity;
    for (let v = 0; v < V; v++) {
      const x = z[base + v];
      if (x > max) max = x;
    }
    if (!Number.isFinite(max))
      throw new ConfigError(`log_softmax: logits row [${Math.floor(r / T)}, ${r % T}] has no finite maximum (${max})`);
    let s = 0;
    for (let v = 0; v < V; v++) s += Math.exp(z[base + v] - max);
    const lse = max + Math.log(s);
    for (let v = 0; v < V; v++) out[base + v] = z[base + v] - lse;
  }
  return { data: toDtypeOf(logits.data, out), bs, T, V };
}
