/**
 * LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"), laid out as
 * Hugging Face PEFT does so an adapter saved here is one `peft` loads:
 *
 *   y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ,   W [out, in] frozen,  A [r, in],  B [out, r],  s = alpha / r.
 *
 * Init (PEFT `init_lora_weights=True`): A ~ Kaiming-uniform(a = √5) = U(−1/√in, 1/√in)
 * (gain √(2/(1+a²)) = √(1/3), bound gain·√(3/in)); B = 0, so a fresh adapter leaves the model as it is.
 * Adapter names: `<module path>.lora_A.weight` / `.lora_B.weight` (module path as the base
 * weight's name without `.weight`, e.g. model.layers.0.self_attn.q_proj); in a PEFT file every name
 * carries the prefix `base_model.model.`.
 */
import { ConfigError } from '../errors.ts';
import { Rng } from '../util/rng.ts';
import type { ModelConfig } from './config.ts';
import { numel, validateWeights, type ParamSpec, type Weights } from './params.ts';

/** The linear modules of a decoder layer LoRA can adapt (PEFT target_modules names). */
export const LORA_MODULES = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const;
export type LoraModule = (typeof LORA_MODULES)[number];

/**
 * The linear modules of a ViT block LoRA can adapt (Hugging Face names under `visual.blocks.N.`):
 * attn.qkv and attn.proj, and the MLP's fc1 / fc2 (Qwen2-VL, quick-GELU) or gate_proj / up_proj /
 * down_proj (Qwen2.5-VL, SiLU-gated). The patch embedding and the merger are never adapted.
 */
export const VISION_LORA_MODULES = ['qkv', 'proj', 'fc1', 'fc2', 'gate_proj', 'up_proj', 'down_proj'] as const;
export type VisionLoraModule = (typeof VISION_LORA_MODULES)[number];

export interface LoraConfig {
  rank: number;
  alpha: number;
  /** Adapted decoder modules, in LORA_MODULES order. */
  targetModules: LoraModule[];
  /**
   * Adapted ViT-block modules, in VISION_LORA_MODULES order (empty: the tower is not adapted). After
   * `loraConfig` 'all-linear' is every name; `loraSites` keeps those the model's tower has.
   */
  visionModules: VisionLoraModule[];
}

export interface LoraConfigInput {
  rank: number;
  alpha: number;
  dropout?: number;
  /** Module names, or 'all-linear' (PEFT: every linear layer but the output head). */
  targetModules: readonly string[] | 'all-linear';
  /** ViT-block module names (VISION_LORA_MODULES), or 'all-linear'; null / absent: the tower is not adapted. */
  visionTargetModules?: readonly string[] | 'all-linear' | null;
}

/** Prefix of every tensor name in a PEFT adapter file. */
export const PEFT_PREFIX = 'base_model.model.';
export const ADAPTER_CONFIG_FILE = 'adapter_config.json';
export const ADAPTER_MODEL_FILE = 'adapter_model.safetensors';

/** Checks a LoRA config's rank, alpha and dropout (any model kind); errors are one line naming `key`. */
export function checkLoraScalars(input: { rank: number; alpha: number; dropout?: number }, key: string): void {
  if (!(Number.isInteger(input.rank) && input.rank >= 1))
    throw new ConfigError(
      `${key}.rank must be an integer ≥ 1 (the adapter width r), got ${input.rank}; remove ${key} to train every weight`,
    );
  if (!(Number.isFinite(input.alpha) && input.alpha > 0))
    throw new ConfigError(
      `${key}.alpha must be a number > 0 (the update is scaled by alpha / rank), got ${input.alpha}`,
    );
  if ((input.dropout ?? 0) !== 0)
    throw new ConfigError(`${key}.dropout must be 0: LoRA dropout is not implemented (got ${input.dropout})`);
}

