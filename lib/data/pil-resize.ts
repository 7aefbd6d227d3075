/**
 * Bicubic resampling exactly as Pillow's `Image.resize(size, Image.BICUBIC)` computes it on 8-bit
 * images (libImaging/Resample.c), which is what transformers' Qwen2-VL image processor calls: a
 * separable convolution, horizontal pass first, each pass rounded and clipped to 8 bits.
 *
 * Per axis, for output index x of an axis scaled by s = in / out (support widened by max(s, 1) when
 * shrinking, so the filter also antialiases):
 *   center = (x + 0.5)·s;  taps i ∈ [trunc(center − 2f + 0.5), trunc(center + 2f + 0.5)) ∩ [0, in)
 *   w_i = K((i − center + 0.5) / f) / Σ w,   f = max(s, 1)
 * with Keys' cubic kernel, a = −0.5:
 *   K(t) = (a+2)|t|³ − (a+3)|t|² + 1 for |t| < 1,  a(|t|³ − 5|t|² + 8|t| − 4) for 1 ≤ |t| < 2, else 0.
 * The weights are fixed-point integers (22 fractional bits, rounded half away from zero) and each
 * output is (½·2²² + Σ w_i·p_i) >> 22 clipped to [0, 255].
 */

const PRECISION_BITS = 32 - 8 - 2;
const A = -0.5;
const SUPPORT = 2;

function cubic(t: number): number {
  const x = Math.abs(t);
  if (x < 1) return ((A + 2) * x - (A + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * A;
  return 0;
}

interface Taps {
  /** first input index of each output's taps */
  start: Int32Array;
  /** tap count of each output */
  count: Int32Array;
  /** fixed-point weights, `ksize` per output */
  weights: Int32Array;
  ksize: number;
}

function taps(inSize: number, outSize: number): Taps {
  const scale = inSize / outSize;
  const filterScale = Math.max(scale, 1);
  const support = SUPPORT * filterScale;
  const ksize = Math.ceil(support) * 2 + 1;
  const start = new Int32Array(outSize);
  const count = new Int32Array(outSize);
  const weights = new Int32Array(outSize * ksize);
  const k = new Float64Array(ksize);
  for (let xx = 0; xx < outSize; xx++) {
    const center = (xx + 0.5) * scale;
    const ss = 1 / filterScale;
    // C's (int) cast truncates toward zero
    const xmin = Math.max(0, Math.trunc(center - support + 0.5));
    const xmax = Math.min(inSize, Math.trunc(center + support + 0.5)) - xmin;
    let ww = 0;
    for (let x = 0; x < xmax; x++) {
      const w = cubic((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (let x = 0; x < xmax; x++) {
      const w = ww !== 0 ? k[x] / ww : k[x];
      const f = w * (1 << PRECISION_BITS);
      weights[xx * ksize + x] = w < 0 ? Math.trunc(-0.5 + f) : Math.trunc(0.5 + f);
    }
    start[xx] = xmin;
    count[xx] = xmax;
  }
  return { start, count, weights, ksize };
}

function clip8(v: number): number {
  if (v <= 0) return 0;
  const r = Math.floor(v / (1 << PRECISION_BITS));
  return r > 255 ? 255 : r;
}

/**
 * Resizes interleaved 8-bit pixels (`channels` per pixel, row-major height × width) to
 * outWidth × outHeight as Pillow's BICUBIC does; a pass whose size does not change is skipped, as
 * in Pillow.
 */
export function resizeBicubicPil(
  src: Uint8Array,
  width: number,
  height: number,
  channels: number,
  outWidth: number,
  outHeight: number,
): Uint8Array {
  if (src.length !== width * height * channels)
    throw new RangeError(`pixel data has ${src.length} bytes, expected ${width}×${height}×${channels}`);
  if (!(outWidth >= 1 && outHeight >= 1)) throw new RangeError(`output size ${outWidth}×${outHeight} is empty`);
  const half = 1 << (PRECISION_BITS - 1);
  let cur = src;
  let w = width;
  if (outWidth !== width) {
    const t = taps(width, outWidth);
    const out = new Uint8Array(outWidth * height * channels);
    for (let y = 0; y < height; y++) {
      const row = y * width * channels;
      for (let xx = 0; xx < outWidth; xx++) {
        const s = t.start[xx];
        const n = t.count[xx];
        const kOff = xx * t.ksize;
        for (let c = 0; c < channels; c++) {
          let acc = half;
          for (let x = 0; x < n; x++) acc += cur[row + (s + x) * channels + c] * t.weights[kOff + x];
          out[(y * outWidth + xx) * channels + c] = clip8(acc);
        }
      }
    }
    cur = out;
    w = outWidth;
  }
  if (outHeight !== height) {
    const t = taps(height, outHeight);
    const out = new Uint8Array(w * outHeight * channels);
    const stride = w * channels;
    for (let yy = 0; yy < outHeight; yy++) {
      const s = t.start[yy];
      const n = t.count[yy];
      const kOff = yy * t.ksize;
      for (let i = 0; i < stride; i++) {
        let acc = half;
        for (let y = 0; y < n; y++) acc += cur[(s + y) * stride + i] * t.weights[kOff + y];
        out[yy * stride + i] = clip8(acc);
      }
    }
    cur = out;
  }
  return cur === src ? src.slice() : cur;
}
