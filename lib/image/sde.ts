/**
 * Samplers of a flow-matching velocity field v(x, t) (t = 1 noise → t = 0 data), on flat
 * Float32Array batches [B, C, S, S].
 *
 * - ODE (Euler): x_s = x_t + (s − t)·v(x_t, t).
 * - SDE (Flow-GRPO, Liu et al. 2025, arXiv 2505.05470, eq. 8–9): the reverse-time SDE with the
 *   same marginals as the ODE, dx = [v + σ_t²/(2t)·(x + (1 − t)·v)]dt + σ_t dw, σ_t = a·√(t/(1 − t)),
 *   discretised by Euler–Maruyama: x_s = μ + σ_t√(t − s)·ε with
 *   μ = x_t·(1 + σ_t²(s − t)/(2t)) + v·(1 + σ_t²(1 − t)/(2t))·(s − t). At t = 1 (σ infinite) σ_t
 *   uses the schedule's second time, as the paper's code does. Each step's log-probability is
 *   the pixel mean of the Gaussian log-density (flow-graph.ts gaussianLogProbGraph, the same
 *   formula) so the update's ratio is 1 on the data it was sampled with.
 * Denoising reduction (Flow-GRPO §4.3): train on few steps (`steps`), evaluate with many.
 */
import { Rng } from '../util/rng.ts';

/** The time grid 1 = t₀ > t₁ > … > t_K = 0 (uniform, K = steps). */
export function timeGrid(steps: number): number[] {
  if (!(Number.isInteger(steps) && steps >= 1))
    throw new RangeError(`sampling steps must be a positive integer, got ${steps}`);
  return Array.from({ length: steps + 1 }, (_, i) => 1 - i / steps);
}

/** σ_t = a·√(t/(1 − t)), with t = 1 replaced by the grid's second time (the first step's noise). */
export function sdeSigma(a: number, t: number, grid: readonly number[]): number {
  const tt = t >= 1 ? grid[1] : t;
  return a * Math.sqrt(tt / (1 - tt));
}

/** Standard normal draws (Box–Muller, 53-bit uniforms). */
export function gaussian(rng: Rng, n: number): Float32Array {
  const out = new Float32Array(n);
  for (let i = 0; i < n; i += 2) {
    const u1 = 1 - rng.next(),
      u2 = rng.next();
    const r = Math.sqrt(-2 * Math.log(u1));
    out[i] = r * Math.cos(2 * Math.PI * u2);
    if (i + 1 < n) out[i + 1] = r * Math.sin(2 * Math.PI * u2);
  }
  return out;
}

export type VelocityFn = (x: Float32Array, t: number[], cls: number[]) => Promise<Float32Array>;

/** The SDE step's mean μ (flat, per image b of `per` pixels) and std σ√(t − s). */
export function sdeStepMean(
  x: Float32Array,
  v: Float32Array,
  t: number,
  s: number,
  sigma: number,
): { mean: Float32Array; std: number } {
  const dt = s - t,
    s2 = sigma * sigma;
  const kx = 1 + (s2 * dt) / (2 * t),
    kv = (1 + (s2 * (1 - t)) / (2 * t)) * dt;
  const mean = new Float32Array(x.length);
  for (let i = 0; i < x.length; i++) mean[i] = x[i] * kx + v[i] * kv;
  return { mean, std: sigma * Math.sqrt(-dt) };
}

/** Pixel-mean Gaussian log-density of each image of x under N(mean, std²): [B]. */
export function gaussianLogProb(x: Float32Array, mean: Float32Array, std: number, B: number): number[] {
  const per = x.length / B;
  const c = Math.log(std) + 0.5 * Math.log(2 * Math.PI);
  const out: number[] = [];
  for (let b = 0; b < B; b++) {
    let acc = 0;
    for (let i = b * per; i < (b + 1) * per; i++) {
      const z = (x[i] - mean[i]) / std;
      acc += -0.5 * z * z - c;
    }
    out.push(acc / per);
  }
  return out;
}