/** Validate a LoRA config; errors are one line naming the key (`key` is how the caller spells it). */
export function loraConfig(input: LoraConfigInput, key = 'lora'): LoraConfig {
  checkLoraScalars(input, key);
  const raw = input.targetModules === 'all-linear' ? [...LORA_MODULES] : [...input.targetModules];
  if (!raw.length)
    throw new ConfigError(`${key}.target_modules is empty; list some of ${LORA_MODULES.join(', ')} or give all-linear`);
  for (const m of raw) {
    if (!(LORA_MODULES as readonly string[]).includes(m))
      throw new ConfigError(
        `${key}.target_modules: "${m}" matches no module of the model; valid module names: ${LORA_MODULES.join(', ')} (or all-linear)`,
      );
  }
  const vt = input.visionTargetModules ?? null;
  const vraw = vt === 'all-linear' ? [...VISION_LORA_MODULES] : [...(vt ?? [])];
  if (vt !== null && vt !== 'all-linear' && !vraw.length)
    throw new ConfigError(
      `${key}.vision_target_modules is empty; list some of ${VISION_LORA_MODULES.join(', ')}, give all-linear, or null for no tower adapters`,
    );
  for (const m of vraw) {
    if (!(VISION_LORA_MODULES as readonly string[]).includes(m))
      throw new ConfigError(
        `${key}.vision_target_modules: "${m}" is no linear module of a ViT block; valid: ${VISION_LORA_MODULES.join(', ')} (or all-linear)`,
      );
  }
  return {
    rank: input.rank,
    alpha: input.alpha,
    targetModules: LORA_MODULES.filter((m) => raw.includes(m)),
    visionModules: VISION_LORA_MODULES.filter((m) => vraw.includes(m)),
  };
}

/** The tower modules of `l` that the model's ViT blocks have (qkv, proj and its MLP's); [] for a text model. */
export function towerLoraModules(c: ModelConfig, l: LoraConfig): VisionLoraModule[] {
  if (!c.vision || !l.visionModules.length) return [];
  const mlp: readonly VisionLoraModule[] =
    c.vision.mlp === 'silu_glu' ? ['gate_proj', 'up_proj', 'down_proj'] : ['fc1', 'fc2'];
  return l.visionModules.filter((m) => m === 'qkv' || m === 'proj' || mlp.includes(m));
}

/** Checks that the tower modules of `l` exist in the model (one line naming `key` otherwise). */
export function checkLoraFits(c: ModelConfig, l: LoraConfig, key = 'lora'): void {
  if (!l.visionModules.length) return;
  if (!c.vision)
    throw new ConfigError(
      `${key}.vision_target_modules: the model has no vision tower (text-only); remove vision_target_modules`,
    );
  const have = towerLoraModules(c, l);
  const missing = l.visionModules.filter((m) => !have.includes(m));
  // 'all-linear' resolves to every name; only an explicit name the tower lacks is an error
  if (missing.length && l.visionModules.length !== VISION_LORA_MODULES.length)
    throw new ConfigError(
      `${key}.vision_target_modules: ${missing.join(', ')} not in this tower's blocks; valid here: qkv, proj, ${c.vision.mlp === 'silu_glu' ? 'gate_proj, up_proj, down_proj' : 'fc1, fc2'}`,
    );
}

/** s = alpha / r (PEFT `scaling`, without rsLoRA). */
export function loraScale(l: LoraConfig): number {
  return l.alpha / l.rank;
}

export interface LoraSite {
  module: LoraModule | VisionLoraModule;
  layer: number;
  path: string;
  inFeatures: number;
  outFeatures: number;
}

/**
 * Every adapted linear layer of the model: the decoder's layer by layer (modules in LORA_MODULES
 * order), then the ViT blocks' (VISION_LORA_MODULES order) when the tower is adapted.
 */
export function loraSites(c: ModelConfig, l: LoraConfig): LoraSite[] {
  const D = c.hiddenSize,
    F = c.intermediateSize,
    qd = c.numAttentionHeads * c.headDim,
    kvd = c.numKeyValueHeads * c.headDim;
  const dims: Record<LoraModule, [string, number, number]> = {
    q_proj: ['self_attn', D, qd],
    k_proj: ['self_attn', D, kvd],
    v_proj: ['self_attn', D, kvd],
    o_proj: ['self_attn', qd, D],
    gate_proj: ['mlp', D, F],
    up_proj: ['mlp', D, F],
    down_proj: ['mlp', F, D],
  };
  const out: LoraSite[] = [];
  for (let i = 0; i < c.numHiddenLayers; i++) {
    for (const m of l.targetModules) {
      const [block, inF, outF] = dims[m];
      out.push({ module: m, layer: i, path: `model.layers.${i}.${block}.${m}`, inFeatures: inF, outFeatures: outF });
    }
  }
  const tower = towerLoraModules(c, l);
  if (tower.length) {
    const E = c.vision!.hiddenSize,
      VF = c.vision!.intermediateSize;
    const vdims: Record<VisionLoraModule, [string, number, number]> = {
      qkv: ['attn', E, 3 * E],
      proj: ['attn', E, E],
      fc1: ['mlp', E, VF],
      fc2: ['mlp', VF, E],
      gate_proj: ['mlp', E, VF],
      up_proj: ['mlp', E, VF],
      down_proj: ['mlp', VF, E],
    };
    for (let i = 0; i < c.vision!.depth; i++)
      for (const m of tower) {
        const [block, inF, outF] = vdims[m];
        out.push({ module: m, layer: i, path: `visual.blocks.${i}.${block}.${m}`, inFeatures: inF, outFeatures: outF });
      }
  }
  return out;
}

