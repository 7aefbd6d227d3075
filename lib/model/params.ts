/**
 * Parameter specs and weight maps. Names and layouts follow Hugging Face Llama/Mistral/Qwen2/Qwen3 ([out, in]
 * like torch Linear); the order of `paramSpecs` is stable and is the order of every flat
 * parameter list (graph inputs/outputs, checkpoints, optimizer state).
 */
import { ConfigError } from '../errors.ts';
import { hasQkNorm, type ModelConfig } from './config.ts';

export interface ParamSpec {
  name: string;
  shape: number[];
}
/** Weights by HF parameter name, float32, row-major. */
export type Weights = Map<string, Float32Array>;

export function paramSpecs(c: ModelConfig): ParamSpec[] {
  const D = c.hiddenSize,
    F = c.intermediateSize,
    hd = c.headDim;
  const qd = c.numAttentionHeads * hd,
    kvd = c.numKeyValueHeads * hd;
  const out: ParamSpec[] = [{ name: 'model.embed_tokens.weight', shape: [c.vocabSize, D] }];
  for (let i = 0; i < c.numHiddenLayers; i++) {
    const p = `model.layers.${i}`;
    out.push({ name: `${p}.input_layernorm.weight`, shape: [D] });
    out.push({ name: `${p}.self_attn.q_proj.weight`, shape: [qd, D] });
    if (c.attentionBias) out.push({ name: `${p}.self_attn.q_proj.bias`, shape: [qd] });
    out.push({ name: `${p}.self_attn.k_proj.weight`, shape: [kvd, D] });
    if (c.attentionBias) out.push({ name: `${p}.self_attn.k_proj.bias`, shape: [kvd] });
    out.push({ name: `${p}.self_attn.v_proj.weight`, shape: [kvd, D] });
    if (c.attentionBias) out.push({ name: `${p}.self_attn.v_proj.bias`, shape: [kvd] });
    out.push({ name: `${p}.self_attn.o_proj.weight`, shape: [D, qd] });
    if (hasQkNorm(c)) {
      out.push({ name: `${p}.self_attn.q_norm.weight`, shape: [hd] });
      out.push({ name: `${p}.self_attn.k_norm.weight`, shape: [hd] });
    }
    out.push({ name: `${p}.post_attention_layernorm.weight`, shape: [D] });
    out.push({ name: `${p}.mlp.gate_proj.weight`, shape: [F, D] });
    out.push({ name: `${p}.mlp.up_proj.weight`, shape: [F, D] });
    out.push({ name: `${p}.mlp.down_proj.weight`, shape: [D, F] });
  }
  out.push({ name: 'model.norm.weight', shape: [D] });
  if (c.head === 'value') out.push({ name: 'score.weight', shape: [1, D] });
  else if (!c.tieWordEmbeddings) out.push({ name: 'lm_head.weight', shape: [c.vocabSize, D] });
  if (c.vision) out.push(...visionParamSpecs(c));
  return out;
}

/** Name prefix of every vision-tower parameter (Qwen2-VL's HF names). */
export const VISION_PREFIX = 'visual.';

/** Whether a parameter belongs to the vision tower (frozen by actor.model.freeze_vision_tower). */
export function isVisionParam(name: string): boolean {
  return name.startsWith(VISION_PREFIX);
}

/**
 * The vision tower's parameters, Qwen2-VL's / Qwen2.5-VL's HF names and torch layouts: the patch
 * embedding is the Conv3d weight [E, 3, temporal, patch, patch] (no bias); blocks have norm1/norm2
 * (LayerNorm weight + bias, or RMSNorm weight), attn.qkv [3E, E] + bias, attn.proj [E, E] + bias, and
 * mlp.fc1 [F, E] + bias, mlp.fc2 [E, F] + bias (quick_gelu) or mlp.gate_proj / up_proj [F, E] +
 * bias, down_proj [E, F] + bias (silu_glu); the merger ln_q (as the blocks' norm), mlp.0 [m²E, m²E]
 * + bias, mlp.2 [out, m²E] + bias.
 */
