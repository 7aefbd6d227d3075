/**
 * Batch tensors for the RL math: row-major typed arrays with an explicit shape.
 *
 *  - `Tensor2D` is a (bs, T) batch: bs sequences (rows) × T response positions (columns);
 *    element (i, t) is `data[i * T + t]`.
 *  - `Tensor3D` is (bs, T, V): per-token vectors, e.g. logits or log-probabilities over a vocabulary.
 *  - Per-sequence vectors (bs,) are plain typed arrays.
 *  - Masks (`Mask2D`) hold 0/1 values (1 = the token counts) in any numeric typed array.
 *
 * Every function in lib/rl is generic over Float32Array / Float64Array: outputs have the dtype of
 * the primary input; arithmetic runs in JS doubles (and, where verl leaks float32 into the result,
 * the leak is reproduced with Math.fround — see advantage.ts).
 */
import { ConfigError } from '../errors.ts';

export type FloatArray = Float32Array | Float64Array;
export type MaskArray = Float32Array | Float64Array | Uint8Array;
export type Dtype = 'float32' | 'float64';

export interface Tensor2D<A extends FloatArray = FloatArray> {
  readonly data: A;
  readonly bs: number;
  readonly T: number;
}

export interface Mask2D {
  readonly data: MaskArray;
  readonly bs: number;
  readonly T: number;
}

export interface Tensor3D<A extends FloatArray = FloatArray> {
  readonly data: A;
  readonly bs: number;
  readonly T: number;
  readonly V: number;
}

/** A group label (verl's `uid` / `index`): the prompt a response was sampled for. */
export type GroupLabel = string | number;

/** Wraps a typed array as a (bs, T) tensor; the length must be bs·T. */
export function tensor2d<A extends FloatArray>(data: A, bs: number, T: number): Tensor2D<A> {
  checkDims('tensor2d', bs, T);
  if (data.length !== bs * T)
    throw new ConfigError(`tensor2d: data has ${data.length} elements, shape (${bs}, ${T}) needs ${bs * T}`);
  return { data, bs, T };
}

/** Wraps a typed array as a (bs, T) mask; the length must be bs·T. */
export function mask2d(data: MaskArray, bs: number, T: number): Mask2D {
  checkDims('mask2d', bs, T);
  if (data.length !== bs * T)
    throw new ConfigError(`mask2d: data has ${data.length} elements, shape (${bs}, ${T}) needs ${bs * T}`);
  return { data, bs, T };
}

/** Wraps a typed array as a (bs, T, V) tensor; the length must be bs·T·V. */
export function tensor3d<A extends FloatArray>(data: A, bs: number, T: number, V: number): Tensor3D<A> {
  checkDims('tensor3d', bs, T);
  if (!Number.isInteger(V) || V < 1) throw new ConfigError(`tensor3d: V must be a positive integer, got ${V}`);
  if (data.length !== bs * T * V)
    throw new ConfigError(`tensor3d: data has ${data.length} elements, shape (${bs}, ${T}, ${V}) needs ${bs * T * V}`);
  return { data, bs, T, V };
}

function checkDims(what: string, bs: number, T: number): void {
  if (!Number.isInteger(bs) || bs < 0 || !Number.isInteger(T) || T < 0) {
    throw new ConfigError(`${what}: shape must be non-negative integers, got (${bs}, ${T})`);
  }
}

export function dtypeOf(a: FloatArray): Dtype {
  return a instanceof Float32Array ? 'float32' : 'float64';
}

/** A new zero-filled array of the same dtype as `like`. */
export function newLike<A extends FloatArray>(like: A, n: number): A {
  return (like instanceof Float32Array ? new Float32Array(n) : new Float64Array(n)) as A;
}

export function newArray(dtype: Dtype, n: number): FloatArray {
  return dtype === 'float32' ? new Float32Array(n) : new Float64Array(n);
}

/** A zero (bs, T) tensor with the dtype of `like`. */
export function zerosLike<A extends FloatArray>(like: Tensor2D<A>): Tensor2D<A> {
  return { data: newLike(like.data, like.bs * like.T), bs: like.bs, T: like.T };
}