/** Adapter parameter specs: per site A [r, in] then B [out, r]; the order of every flat adapter list. */
export function loraSpecs(c: ModelConfig, l: LoraConfig): ParamSpec[] {
  return loraSites(c, l).flatMap((s) => [
    { name: `${s.path}.lora_A.weight`, shape: [l.rank, s.inFeatures] },
    { name: `${s.path}.lora_B.weight`, shape: [s.outFeatures, l.rank] },
  ]);
}

/** PEFT's initialisation: A ~ U(−1/√in, 1/√in) (Kaiming-uniform, a = √5), seeded per tensor by (seed, name); B = 0. */
export function initLora(c: ModelConfig, l: LoraConfig, seed: number): Weights {
  const w: Weights = new Map();
  for (const s of loraSpecs(c, l)) {
    const a = new Float32Array(numel(s.shape));
    if (s.name.endsWith('.lora_A.weight')) {
      const bound = 1 / Math.sqrt(s.shape[1]);
      const rng = Rng.fromSeed(`lora:${seed}:${s.name}`);
      for (let i = 0; i < a.length; i++) a[i] = (2 * rng.next() - 1) * bound;
    }
    w.set(s.name, a);
  }
  return w;
}

/** Checks that `w` holds exactly the adapter tensors of (c, l) with their shapes; `what` names the source. */
export function validateAdapter(c: ModelConfig, l: LoraConfig, w: Weights, what: string): void {
  validateWeights(c, w, `${what} (LoRA rank ${l.rank} on ${l.targetModules.join(', ')})`, loraSpecs(c, l));
}

/**
 * Merged weights W' = W + s·B·A for every adapted module ([out, r]·[r, in] → [out, in], float64
 * accumulation); the other tensors are the base's arrays (not copied).
 */
export function mergeLora(
  c: ModelConfig,
  l: LoraConfig,
  base: ReadonlyMap<string, Float32Array>,
  adapter: ReadonlyMap<string, Float32Array>,
): Weights {
  const out: Weights = new Map(base);
  const s = loraScale(l),
    r = l.rank;
  const acc = new Float64Array(Math.max(...loraSites(c, l).map((x) => x.inFeatures)));
  for (const site of loraSites(c, l)) {
    const W = base.get(`${site.path}.weight`),
      A = adapter.get(`${site.path}.lora_A.weight`),
      B = adapter.get(`${site.path}.lora_B.weight`);
    if (!W || !A || !B) throw new ConfigError(`mergeLora: ${site.path} lacks its base weight or adapter`);
    const I = site.inFeatures,
      O = site.outFeatures;
    const M = Float32Array.from(W);
    for (let o = 0; o < O; o++) {
      acc.fill(0, 0, I);
      for (let k = 0; k < r; k++) {
        const bk = B[o * r + k];
        if (bk === 0) continue;
        for (let i = 0; i < I; i++) acc[i] += bk * A[k * I + i];
      }
      for (let i = 0; i < I; i++) M[o * I + i] += s * acc[i];
    }
    out.set(`${site.path}.weight`, M);
  }
  return out;
}

/**
 * PEFT target_modules for `l` on model `c`. A text model's: the module names (PEFT matches them as
 * name suffixes). A vision-language model's: a regex PEFT full-matches against module paths, naming
 * exactly the adapted decoder and ViT-block modules in the checkpoint's tensor layout — as a list,
 * q_proj / gate_proj / proj would also catch the tower's (or the patch embedding's) modules.
 */
