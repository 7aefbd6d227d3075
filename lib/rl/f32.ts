/**
 * Float32 emulation of the torch (1.13, CPU) reductions whose rounding decides the reference's
 * *structure* — e.g. whether a group of identical float32 scores gets an exact-zero advantage, or
 * whether an element equal to the batch mean whitens to exactly 0. torch sums a contiguous float32
 * run with a cascade of 4 interleaved accumulators over 8-lane vectors
 * (aten/src/ATen/native/cpu/SumKernel.cpp: cascade_sum → row_sum / multi_row_sum /
 * vectorized_inner_sum); reproducing that order, with every addition rounded by Math.fround, makes
 * our float32 sums bit-identical to the reference's.
 */

const fr = Math.fround;
const LANES = 8; // Vectorized<float>::size() (AVX2 and the default build)
const ILP = 4;
const scratch = new Float64Array(4 * ILP * LANES);

function ceilLog2(n: number): number {
  if (n <= 1) return 0;
  let l = 0,
    v = 1;
  while (v < n) {
    v *= 2;
    l++;
  }
  return l;
}

/**
 * multi_row_sum over `size` rows of width W (row i, column k = x[off + i·W + k]) with torch's
 * 4-level cascade; leaves the W column sums in acc[0 .. W).
 */
function multiRowSum(x: Float64Array, off: number, size: number, W: number, acc: Float64Array): void {
  acc.fill(0, 0, 4 * W);
  const levelPower = Math.max(4, Math.floor(ceilLog2(size) / 4));
  const step = 2 ** levelPower;
  const mask = step - 1;
  let i = 0;
  while (i + step <= size) {
    for (let j = 0; j < step; j++, i++) {
      const b = off + i * W;
      for (let k = 0; k < W; k++) acc[k] = fr(acc[k] + x[b + k]);
    }
    for (let j = 1; j < 4; j++) {
      const cur = j * W,
        prev = cur - W;
      for (let k = 0; k < W; k++) {
        acc[cur + k] = fr(acc[cur + k] + acc[prev + k]);
        acc[prev + k] = 0;
      }
      if ((i & (mask << (j * levelPower))) !== 0) break;
    }
  }
  for (; i < size; i++) {
    const b = off + i * W;
    for (let k = 0; k < W; k++) acc[k] = fr(acc[k] + x[b + k]);
  }
  for (let j = 1; j < 4; j++) for (let k = 0; k < W; k++) acc[k] = fr(acc[k] + acc[j * W + k]);
}

/**
 * torch's float32 sum of the contiguous run x[off .. off+n) (a 1-D `.sum()` or `.mean()` numerator,
 * one row of `.sum(dim=-1)`, or a whole contiguous tensor), evaluated in float32 in torch's order.
 * Values must be float32-representable.
 */
export function torchSumF32(x: Float64Array, off = 0, n = x.length - off): number {
  const acc = scratch;
  if (n < LANES) {
    // scalar row_sum: 4 interleaved accumulators, the tail into the first, then combined
    const rows = Math.floor(n / ILP);
    multiRowSum(x, off, rows, ILP, acc);
    for (let i = rows * ILP; i < n; i++) acc[0] = fr(acc[0] + x[off + i]);
    let s = acc[0];
    for (let k = 1; k < ILP; k++) s = fr(s + acc[k]);
    return s;
  }
  // vectorized_inner_sum: 8-lane vectors through row_sum (4 interleaved vector accumulators), the
  // leftover vectors into the first, then the scalar tail, then the 8 lanes one by one
  const nv = Math.floor(n / LANES);
  const rows = Math.floor(nv / ILP);
  multiRowSum(x, off, rows, ILP * LANES, acc);
  for (let v = rows * ILP; v < nv; v++) {
    const b = off + v * LANES;
    for (let l = 0; l < LANES; l++) acc[l] = fr(acc[l] + x[b + l]);
  }
  for (let k = 1; k < ILP; k++) for (let l = 0; l < LANES; l++) acc[l] = fr(acc[l] + acc[k * LANES + l]);
  let s = 0;
  for (let i = nv * LANES; i < n; i++) s = fr(s + x[off + i]);
  for (let l = 0; l < LANES; l++) s = fr(s + acc[l]);
  return s;
}

/** torch's float32 mean of a contiguous run: float32(sum / n). */
export function torchMeanF32(x: Float64Array, off = 0, n = x.length - off): number {
  return fr(torchSumF32(x, off, n) / n);
}
