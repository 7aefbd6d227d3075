/**
 * Model configuration for the Llama-family decoder (Llama / Qwen2). TypeScript fields are
 * camelCase; `toHfConfig`/`fromHfConfig` map to and from Hugging Face's `config.json` keys so a
 * checkpoint directory is recognisable to that tooling.
 */
import { z } from 'zod';
import { ConfigError } from '../errors.ts';

export const modelConfigSchema = z.object({
  modelType: z.enum(['llama', 'qwen2']).default('llama').describe('llama, or qwen2 (q/k/v biases)'),
  head: z.enum(['lm', 'value']).default('lm').describe('lm: causal-LM policy head; value: scalar critic head (score.weight)'),
  hiddenSize: z.number().int().positive().describe('d_model'),
  intermediateSize: z.number().int().positive().describe('SwiGLU hidden width (ffn)'),
  numHiddenLayers: z.number().int().positive().describe('decoder layers'),
  numAttentionHeads: z.number().int().positive().describe('query heads'),
  numKeyValueHeads: z.number().int().positive().describe('key/value heads (grouped-query attention when fewer than query heads)'),
  vocabSize: z.number().int().positive().describe('vocabulary size, specials included'),
  maxPositionEmbeddings: z.number().int().positive().describe('maximum sequence length (prompt + response)'),
  rmsNormEps: z.number().positive().default(1e-6).describe('RMSNorm epsilon'),
  ropeTheta: z.number().positive().default(10000).describe('rotary base'),
  tieWordEmbeddings: z.boolean().default(false).describe('LM head shares the token embedding'),
  attentionBias: z.boolean().default(false).describe('q/k/v projection biases (true for Qwen2)'),
  bosTokenId: z.number().int().nonnegative().describe('begin-of-sequence token id'),
  eosTokenId: z.number().int().nonnegative().describe('end-of-sequence token id'),
  padTokenId: z.number().int().nonnegative().describe('padding token id'),
}).strict();

export type ModelConfigInput = z.input<typeof modelConfigSchema>;
export type ModelConfig = z.output<typeof modelConfigSchema> & { readonly headDim: number };

/** Validate and complete a model config; errors name the field and what to fix. */
export function modelConfig(input: ModelConfigInput | ModelConfig): ModelConfig {
  // a complete ModelConfig (with its derived headDim) is accepted too, e.g. {...cfg, head: 'value'}
  const { headDim: givenHeadDim, ...rest } = input as ModelConfigInput & { headDim?: number };
  const r = modelConfigSchema.safeParse(rest);
  if (!r.success) throw new ConfigError(`model config: ${r.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ')}`);
  const c = r.data;
  if (c.hiddenSize % c.numAttentionHeads !== 0) throw new ConfigError(`model config: hiddenSize ${c.hiddenSize} must be divisible by numAttentionHeads ${c.numAttentionHeads}`);
  if (c.numAttentionHeads % c.numKeyValueHeads !== 0) throw new ConfigError(`model config: numAttentionHeads ${c.numAttentionHeads} must be a multiple of numKeyValueHeads ${c.numKeyValueHeads}`);
  const headDim = c.hiddenSize / c.numAttentionHeads;
  if (givenHeadDim !== undefined && givenHeadDim !== headDim) throw new ConfigError(`model config: headDim ${givenHeadDim} ≠ hiddenSize / numAttentionHeads (${headDim}); only that layout is supported`);
  if (headDim % 2 !== 0) throw new ConfigError(`model config: head dim ${headDim} (hiddenSize / numAttentionHeads) must be even for rotary embeddings`);
  for (const k of ['bosTokenId', 'eosTokenId', 'padTokenId'] as const) {
    if (c[k] >= c.vocabSize) throw new ConfigError(`model config: ${k} ${c[k]} is outside the vocabulary (vocabSize ${c.vocabSize})`);
  }
  if (c.head === 'value' && c.tieWordEmbeddings) throw new ConfigError('model config: a value model has no LM head to tie; set tieWordEmbeddings false');
  return Object.freeze({ ...c, headDim });
}

