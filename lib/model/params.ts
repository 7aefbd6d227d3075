/**
 * Parameter specs and weight maps. Names and layouts follow Hugging Face Llama/Mistral/Qwen2/Qwen3 ([out, in]
 * like torch Linear); the order of `paramSpecs` is stable and is the order of every flat
 * parameter list (graph inputs/outputs, checkpoints, optimizer state).
 */
import { ConfigError } from '../errors.ts';
import { hasQkNorm, type ModelConfig } from './config.ts';

export interface ParamSpec { name: string; shape: number[] }
/** Weights by HF parameter name, float32, row-major. */
export type Weights = Map<string, Float32Array>;

export function paramSpecs(c: ModelConfig): ParamSpec[] {
  const D = c.hiddenSize, F = c.intermediateSize, hd = c.headDim;
  const qd = c.numAttentionHeads * hd, kvd = c.numKeyValueHeads * hd;
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
  return out;
}

export function numel(shape: readonly number[]): number { return shape.reduce((a, b) => a * b, 1); }

export function paramCount(c: ModelConfig): number { return paramSpecs(c).reduce((s, p) => s + numel(p.shape), 0); }

/** Check that `w` has exactly the config's parameters (or `specs`, e.g. LoRA adapters) with the right sizes. */
export function validateWeights(c: ModelConfig, w: Weights, what = 'weights', specs: ParamSpec[] = paramSpecs(c)): void {
  const expected = new Set(specs.map((s) => s.name));
  const missing = specs.filter((s) => !w.has(s.name)).map((s) => s.name);
  const extra = [...w.keys()].filter((k) => !expected.has(k));
  if (missing.length || extra.length) {
    throw new ConfigError(`${what}: ${missing.length ? `missing ${missing.slice(0, 5).join(', ')}${missing.length > 5 ? ` (+${missing.length - 5} more)` : ''}` : ''}${missing.length && extra.length ? '; ' : ''}${extra.length ? `unexpected ${extra.slice(0, 5).join(', ')}${extra.length > 5 ? ` (+${extra.length - 5} more)` : ''}` : ''}`);
  }
  for (const s of specs) {
    const a = w.get(s.name)!;
    if (!(a instanceof Float32Array)) throw new ConfigError(`${what}: ${s.name} must be a Float32Array`);
    if (a.length !== numel(s.shape)) throw new ConfigError(`${what}: ${s.name} has ${a.length} values, expected shape [${s.shape}] (${numel(s.shape)})`);
  }
}

export function cloneWeights(w: Weights): Weights {
  return new Map([...w].map(([k, v]) => [k, Float32Array.from(v)]));
}

export function zerosLikeWeights(c: ModelConfig, specs: ParamSpec[] = paramSpecs(c)): Weights {
  return new Map(specs.map((s) => [s.name, new Float32Array(numel(s.shape))]));
}