export function peftTargetModules(l: LoraConfig, c?: ModelConfig): string[] | string {
  if (!c?.vision) return [...l.targetModules];
  const nested = c.tensorLayout === 'nested';
  const group = (ms: readonly string[]) => (ms.length === 1 ? ms[0] : `(?:${ms.join('|')})`);
  const attn = l.targetModules.filter((m) => ['q_proj', 'k_proj', 'v_proj', 'o_proj'].includes(m));
  const mlp = l.targetModules.filter((m) => !attn.includes(m));
  const dec = [...(attn.length ? [`self_attn\\.${group(attn)}`] : []), ...(mlp.length ? [`mlp\\.${group(mlp)}`] : [])];
  const parts = [`${nested ? 'model\\.language_model' : 'model'}\\.layers\\.\\d+\\.${group(dec)}`];
  const tower = towerLoraModules(c, l);
  if (tower.length) {
    const ta = tower.filter((m) => m === 'qkv' || m === 'proj'),
      tm = tower.filter((m) => m !== 'qkv' && m !== 'proj');
    const blk = [...(ta.length ? [`attn\\.${group(ta)}`] : []), ...(tm.length ? [`mlp\\.${group(tm)}`] : [])];
    parts.push(`${nested ? 'model\\.visual' : 'visual'}\\.blocks\\.\\d+\\.${group(blk)}`);
  }
  return parts.length === 1 ? parts[0] : parts.map((x) => `(?:${x})`).join('|');
}

/** PEFT adapter_config.json for (l) on a causal LM whose base model is `basePath` (null: unknown), of config `c`. */
export function peftAdapterConfig(l: LoraConfig, basePath: string | null, c?: ModelConfig): Record<string, unknown> {
  return {
    peft_type: 'LORA',
    task_type: 'CAUSAL_LM',
    base_model_name_or_path: basePath,
    revision: null,
    inference_mode: true,
    r: l.rank,
    lora_alpha: l.alpha,
    lora_dropout: 0,
    target_modules: peftTargetModules(l, c),
    bias: 'none',
    fan_in_fan_out: false,
    init_lora_weights: true,
    use_rslora: false,
    use_dora: false,
    modules_to_save: null,
    layers_to_transform: null,
    layers_pattern: null,
    rank_pattern: {},
    alpha_pattern: {},
  };
}

/**
 * A LoRA config from a PEFT adapter_config.json (`towerModules`: the ViT-block modules the adapter
 * file holds tensors for); what this engine cannot reproduce is refused with one line.
 */
export function loraFromPeftConfig(
  j: Record<string, unknown>,
  source: string,
  towerModules: readonly string[] = [],
): LoraConfig {
  if (j.peft_type !== 'LORA')
    throw new ConfigError(`${source}: peft_type ${JSON.stringify(j.peft_type)} is not supported (only LORA)`);
  for (const k of ['use_rslora', 'use_dora', 'fan_in_fan_out'] as const)
    if (j[k] === true) throw new ConfigError(`${source}: ${k} true is not supported`);
  if (j.bias !== undefined && j.bias !== 'none')
    throw new ConfigError(`${source}: bias ${JSON.stringify(j.bias)} is not supported (only "none")`);
  for (const k of ['rank_pattern', 'alpha_pattern'] as const) {
    const v = j[k];
    if (v && typeof v === 'object' && Object.keys(v).length)
      throw new ConfigError(`${source}: ${k} is not supported (one rank and alpha for every module)`);
  }
  if (j.modules_to_save != null && !(Array.isArray(j.modules_to_save) && !j.modules_to_save.length))
    throw new ConfigError(`${source}: modules_to_save is not supported`);
  if (j.layers_to_transform != null)
    throw new ConfigError(`${source}: layers_to_transform is not supported (every layer is adapted)`);
  const tm = j.target_modules;
  const targets =
    tm === 'all-linear' ? 'all-linear' : Array.isArray(tm) ? tm.map(String) : typeof tm === 'string' ? [tm] : null;
  if (!targets)
    throw new ConfigError(
      `${source}: target_modules must be a list of module names or "all-linear", got ${JSON.stringify(tm)}`,
    );
  // lora_dropout only acts while training; loading an adapter trained with it is fine
  return loraConfig(
    {
      rank: Number(j.r),
      alpha: Number(j.lora_alpha),
      targetModules: targets,
      visionTargetModules: towerModules.length ? towerModules : null,
    },
    source,
  );
}