/** Hugging Face `config.json` for this model. */
export function toHfConfig(c: ModelConfig): Record<string, unknown> {
  const arch = c.modelType === 'qwen2' ? 'Qwen2' : 'Llama';
  const out: Record<string, unknown> = {
    architectures: [`${arch}${c.head === 'value' ? 'ForTokenClassification' : 'ForCausalLM'}`],
    model_type: c.modelType,
    hidden_size: c.hiddenSize,
    intermediate_size: c.intermediateSize,
    num_hidden_layers: c.numHiddenLayers,
    num_attention_heads: c.numAttentionHeads,
    num_key_value_heads: c.numKeyValueHeads,
    head_dim: c.headDim,
    vocab_size: c.vocabSize,
    max_position_embeddings: c.maxPositionEmbeddings,
    rms_norm_eps: c.rmsNormEps,
    rope_theta: c.ropeTheta,
    hidden_act: 'silu',
    tie_word_embeddings: c.tieWordEmbeddings,
    attention_bias: c.attentionBias,
    torch_dtype: 'float32',
    bos_token_id: c.bosTokenId,
    eos_token_id: c.eosTokenId,
    pad_token_id: c.padTokenId,
  };
  if (c.head === 'value') { out.num_labels = 1; out.id2label = { 0: 'LABEL_0' }; out.label2id = { LABEL_0: 0 }; }
  return out;
}

/** Parse a Hugging Face `config.json` object (Llama or Qwen2 family). */
export function fromHfConfig(j: Record<string, unknown>): ModelConfig {
  const need = (k: string): number => {
    const v = j[k];
    if (typeof v !== 'number') throw new ConfigError(`config.json: "${k}" must be a number, got ${JSON.stringify(v)}`);
    return v;
  };
  const modelType = j.model_type;
  if (modelType !== 'llama' && modelType !== 'qwen2') throw new ConfigError(`config.json: model_type must be "llama" or "qwen2", got ${JSON.stringify(modelType)}`);
  const archs = Array.isArray(j.architectures) ? (j.architectures as unknown[]).map(String) : [];
  const head = archs.some((a) => a.endsWith('ForTokenClassification') || a.endsWith('ForSequenceClassification')) ? 'value' : 'lm';
  const hidden = need('hidden_size'), heads = need('num_attention_heads');
  if (typeof j.head_dim === 'number' && j.head_dim !== hidden / heads) throw new ConfigError(`config.json: head_dim ${j.head_dim} ≠ hidden_size / num_attention_heads (${hidden / heads}); only that layout is supported`);
  const eos = Array.isArray(j.eos_token_id) ? (j.eos_token_id as number[])[0] : j.eos_token_id;
  return modelConfig({
    modelType,
    head,
    hiddenSize: hidden,
    intermediateSize: need('intermediate_size'),
    numHiddenLayers: need('num_hidden_layers'),
    numAttentionHeads: heads,
    numKeyValueHeads: typeof j.num_key_value_heads === 'number' ? j.num_key_value_heads : heads,
    vocabSize: need('vocab_size'),
    maxPositionEmbeddings: need('max_position_embeddings'),
    rmsNormEps: typeof j.rms_norm_eps === 'number' ? j.rms_norm_eps : 1e-6,
    ropeTheta: typeof j.rope_theta === 'number' ? j.rope_theta : 10000,
    tieWordEmbeddings: j.tie_word_embeddings === true,
    attentionBias: typeof j.attention_bias === 'boolean' ? j.attention_bias : modelType === 'qwen2',
    bosTokenId: need('bos_token_id'),
    eosTokenId: typeof eos === 'number' ? eos : need('eos_token_id'),
    padTokenId: typeof j.pad_token_id === 'number' ? j.pad_token_id : (typeof eos === 'number' ? eos : need('pad_token_id')),
  });
}