/** Builds a (bs, T) tensor from nested rows (all rows must have the same length). */
export function fromRows(rows: readonly (readonly number[])[], dtype: Dtype = 'float64'): Tensor2D {
  const bs = rows.length;
  const T = bs > 0 ? rows[0].length : 0;
  const data = newArray(dtype, bs * T);
  for (let i = 0; i < bs; i++) {
    if (rows[i].length !== T) throw new ConfigError(`fromRows: row ${i} has ${rows[i].length} values, row 0 has ${T}`);
    data.set(rows[i], i * T);
  }
  return { data, bs, T };
}

/** Nested rows of a (bs, T) tensor or mask. */
export function toRows(t: Tensor2D | Mask2D): number[][] {
  const out: number[][] = [];
  for (let i = 0; i < t.bs; i++) out.push(Array.from(t.data.subarray(i * t.T, (i + 1) * t.T)));
  return out;
}

/** The (bs, T) mask of right-padded responses with the given lengths. */
export function maskFromLengths(lengths: ArrayLike<number>, T: number, dtype: Dtype = 'float32'): Mask2D {
  const bs = lengths.length;
  const data = newArray(dtype, bs * T);
  for (let i = 0; i < bs; i++) {
    const n = lengths[i];
    if (!Number.isInteger(n) || n < 0 || n > T)
      throw new ConfigError(`maskFromLengths: length ${n} of row ${i} is not an integer in [0, ${T}]`);
    data.fill(1, i * T, i * T + n);
  }
  return { data, bs, T };
}

// ---------------------------------------------------------------------------------------------
// Kernels run on Float64Array only (one element type per loop keeps V8's element access
// monomorphic); inputs are converted once at the API boundary and outputs converted back to the
// caller's dtype. Float32 values are exact in float64, and the float64 → float32 conversion rounds
// to nearest, like Math.fround.
// ---------------------------------------------------------------------------------------------

/** The values as a Float64Array (no copy when they already are one). */
export function asF64(a: ArrayLike<number>): Float64Array {
  return a instanceof Float64Array ? a : new Float64Array(a);
}

/** `data` in the dtype of `like` (no copy for float64). */
export function toDtypeOf<A extends FloatArray>(like: A, data: Float64Array): A {
  return (like instanceof Float32Array ? new Float32Array(data) : data) as A;
}

/** A (bs, T) tensor in the dtype of `like` from float64 kernel output. */
export function outTensor<A extends FloatArray>(like: A, data: Float64Array, bs: number, T: number): Tensor2D<A> {
  return { data: toDtypeOf(like, data), bs, T };
}

/** Shape + finiteness check of a (bs, T) input; returns its values as float64. */
export function readTensor(name: string, t: Tensor2D | undefined | null, bs: number, T: number): Float64Array {
  assertShape(name, t, bs, T);
  const d = asF64(t!.data);
  assertFinite(name, d, T);
  return d;
}

/** Shape + finiteness check of a (bs, T) mask; returns its values as float64. */
export function readMask(name: string, m: Mask2D | undefined | null, bs: number, T: number): Float64Array {
  assertShape(name, m, bs, T);
  const d = asF64(m!.data);
  assertFinite(name, d, T);
  return d;
}

/** Length + finiteness check of a (bs,) vector; returns it as float64. */
export function readVector(name: string, v: ArrayLike<number> | undefined | null, bs: number): Float64Array {
  if (v === undefined || v === null) throw new ConfigError(`${name} is required (shape (${bs},))`);
  if (v.length !== bs) throw new ConfigError(`${name} has ${v.length} values, expected one per sequence (${bs})`);
  const d = asF64(v);
  assertFinite(name, d);
  return d;
}

// ---------------------------------------------------------------------------------------------
// Validation: every public function checks shapes and rejects NaN/Inf with the input's name and
// the offending position, so a bad batch fails loudly instead of training on garbage.
// ---------------------------------------------------------------------------------------------