export interface SdeStepRecord {
  t: number;
  tNext: number;
  sigma: number;
  xT: Float32Array;
  xNext: Float32Array;
  logProbs: number[];
}

export interface SampleResult {
  x0: Float32Array;
  /** SDE only: every denoising step (its input, output, σ and the log-probability of each image). */
  steps: SdeStepRecord[];
  /** The time grid t_0 = 1 > … > t_K = 0. */
  grid: number[];
  /** σ_t of each of the K steps (0 for a deterministic step). */
  sigmas: number[];
  /** The states x_{t_0}, …, x_{t_K} (each flat [B, C, S, S]; the last is x0). */
  states: Float32Array[];
}

/** Standard normal draws for a batch: one stream for all, or one per image (`per` values each). */
function batchNoise(rng: Rng | readonly Rng[], B: number, per: number): Float32Array {
  if (rng instanceof Rng) return gaussian(rng, B * per);
  if (rng.length !== B) throw new RangeError(`${rng.length} random streams for ${B} images`);
  const out = new Float32Array(B * per);
  rng.forEach((r, b) => out.set(gaussian(r, per), b * per));
  return out;
}

/**
 * Sample B images of classes `cls` from noise drawn from `rng` (one stream for the batch, or one
 * per image so that an image does not depend on the batch it was drawn in): ODE (`noiseLevel` 0) or Flow-GRPO
 * SDE (`noiseLevel` a > 0; the last step, into t = 0, is taken deterministically as its σ√(t−s)
 * would be the only noise left and the paper's sampler ends on the mean too).
 */
export async function sampleImages(
  velocity: VelocityFn,
  opts: {
    cls: number[];
    pixels: number;
    steps: number;
    rng: Rng | readonly Rng[];
    noiseLevel?: number;
    x1?: Float32Array;
  },
): Promise<SampleResult> {
  const B = opts.cls.length;
  const grid = timeGrid(opts.steps);
  let x = opts.x1 ?? batchNoise(opts.rng, B, opts.pixels);
  const a = opts.noiseLevel ?? 0;
  const steps: SdeStepRecord[] = [];
  const sigmas: number[] = [];
  const states = [x];
  for (let k = 0; k < opts.steps; k++) {
    const t = grid[k],
      s = grid[k + 1];
    const v = await velocity(x, Array(B).fill(t), opts.cls);
    if (a === 0 || s === 0) {
      const nx = new Float32Array(x.length);
      for (let i = 0; i < x.length; i++) nx[i] = x[i] + (s - t) * v[i];
      x = nx;
      sigmas.push(0);
      states.push(x);
      continue;
    }
    const sigma = sdeSigma(a, t, grid);
    const { mean, std } = sdeStepMean(x, v, t, s, sigma);
    const eps = batchNoise(opts.rng, B, opts.pixels);
    const nx = new Float32Array(x.length);
    for (let i = 0; i < x.length; i++) nx[i] = mean[i] + std * eps[i];
    steps.push({ t, tNext: s, sigma, xT: x, xNext: nx, logProbs: gaussianLogProb(nx, mean, std, B) });
    x = nx;
    sigmas.push(sigma);
    states.push(x);
  }
  return { x0: x, steps, grid, sigmas, states };
}

/**
 * Classifier-free guidance (Ho & Salimans 2022) of a class-conditional velocity:
 * v = v(x, t, ∅) + w·(v(x, t, c) − v(x, t, ∅)), ∅ = `nullClass`; both halves in one batch of 2B.
 * w = 1 is `velocity` itself (one batch of B).
 */
export function guidedVelocity(velocity: VelocityFn, scale: number, nullClass: number): VelocityFn {
  if (scale === 1) return velocity;
  return async (x, t, cls) => {
    const both = new Float32Array(x.length * 2);
    both.set(x);
    both.set(x, x.length);
    const v = await velocity(both, [...t, ...t], [...cls, ...cls.map(() => nullClass)]);
    const g = new Float32Array(x.length);
    for (let i = 0; i < x.length; i++) g[i] = v[x.length + i] + scale * (v[i] - v[x.length + i]);
    return g;
  };
}