export function visionParamSpecs(c: ModelConfig): ParamSpec[] {
  const v = c.vision;
  if (!v) return [];
  const E = v.hiddenSize,
    F = v.intermediateSize,
    ps = v.patchSize,
    M = E * v.spatialMergeSize * v.spatialMergeSize;
  const out: ParamSpec[] = [{ name: 'visual.patch_embed.proj.weight', shape: [E, 3, v.temporalPatchSize, ps, ps] }];
  for (let i = 0; i < v.depth; i++) {
    const p = `visual.blocks.${i}`;
    const norm = (n: string) => {
      out.push({ name: `${p}.${n}.weight`, shape: [E] });
      if (v.norm === 'layernorm') out.push({ name: `${p}.${n}.bias`, shape: [E] });
    };
    const lin = (n: string, o: number, i: number) =>
      out.push({ name: `${p}.${n}.weight`, shape: [o, i] }, { name: `${p}.${n}.bias`, shape: [o] });
    norm('norm1');
    lin('attn.qkv', 3 * E, E);
    lin('attn.proj', E, E);
    norm('norm2');
    if (v.mlp === 'silu_glu') {
      lin('mlp.gate_proj', F, E);
      lin('mlp.up_proj', F, E);
      lin('mlp.down_proj', E, F);
    } else {
      lin('mlp.fc1', F, E);
      lin('mlp.fc2', E, F);
    }
  }
  out.push({ name: 'visual.merger.ln_q.weight', shape: [E] });
  if (v.norm === 'layernorm') out.push({ name: 'visual.merger.ln_q.bias', shape: [E] });
  out.push({ name: 'visual.merger.mlp.0.weight', shape: [M, M] }, { name: 'visual.merger.mlp.0.bias', shape: [M] });
  out.push(
    { name: 'visual.merger.mlp.2.weight', shape: [v.outHiddenSize, M] },
    { name: 'visual.merger.mlp.2.bias', shape: [v.outHiddenSize] },
  );
  return out;
}

export function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

export function paramCount(c: ModelConfig): number {
  return paramSpecs(c).reduce((s, p) => s + numel(p.shape), 0);
}

/** Check that `w` has exactly the config's parameters (or `specs`, e.g. LoRA adapters) with the right sizes. */
export function validateWeights(
  c: ModelConfig,
  w: Weights,
  what = 'weights',
  specs: ParamSpec[] = paramSpecs(c),
): void {
  const expected = new Set(specs.map((s) => s.name));
  const missing = specs.filter((s) => !w.has(s.name)).map((s) => s.name);
  const extra = [...w.keys()].filter((k) => !expected.has(k));
  if (missing.length || extra.length) {
    throw new ConfigError(
      `${what}: ${missing.length ? `missing ${missing.slice(0, 5).join(', ')}${missing.length > 5 ? ` (+${missing.length - 5} more)` : ''}` : ''}${missing.length && extra.length ? '; ' : ''}${extra.length ? `unexpected ${extra.slice(0, 5).join(', ')}${extra.length > 5 ? ` (+${extra.length - 5} more)` : ''}` : ''}`,
    );
  }
  for (const s of specs) {
    const a = w.get(s.name)!;
    if (!(a instanceof Float32Array)) throw new ConfigError(`${what}: ${s.name} must be a Float32Array`);
    if (a.length !== numel(s.shape))
      throw new ConfigError(
        `${what}: ${s.name} has ${a.length} values, expected shape [${s.shape}] (${numel(s.shape)})`,
      );
  }
}

export function cloneWeights(w: Weights): Weights {
  return new Map([...w].map(([k, v]) => [k, Float32Array.from(v)]));
}

export function zerosLikeWeights(c: ModelConfig, specs: ParamSpec[] = paramSpecs(c)): Weights {
  return new Map(specs.map((s) => [s.name, new Float32Array(numel(s.shape))]));
}
