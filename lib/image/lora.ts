/**
 * LoRA on an image policy's DiT (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
 * Models", arXiv 2106.09685): on each adapted linear layer of the transformer blocks
 *
 *   y = x·Wᵀ + b + s·(x·Aᵀ)·Bᵀ,   W [out, in] and b frozen,  A [r, in],  B [out, r],  s = alpha / r,
 *
 * with PEFT's init (A ~ U(−1/√in, 1/√in), seeded per tensor; B = 0, so a fresh adapter leaves the
 * model as it is). Adapted layers are named as in dit.ts: `blocks.N.<module>` for the modules in
 * DIT_LORA_MODULES (ada = the adaLN modulation, qkv and proj = attention, fc1 and fc2 = the MLP);
 * the patch, timestep and class embeddings and the final layer stay frozen. Adapter tensors:
 * `blocks.N.<module>.lora_A.weight` / `.lora_B.weight`, in adapter.safetensors beside the
 * merged model.safetensors of a policy version or checkpoint (metadata: rank, alpha, modules).
 */
import { join } from 'node:path';
import { ConfigError } from '../errors.ts';
import { checkLoraScalars } from '../model/lora.ts';
import { encodeSafetensors } from '../model/safetensors.ts';
import { Rng } from '../util/rng.ts';
import { readDitTensors } from './checkpoint.ts';
import type { DitConfig, DitWeights, ParamSpec } from './dit.ts';

/** The linear layers of a DiT block LoRA can adapt (actor.model.lora.target_modules of an image policy). */
export const DIT_LORA_MODULES = ['ada', 'qkv', 'proj', 'fc1', 'fc2'] as const;
export type DitLoraModule = (typeof DIT_LORA_MODULES)[number];

export interface DitLora {
  rank: number;
  alpha: number;
  /** Adapted modules, in DIT_LORA_MODULES order. */
  modules: DitLoraModule[];
}

/** The adapter file beside a LoRA image policy's model.safetensors. */
export const DIT_ADAPTER_FILE = 'adapter.safetensors';

/** Validates an image policy's LoRA config; errors are one line naming `key`. */
export function ditLoraConfig(
  input: { rank: number; alpha: number; dropout?: number; targetModules: readonly string[] | 'all-linear' },
  key = 'actor.model.lora',
): DitLora {
  checkLoraScalars(input, key);
  const raw = input.targetModules === 'all-linear' ? [...DIT_LORA_MODULES] : [...input.targetModules];
  if (!raw.length)
    throw new ConfigError(
      `${key}.target_modules is empty; list some of ${DIT_LORA_MODULES.join(', ')} or give all-linear`,
    );
  for (const m of raw)
    if (!(DIT_LORA_MODULES as readonly string[]).includes(m))
      throw new ConfigError(
        `${key}.target_modules: "${m}" is no linear layer of an image policy's DiT blocks; valid: ${DIT_LORA_MODULES.join(', ')} (or all-linear)`,
      );
  return { rank: input.rank, alpha: input.alpha, modules: DIT_LORA_MODULES.filter((m) => raw.includes(m)) };
}

/** s = alpha / r. */
export function ditLoraScale(l: DitLora): number {
  return l.alpha / l.rank;
}

/** Every adapted layer: its path (the base weight's name without `.weight`) and [out, in], block by block. */
export function ditLoraSites(c: DitConfig, l: DitLora): Array<{ path: string; out: number; in: number }> {
  const D = c.hidden,
    M = c.mlpRatio * D;
  const dims: Record<DitLoraModule, [number, number]> = {
    ada: [6 * D, D],
    qkv: [3 * D, D],
    proj: [D, D],
    fc1: [M, D],
    fc2: [D, M],
  };
  const out: Array<{ path: string; out: number; in: number }> = [];
  for (let i = 0; i < c.depth; i++)
    for (const m of l.modules) out.push({ path: `blocks.${i}.${m}`, out: dims[m][0], in: dims[m][1] });
  return out;
}