/** Throws unless `t` is a (bs, T) tensor/mask whose data length matches. */
export function assertShape(name: string, t: Tensor2D | Mask2D | undefined | null, bs: number, T: number): void {
  if (t === undefined || t === null) throw new ConfigError(`${name} is required (shape (${bs}, ${T}))`);
  if (t.bs !== bs || t.T !== T) throw new ConfigError(`${name} has shape (${t.bs}, ${t.T}), expected (${bs}, ${T})`);
  if (t.data.length !== bs * T)
    throw new ConfigError(`${name}: data has ${t.data.length} elements, shape (${bs}, ${T}) needs ${bs * T}`);
}

/** Throws a ConfigError naming the input and the (row, col) of the first NaN/±Inf value. */
export function assertFinite(name: string, data: ArrayLike<number>, T = 0): void {
  for (let k = 0; k < data.length; k++) {
    const v = data[k];
    if (v - v !== 0) {
      // false only for finite v (NaN - NaN and Inf - Inf are NaN)
      const where = T > 0 ? `[${Math.floor(k / T)}, ${k % T}]` : `[${k}]`;
      throw new ConfigError(`${name} has a non-finite value ${v} at ${where}; RL inputs must be finite`, {
        input: name,
        index: k,
        value: v,
      });
    }
  }
}

/** Throws unless `x` is a finite number (a config scalar). */
export function checkScalar(
  name: string,
  x: unknown,
  opts: { min?: number; max?: number; minExclusive?: number; maxExclusive?: number } = {},
): number {
  if (typeof x !== 'number' || !Number.isFinite(x))
    throw new ConfigError(`${name} must be a finite number, got ${String(x)}`);
  if (opts.min !== undefined && x < opts.min) throw new ConfigError(`${name} must be ≥ ${opts.min}, got ${x}`);
  if (opts.max !== undefined && x > opts.max) throw new ConfigError(`${name} must be ≤ ${opts.max}, got ${x}`);
  if (opts.minExclusive !== undefined && !(x > opts.minExclusive))
    throw new ConfigError(`${name} must be > ${opts.minExclusive}, got ${x}`);
  if (opts.maxExclusive !== undefined && !(x < opts.maxExclusive))
    throw new ConfigError(`${name} must be < ${opts.maxExclusive}, got ${x}`);
  return x;
}

// ---------------------------------------------------------------------------------------------
// Groups (GRPO-style estimators): rows sharing a label form a group; labels are arbitrary and
// groups may be interleaved. Rows are bucketed with a counting sort, preserving batch order.
// ---------------------------------------------------------------------------------------------

export interface Groups {
  /** Group id (0..nGroups-1, in order of first appearance) of each row. */
  readonly gid: Int32Array;
  readonly nGroups: number;
  /** The label of each group id. */
  readonly labels: GroupLabel[];
  /** Rows of group g are order[start[g] .. start[g+1]), in batch order. */
  readonly order: Int32Array;
  readonly start: Int32Array;
}

export function groupRows(index: readonly GroupLabel[] | undefined | null, bs: number, name = 'index'): Groups {
  if (index === undefined || index === null)
    throw new ConfigError(`${name} (one group label per sequence) is required`);
  if (index.length !== bs)
    throw new ConfigError(`${name} has ${index.length} labels, expected one per sequence (${bs})`);
  const ids = new Map<GroupLabel, number>();
  const labels: GroupLabel[] = [];
  const gid = new Int32Array(bs);
  for (let i = 0; i < bs; i++) {
    const label = index[i];
    if (typeof label !== 'string' && !(typeof label === 'number' && Number.isFinite(label))) {
      throw new ConfigError(`${name}[${i}] must be a string or finite number group label, got ${String(label)}`);
    }
    let g = ids.get(label);
    if (g === undefined) {
      g = labels.length;
      ids.set(label, g);
      labels.push(label);
    }
    gid[i] = g;
  }
  const nGroups = labels.length;
  const start = new Int32Array(nGroups + 1);
  for (let i = 0; i < bs; i++) start[gid[i] + 1]++;
  for (let g = 0; g < nGroups; g++) start[g + 1] += start[g];
  const fill = start.slice(0, nGroups);
  const order = new Int32Array(bs);
  for (let i = 0; i < bs; i++) order[fill[gid[i]]++] = i;
  return { gid, nGroups, labels, order, start };
}
