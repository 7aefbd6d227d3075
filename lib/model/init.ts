/**
 * Deterministic seeded initialisation (HF Llama `_init_weights` convention): linear and embedding
 * weights ~ N(0, std) (default 0.02; the vision tower's `visual.*` ~ N(0, visionStd), default std), norm weights = 1,
 * biases = 0. Each parameter draws from its
 * own stream seeded by (seed, name), so the same seed gives byte-identical weights and adding a
 * parameter does not change the others. Normals by Box–Muller on xoshiro128** (lib/util/rng.ts).
 */
import { Rng } from '../util/rng.ts';
import type { ModelConfig } from './config.ts';
import { numel, paramSpecs, type Weights } from './params.ts';

export function initWeights(c: ModelConfig, seed: number, opts: { std?: number; visionStd?: number } = {}): Weights {
  const std = opts.std ?? 0.02,
    visionStd = opts.visionStd ?? std;
  const w: Weights = new Map();
  for (const s of paramSpecs(c)) {
    const a = new Float32Array(numel(s.shape));
    if (/norm\d?\.weight$|\.ln_q\.weight$/.test(s.name))
      a.fill(1); // RMSNorm / LayerNorm gains (incl. Qwen3 q_norm / k_norm, ViT norm1 / norm2, merger ln_q)
    else if (!s.name.endsWith('.bias'))
      fillNormal(a, Rng.fromSeed(`init:${seed}:${s.name}`), s.name.startsWith('visual.') ? visionStd : std);
    w.set(s.name, a);
  }
  return w;
}

/** Standard normal samples × std (Box–Muller, both outputs used). */
export function fillNormal(a: Float32Array, rng: Rng, std: number): void {
  for (let i = 0; i < a.length; i += 2) {
    let u = rng.next();
    while (u <= 0) u = rng.next();
    const v = rng.next();
    const r = Math.sqrt(-2 * Math.log(u)) * std;
    a[i] = r * Math.cos(2 * Math.PI * v);
    if (i + 1 < a.length) a[i + 1] = r * Math.sin(2 * Math.PI * v);
  }
}