/** Adapter parameter specs: per site A [r, in] then B [out, r] (the packed order of the trainer). */
export function ditLoraSpecs(c: DitConfig, l: DitLora): ParamSpec[] {
  return ditLoraSites(c, l).flatMap((s) => [
    { name: `${s.path}.lora_A.weight`, shape: [l.rank, s.in] },
    { name: `${s.path}.lora_B.weight`, shape: [s.out, l.rank] },
  ]);
}

/** PEFT's init: A ~ U(−1/√in, 1/√in) seeded by (seed, name); B = 0. */
export function initDitLora(c: DitConfig, l: DitLora, seed: number | string): DitWeights {
  const w: DitWeights = new Map();
  for (const s of ditLoraSpecs(c, l)) {
    const a = new Float32Array(s.shape[0] * s.shape[1]);
    if (s.name.endsWith('.lora_A.weight')) {
      const bound = 1 / Math.sqrt(s.shape[1]);
      const rng = Rng.fromSeed(`dit-lora:${seed}:${s.name}`);
      for (let i = 0; i < a.length; i++) a[i] = (2 * rng.next() - 1) * bound;
    }
    w.set(s.name, a);
  }
  return w;
}

/** Merged weights W' = W + s·B·A per adapted layer (float64 accumulation); other tensors are the base's arrays. */
export function mergeDitLora(c: DitConfig, l: DitLora, base: DitWeights, adapter: DitWeights): DitWeights {
  const out: DitWeights = new Map(base);
  const s = ditLoraScale(l),
    r = l.rank;
  for (const site of ditLoraSites(c, l)) {
    const W = base.get(`${site.path}.weight`)!,
      A = adapter.get(`${site.path}.lora_A.weight`)!,
      B = adapter.get(`${site.path}.lora_B.weight`)!;
    const M = Float32Array.from(W);
    const acc = new Float64Array(site.in);
    for (let o = 0; o < site.out; o++) {
      acc.fill(0);
      for (let k = 0; k < r; k++) {
        const bk = B[o * r + k];
        if (bk !== 0) for (let i = 0; i < site.in; i++) acc[i] += bk * A[k * site.in + i];
      }
      for (let i = 0; i < site.in; i++) M[o * site.in + i] = W[o * site.in + i] + s * acc[i];
    }
    out.set(`${site.path}.weight`, M);
  }
  return out;
}

/** adapter.safetensors: the adapter tensors, metadata lora_rank, lora_alpha, lora_modules. */
export function ditAdapterFile(c: DitConfig, l: DitLora, adapter: DitWeights): Uint8Array {
  return encodeSafetensors(
    ditLoraSpecs(c, l).map((s) => [s.name, { dtype: 'F32' as const, shape: s.shape, data: adapter.get(s.name)! }]),
    { lora_rank: String(l.rank), lora_alpha: String(l.alpha), lora_modules: l.modules.join(',') },
  );
}

/** The adapter of a LoRA image policy's directory, checked against the LoRA config `l` (one line otherwise). */
export function loadDitAdapter(dir: string, c: DitConfig, l: DitLora): DitWeights {
  const file = join(dir, DIT_ADAPTER_FILE);
  const { weights, metadata } = readDitTensors(
    file,
    ditLoraSpecs(c, l),
    `${file} is missing: ${dir} is not a LoRA image policy's directory; give a checkpoint of a run with the same actor.model.lora, or unset actor.model.lora`,
  );
  const was = `rank ${metadata?.lora_rank}, alpha ${metadata?.lora_alpha}, modules ${metadata?.lora_modules}`;
  const now = `rank ${l.rank}, alpha ${l.alpha}, modules ${l.modules.join(',')}`;
  if (was !== now)
    throw new ConfigError(
      `${file}: its adapter has ${was} but actor.model.lora gives ${now}; use the run's LoRA settings`,
    );
  return weights;
}
