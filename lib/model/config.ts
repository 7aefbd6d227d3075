/**
 * Model configuration for the Llama-family decoder (Llama / SmolLM2, Mistral, Qwen2, Qwen3). TypeScript fields are
 * camelCase; `toHfConfig`/`fromHfConfig` map to and from Hugging Face's `config.json` keys so a
 * checkpoint directory is recognisable to that tooling.
 */
import { z } from 'zod';
import { ConfigError } from '../errors.ts';
import { TENSOR_LAYOUTS, type HfDtype } from './hf-layout.ts';

const ropeScalingSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('linear'), factor: z.number().positive() }).strict(),
  z
    .object({
      type: z.literal('llama3'),
      factor: z.number().positive(),
      lowFreqFactor: z.number().positive(),
      highFreqFactor: z.number().positive(),
      originalMaxPositionEmbeddings: z.number().int().positive(),
    })
    .strict(),
]);
export type RopeScaling = z.infer<typeof ropeScalingSchema>;

export const MODEL_TYPES = ['llama', 'mistral', 'qwen2', 'qwen3', 'qwen2_vl', 'qwen2_5_vl'] as const;

/** Hugging Face's vision-language model types: a Qwen2 decoder with M-RoPE and their own vision tower. */
export const VL_MODEL_TYPES = ['qwen2_vl', 'qwen2_5_vl'] as const;
export function isQwenVl(c: { modelType: string }): c is { modelType: (typeof VL_MODEL_TYPES)[number] } {
  return (VL_MODEL_TYPES as readonly string[]).includes(c.modelType);
}

/**
 * Vision tower of a vision-language policy (lib/model/vision.ts), Qwen2-VL's layout: patch
 * embedding (a conv with stride = kernel = patchSize over temporalPatchSize frames, as a matmul),
 * `depth` ViT blocks (LayerNorm, bidirectional attention with rotary positions, quick-GELU MLP),
 * and the merger (LayerNorm → concat of spatialMergeSize² neighbours → Linear → GELU → Linear to
 * outHiddenSize = the decoder's hiddenSize). Written to config.json as `vision_config` (snake case)
 * with the three token ids at the top level (`image_token_id`, `vision_start_token_id`, `vision_end_token_id`).
 */
export const visionConfigSchema = z
  .object({
    depth: z.number().int().positive().describe('ViT blocks'),
    hiddenSize: z.number().int().positive().describe('ViT width (Qwen2-VL embed_dim)'),
    intermediateSize: z.number().int().positive().describe('ViT MLP hidden width (Qwen2-VL embed_dim × mlp_ratio)'),
    numHeads: z.number().int().positive().describe('ViT attention heads'),
    outHiddenSize: z.number().int().positive().describe('merger output width: must equal the decoder hiddenSize'),
    patchSize: z.number().int().positive().default(14).describe('patch side in pixels'),
    temporalPatchSize: z
      .number()
      .int()
      .positive()
      .default(2)
      .describe("frames per patch (an image is repeated over them, as Qwen2-VL's processor does)"),
    spatialMergeSize: z
      .union([z.literal(1), z.literal(2)])
      .default(2)
      .describe('merger window side: 2 = each 2×2 patch window becomes one decoder token; 1 = one token per patch'),
    layerNormEps: z.number().positive().default(1e-6).describe('LayerNorm epsilon of the blocks and the merger'),
    rope: z
      .enum(['2d', '1d'])
      .default('2d')
      .describe(
        'rotary positions in the ViT: 2d = (row, column) of the patch on half the rotary frequencies each (Qwen2-VL), 1d = the patch index',
      ),
    ropeTheta: z.number().positive().default(10000).describe('rotary base of the ViT'),
    norm: z
      .enum(['layernorm', 'rmsnorm'])
      .default('layernorm')
      .describe('block and merger norm: layernorm (weight, bias; Qwen2-VL) or rmsnorm (weight; Qwen2.5-VL)'),
    mlp: z
      .enum(['quick_gelu', 'silu_glu'])
      .default('quick_gelu')
      .describe(
        'block MLP: quick_gelu = fc2(quick_gelu(fc1 x)) (Qwen2-VL); silu_glu = down(silu(gate x)·up x), with biases (Qwen2.5-VL)',
      ),
    windowSize: z
      .number()
      .int()
      .positive()
      .nullable()
      .default(null)
      .describe(
        'window attention side in pixels (Qwen2.5-VL window_size): blocks not in fullattBlockIndexes attend within windows of windowSize/(patch·merge) merged patches; null = full attention everywhere',
      ),
    fullattBlockIndexes: z
      .array(z.number().int().nonnegative())
      .default([])
      .describe('blocks with full attention over the image when windowSize is set (Qwen2.5-VL fullatt_block_indexes)'),
    hfExtra: z
      .record(z.string(), z.unknown())
      .optional()
      .describe('vision_config keys of the source model not modelled here, written back unchanged'),
    imageTokenId: z
      .number()
      .int()
      .nonnegative()
      .describe('<|image_pad|>: one per merged patch, its embedding replaced by the image token'),
    visionStartTokenId: z.number().int().nonnegative().describe('<|vision_start|> (before the pads)'),
    visionEndTokenId: z.number().int().nonnegative().describe('<|vision_end|> (after the pads)'),
  })
  .strict();
export type VisionConfig = z.output<typeof visionConfigSchema>;
export type VisionConfigInput = z.input<typeof visionConfigSchema>;

export const modelConfigSchema = z
  .object({
    modelType: z
      .enum(MODEL_TYPES)
      .default('llama')
      .describe('llama (also SmolLM2), mistral, qwen2 (q/k/v biases) or qwen3 (per-head q/k RMSNorm)'),
    head: z
      .enum(['lm', 'value'])
      .default('lm')
      .describe('lm: causal-LM policy head; value: scalar critic head (score.weight)'),
    hiddenSize: z.number().int().positive().describe('d_model'),
    intermediateSize: z.number().int().positive().describe('SwiGLU hidden width (ffn)'),
    numHiddenLayers: z.number().int().positive().describe('decoder layers'),
    numAttentionHeads: z.number().int().positive().describe('query heads'),
    numKeyValueHeads: z
      .number()
      .int()
      .positive()
      .describe('key/value heads (grouped-query attention when fewer than query heads)'),
    headDim: z
      .number()
      .int()
      .positive()
      .optional()
      .describe('per-head width; default hiddenSize / numAttentionHeads (Qwen3 sets it independently)'),
    vocabSize: z
      .number()
      .int()
      .positive()
      .describe("vocabulary size, specials included (may exceed the tokenizer's: padding rows)"),
    maxPositionEmbeddings: z.number().int().positive().describe('maximum sequence length (prompt + response)'),
    rmsNormEps: z.number().positive().default(1e-6).describe('RMSNorm epsilon'),
    ropeTheta: z.number().positive().default(10000).describe('rotary base'),
    ropeScaling: ropeScalingSchema
      .nullable()
      .default(null)
      .describe('rotary frequency scaling (HF rope_scaling types linear, llama3); null = none'),
    tieWordEmbeddings: z.boolean().default(false).describe('LM head shares the token embedding'),
    attentionBias: z.boolean().default(false).describe('q/k/v projection biases (true for Qwen2)'),
    bosTokenId: z.number().int().nonnegative().describe('begin-of-sequence token id'),
    eosTokenId: z.number().int().nonnegative().describe('end-of-sequence token id (the first stop token)'),
    eosTokenIds: z
      .array(z.number().int().nonnegative())
      .min(1)
      .optional()
      .describe('every stop token (config.json list + generation_config.json); default [eosTokenId]'),
    padTokenId: z.number().int().nonnegative().describe('padding token id'),
    // the tokenizer's sampling mask (samplingMaskIds): one mask for every LM-head distribution, so sampler and scorer/trainer agree
    suppressTokenIds: z
      .array(z.number().int().nonnegative())
      .optional()
      .describe(
        'ids that get a −1e9 logit bias in every LM-head distribution — sampling, scoring, training (HF generation_config suppress_tokens, applied everywhere so behaviour and trainer log-probs agree); not written to config.json',
      ),
    slidingWindow: z
      .number()
      .int()
      .positive()
      .nullable()
      .default(null)
      .describe('Mistral sliding-window size; sequences must fit inside it (null = full attention)'),
    mropeSection: z
      .array(z.number().int().positive())
      .length(3)
      .optional()
      .describe(
        'M-RoPE (Qwen2-VL): rotary frequency sections [temporal, height, width] of the decoder (sum = headDim/2), each rotated by its own position id; text tokens have three equal ids, so it is plain RoPE on text',
      ),
    vision: visionConfigSchema
      .optional()
      .describe('vision tower of a vision-language policy (Qwen2-VL layout); absent = text-only'),
    extra: z
      .record(z.string(), z.unknown())
      .optional()
      .describe('config.json keys of the source model not modelled here, written back unchanged'),
    tensorLayout: z
      .enum(TENSOR_LAYOUTS)
      .optional()
      .describe(
        "tensor names of the source checkpoint (hf-layout.ts): flat (model.layers.*, visual.*) or nested (transformers 5's model.language_model.*, model.visual.*); weights and PEFT adapters are written in it (absent = flat)",
      ),
    storedDtype: z
      .enum(['float32', 'bfloat16', 'float16'])
      .optional()
      .describe(
        "the source checkpoint's stored weight dtype (hf-layout.ts weightsLayoutOf): the default of `rlstream export --dtype`; not written to config.json",
      ),
  })
  .strict();

export type ModelConfigInput = z.input<typeof modelConfigSchema>;
export type ModelConfig = Omit<z.output<typeof modelConfigSchema>, 'headDim'> & { readonly headDim: number };

/** Validate and complete a model config; errors name the field and what to fix. */
export function modelConfig(input: ModelConfigInput | ModelConfig): ModelConfig {
  const r = modelConfigSchema.safeParse(input);
  if (!r.success)
    throw new ConfigError(
      `model config: ${r.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ')}`,
    );
  const c = r.data;
  if (c.headDim === undefined && c.hiddenSize % c.numAttentionHeads !== 0)
    throw new ConfigError(
      `model config: hiddenSize ${c.hiddenSize} must be divisible by numAttentionHeads ${c.numAttentionHeads} (or give headDim)`,
    );
  if (c.numAttentionHeads % c.numKeyValueHeads !== 0)
    throw new ConfigError(
      `model config: numAttentionHeads ${c.numAttentionHeads} must be a multiple of numKeyValueHeads ${c.numKeyValueHeads}`,
    );
  const headDim = c.headDim ?? c.hiddenSize / c.numAttentionHeads;
  if (headDim % 2 !== 0) throw new ConfigError(`model config: head dim ${headDim} must be even for rotary embeddings`);
  for (const k of ['bosTokenId', 'eosTokenId', 'padTokenId'] as const) {
    if (c[k] >= c.vocabSize)
      throw new ConfigError(`model config: ${k} ${c[k]} is outside the vocabulary (vocabSize ${c.vocabSize})`);
  }
  for (const e of c.eosTokenIds ?? [])
    if (e >= c.vocabSize)
      throw new ConfigError(`model config: eosTokenIds ${e} is outside the vocabulary (vocabSize ${c.vocabSize})`);
  for (const e of c.suppressTokenIds ?? [])
    if (e >= c.vocabSize)
      throw new ConfigError(`model config: suppressTokenIds ${e} is outside the vocabulary (vocabSize ${c.vocabSize})`);
  if (c.head === 'value' && c.tieWordEmbeddings)
    throw new ConfigError('model config: a value model has no LM head to tie; set tieWordEmbeddings false');
  if (c.ropeScaling?.type === 'llama3' && c.ropeScaling.highFreqFactor <= c.ropeScaling.lowFreqFactor)
    throw new ConfigError(
      `model config: rope scaling llama3 needs highFreqFactor (${c.ropeScaling.highFreqFactor}) > lowFreqFactor (${c.ropeScaling.lowFreqFactor})`,
    );
  const v = c.vision;
  if (v) {
    if (v.outHiddenSize !== c.hiddenSize)
      throw new ConfigError(
        `model config: vision.outHiddenSize ${v.outHiddenSize} must equal the decoder hiddenSize ${c.hiddenSize}`,
      );
    if (v.hiddenSize % v.numHeads !== 0)
      throw new ConfigError(
        `model config: vision.hiddenSize ${v.hiddenSize} must be divisible by vision.numHeads ${v.numHeads}`,
      );
    const vhd = v.hiddenSize / v.numHeads;
    if (vhd % (v.rope === '2d' ? 4 : 2) !== 0)
      throw new ConfigError(
        `model config: vision head dim ${vhd} must be a multiple of ${v.rope === '2d' ? 4 : 2} for ${v.rope} rotary embeddings`,
      );
    for (const k of ['imageTokenId', 'visionStartTokenId', 'visionEndTokenId'] as const) {
      if (v[k] >= c.vocabSize)
        throw new ConfigError(`model config: vision.${k} ${v[k]} is outside the vocabulary (vocabSize ${c.vocabSize})`);
    }
    if (v.windowSize !== null) {
      const f = v.patchSize * v.spatialMergeSize;
      if (v.windowSize % f !== 0 || v.windowSize < f)
        throw new ConfigError(
          `model config: vision.windowSize ${v.windowSize} must be a positive multiple of patchSize × spatialMergeSize = ${f}`,
        );
    }
    for (const i of v.fullattBlockIndexes)
      if (i >= v.depth)
        throw new ConfigError(`model config: vision.fullattBlockIndexes ${i} is not a block (depth ${v.depth})`);
    if (new Set([v.imageTokenId, v.visionStartTokenId, v.visionEndTokenId]).size !== 3)
      throw new ConfigError(
        'model config: vision.imageTokenId, visionStartTokenId and visionEndTokenId must be three different tokens',
      );
  }
  if (c.mropeSection) {
    const sum = c.mropeSection.reduce((a, x) => a + x, 0);
    if (sum !== headDim / 2)
      throw new ConfigError(
        `model config: mropeSection [${c.mropeSection}] must sum to headDim / 2 = ${headDim / 2}, got ${sum}`,
      );
  }
  if (isQwenVl(c) && (!c.vision || !c.mropeSection))
    throw new ConfigError(`model config: model_type ${c.modelType} needs a vision config and mropeSection`);
  if (isQwenVl(c) && !c.attentionBias)
    throw new ConfigError(`model config: model_type ${c.modelType} has q/k/v biases (attentionBias true)`);
  const out: Record<string, unknown> = { ...c, headDim };
  for (const k of ['eosTokenIds', 'suppressTokenIds', 'extra', 'vision', 'mropeSection'] as const)
    if (out[k] === undefined) delete out[k];
  return Object.freeze(out) as ModelConfig;
}

/** Every stop token of the model: eosTokenIds, or [eosTokenId]. */
export function stopTokenIds(c: ModelConfig): number[] {
  return c.eosTokenIds ? [...c.eosTokenIds] : [c.eosTokenId];
}

/** Whether the architecture has Qwen3's per-head RMSNorm on queries and keys (q_norm / k_norm, before RoPE). */
export function hasQkNorm(c: ModelConfig): boolean {
  return c.modelType === 'qwen3';
}

const ARCH: Record<ModelConfig['modelType'], string> = {
  llama: 'Llama',
  mistral: 'Mistral',
  qwen2: 'Qwen2',
  qwen3: 'Qwen3',
  qwen2_vl: 'Qwen2VL',
  qwen2_5_vl: 'Qwen2_5_VL',
};

/** config.json keys this module reads or writes; every other key of a source config is kept in `extra`. */
const MODELLED = new Set([
  'architectures',
  'model_type',
  'hidden_size',
  'intermediate_size',
  'num_hidden_layers',
  'num_attention_heads',
  'num_key_value_heads',
  'head_dim',
  'vocab_size',
  'max_position_embeddings',
  'rms_norm_eps',
  'rope_theta',
  'rope_scaling',
  'rope_parameters',
  'hidden_act',
  'tie_word_embeddings',
  'attention_bias',
  'torch_dtype',
  'dtype',
  'bos_token_id',
  'eos_token_id',
  'pad_token_id',
  'num_labels',
  'id2label',
  'label2id',
  'vision_config',
  'image_token_id',
  'vision_start_token_id',
  'vision_end_token_id',
]);

/** vision_config keys (snake case) ↔ VisionConfig fields; any other vision_config key is refused. */
const VISION_KEYS: Record<
  string,
  Exclude<keyof VisionConfig, 'imageTokenId' | 'visionStartTokenId' | 'visionEndTokenId'>
> = {
  depth: 'depth',
  hidden_size: 'hiddenSize',
  intermediate_size: 'intermediateSize',
  num_heads: 'numHeads',
  out_hidden_size: 'outHiddenSize',
  patch_size: 'patchSize',
  temporal_patch_size: 'temporalPatchSize',
  spatial_merge_size: 'spatialMergeSize',
  layer_norm_eps: 'layerNormEps',
  rope: 'rope',
  rope_theta: 'ropeTheta',
};
/** vision_config keys accepted when they state what this engine computes anyway. */
const VISION_FIXED: Record<string, unknown> = { in_channels: 3, in_chans: 3, hidden_act: 'quick_gelu' };
const VISION_IGNORED = new Set(['model_type', 'initializer_range', 'torch_dtype', 'dtype']);

function visionToHf(v: VisionConfig): Record<string, unknown> {
  const out: Record<string, unknown> = { model_type: 'rlstream_vision', in_channels: 3, hidden_act: 'quick_gelu' };
  for (const [k, f] of Object.entries(VISION_KEYS)) out[k] = v[f];
  return out;
}

function visionFromHf(j: Record<string, unknown>): VisionConfigInput | null {
  const vc = j.vision_config;
  if (vc === undefined || vc === null) return null;
  if (typeof vc !== 'object' || Array.isArray(vc))
    throw new ConfigError(`config.json: "vision_config" must be an object, got ${JSON.stringify(vc)}`);
  const bad = Object.keys(vc).filter(
    (k) =>
      !(k in VISION_KEYS) &&
      !VISION_IGNORED.has(k) &&
      !(k in VISION_FIXED && (vc as Record<string, unknown>)[k] === VISION_FIXED[k]),
  );
  if (bad.length)
    throw unsupported(
      `vision_config ${bad.map((k) => `${k}=${JSON.stringify((vc as Record<string, unknown>)[k])}`).join(', ')}`,
      `supported keys: ${Object.keys(VISION_KEYS).join(', ')}; in_channels 3, hidden_act quick_gelu`,
    );
  const out: Record<string, unknown> = {};
  for (const [k, f] of Object.entries(VISION_KEYS))
    if ((vc as Record<string, unknown>)[k] !== undefined) out[f] = (vc as Record<string, unknown>)[k];
  out.imageTokenId = j.image_token_id;
  out.visionStartTokenId = j.vision_start_token_id;
  out.visionEndTokenId = j.vision_end_token_id;
  return out as VisionConfigInput;
}

/** vision_config keys of Qwen2.5-VL (transformers Qwen2_5_VLVisionConfig) ↔ VisionConfig fields. */
const QWEN25_VISION_KEYS = {
  depth: 'depth',
  hidden_size: 'hiddenSize',
  intermediate_size: 'intermediateSize',
  num_heads: 'numHeads',
  out_hidden_size: 'outHiddenSize',
  patch_size: 'patchSize',
  temporal_patch_size: 'temporalPatchSize',
  spatial_merge_size: 'spatialMergeSize',
  window_size: 'windowSize',
  fullatt_block_indexes: 'fullattBlockIndexes',
} as const;
/** vision_config keys of Qwen2-VL (Qwen2VLVisionConfig); hidden_size is the merger's output (the decoder width). */
const QWEN2_VISION_KEYS = {
  depth: 'depth',
  embed_dim: 'hiddenSize',
  num_heads: 'numHeads',
  hidden_size: 'outHiddenSize',
  patch_size: 'patchSize',
  temporal_patch_size: 'temporalPatchSize',
  spatial_merge_size: 'spatialMergeSize',
} as const;

function qwenVisionFromHf(j: Record<string, unknown>, mt: 'qwen2_vl' | 'qwen2_5_vl'): VisionConfigInput {
  const vc = j.vision_config;
  if (!vc || typeof vc !== 'object' || Array.isArray(vc))
    throw new ConfigError(`config.json: model_type ${mt} needs a "vision_config" object, got ${JSON.stringify(vc)}`);
  const v = vc as Record<string, unknown>;
  const keys: Record<string, string> = mt === 'qwen2_5_vl' ? QWEN25_VISION_KEYS : QWEN2_VISION_KEYS;
  const act = mt === 'qwen2_5_vl' ? 'silu' : 'quick_gelu';
  const bad = (k: string, want: string) =>
    unsupported(`vision_config ${k}=${JSON.stringify(v[k])}`, `${mt} supports ${k} ${want}`);
  if (v.hidden_act !== undefined && v.hidden_act !== act) throw bad('hidden_act', JSON.stringify(act));
  for (const k of ['in_channels', 'in_chans']) if (v[k] !== undefined && v[k] !== 3) throw bad(k, '3');
  if (v.spatial_patch_size !== undefined && v.spatial_patch_size !== (v.patch_size ?? 14))
    throw bad('spatial_patch_size', 'equal to patch_size');
  const out: Record<string, unknown> = { rope: '2d', ropeTheta: 10000, layerNormEps: 1e-6 };
  for (const [k, f] of Object.entries(keys)) {
    const x = v[k];
    if (x === undefined) continue;
    if (k === 'fullatt_block_indexes' ? !Array.isArray(x) : typeof x !== 'number')
      throw new ConfigError(
        `config.json: vision_config "${k}" must be a ${k === 'fullatt_block_indexes' ? 'list of block indexes' : 'number'}, got ${JSON.stringify(x)}`,
      );
    out[f] = x;
  }
  for (const k of ['depth', mt === 'qwen2_5_vl' ? 'hidden_size' : 'embed_dim', 'num_heads'])
    if (typeof v[k] !== 'number')
      throw new ConfigError(`config.json: vision_config "${k}" must be a number, got ${JSON.stringify(v[k])}`);
  if (mt === 'qwen2_5_vl') {
    Object.assign(out, { norm: 'rmsnorm', mlp: 'silu_glu' });
    if (typeof v.intermediate_size !== 'number')
      throw new ConfigError(
        `config.json: vision_config "intermediate_size" must be a number, got ${JSON.stringify(v.intermediate_size)}`,
      );
    out.windowSize ??= 112;
    out.outHiddenSize ??= j.hidden_size;
  } else {
    const ratio = v.mlp_ratio ?? 4;
    if (typeof ratio !== 'number') throw bad('mlp_ratio', 'a number');
    out.intermediateSize = Math.round((v.embed_dim as number) * ratio);
    out.outHiddenSize ??= j.hidden_size;
  }
  const modelled = new Set([
    ...Object.keys(keys),
    'hidden_act',
    'in_channels',
    'in_chans',
    'spatial_patch_size',
    'mlp_ratio',
  ]);
  const hfExtra = Object.fromEntries(Object.entries(v).filter(([k]) => !modelled.has(k)));
  if (Object.keys(hfExtra).length) out.hfExtra = hfExtra;
  out.imageTokenId = j.image_token_id;
  out.visionStartTokenId = j.vision_start_token_id;
  out.visionEndTokenId = j.vision_end_token_id;
  return out as VisionConfigInput;
}

function qwen25VisionToHf(v: VisionConfig): Record<string, unknown> {
  const out: Record<string, unknown> = { ...(v.hfExtra ?? {}), hidden_act: 'silu', in_chans: 3 };
  for (const [k, f] of Object.entries(QWEN25_VISION_KEYS)) out[k] = v[f];
  out.spatial_patch_size = v.patchSize;
  return out;
}

function qwen2VisionToHf(v: VisionConfig, hidden: number): Record<string, unknown> {
  const out: Record<string, unknown> = { ...(v.hfExtra ?? {}), hidden_act: 'quick_gelu', in_chans: 3 };
  for (const [k, f] of Object.entries(QWEN2_VISION_KEYS)) out[k] = v[f];
  out.hidden_size = hidden;
  out.mlp_ratio = v.intermediateSize / v.hiddenSize;
  return out;
}

export type { HfDtype };

/**
 * Hugging Face `config.json` for this model: the source model's other keys (`extra`) kept, the
 * modelled ones written from the config, and the stored dtype stated (`torch_dtype` for
 * transformers 4.x, `dtype` for 5.x).
 */
export function toHfConfig(c: ModelConfig, dtype: HfDtype = 'float32'): Record<string, unknown> {
  const out: Record<string, unknown> = { ...(c.extra ?? {}) };
  // q/k/v biases without an o_proj bias are Qwen2's layout: HF's llama reads attention_bias as a
  // bias on all four projections, so a fresh llama-type model with q/k/v biases is written as qwen2
  const modelType = c.attentionBias && c.modelType === 'llama' ? 'qwen2' : c.modelType;
  const vl = isQwenVl(c);
  Object.assign(out, {
    architectures: [
      `${ARCH[modelType]}${vl ? 'ForConditionalGeneration' : c.head === 'value' ? 'ForTokenClassification' : 'ForCausalLM'}`,
    ],
    model_type: modelType,
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
    torch_dtype: dtype,
    dtype,
    bos_token_id: c.bosTokenId,
    eos_token_id: c.eosTokenIds ? (c.eosTokenIds.length === 1 ? c.eosTokenIds[0] : [...c.eosTokenIds]) : c.eosTokenId,
    pad_token_id: c.padTokenId,
  });
  const rs = c.ropeScaling;
  if (rs?.type === 'linear') out.rope_scaling = { rope_type: 'linear', factor: rs.factor };
  else if (rs?.type === 'llama3')
    out.rope_scaling = {
      rope_type: 'llama3',
      factor: rs.factor,
      low_freq_factor: rs.lowFreqFactor,
      high_freq_factor: rs.highFreqFactor,
      original_max_position_embeddings: rs.originalMaxPositionEmbeddings,
    };
  if (c.modelType === 'mistral') out.sliding_window = c.slidingWindow;
  if (c.mropeSection) out.rope_scaling = { type: 'mrope', mrope_section: [...c.mropeSection] };
  if (vl) {
    // transformers' Qwen2(.5)-VL attention reads neither: head_dim is hidden/heads, q/k/v always biased
    delete out.head_dim;
    delete out.attention_bias;
  }
  if (c.vision) {
    out.vision_config =
      c.modelType === 'qwen2_5_vl'
        ? qwen25VisionToHf(c.vision)
        : c.modelType === 'qwen2_vl'
          ? qwen2VisionToHf(c.vision, c.hiddenSize)
          : visionToHf(c.vision);
    out.image_token_id = c.vision.imageTokenId;
    out.vision_start_token_id = c.vision.visionStartTokenId;
    out.vision_end_token_id = c.vision.visionEndTokenId;
  }
  if (c.head === 'value') {
    out.num_labels = 1;
    out.id2label = { 0: 'LABEL_0' };
    out.label2id = { LABEL_0: 0 };
  }
  return out;
}

const unsupported = (what: string, hint = ''): ConfigError =>
  new ConfigError(`config.json: ${what} is not supported${hint ? ` (${hint})` : ''}`);

function ropeScalingFrom(j: Record<string, unknown>): { theta: number | undefined; scaling: RopeScaling | null } {
  // transformers ≥ 5 writes rope_parameters {rope_type, rope_theta, ...}; 4.x rope_theta + rope_scaling {rope_type | type, ...}
  const params =
    j.rope_parameters && typeof j.rope_parameters === 'object' ? (j.rope_parameters as Record<string, unknown>) : null;
  const rs = (j.rope_scaling && typeof j.rope_scaling === 'object' ? j.rope_scaling : params) as Record<
    string,
    unknown
  > | null;
  const theta =
    typeof j.rope_theta === 'number'
      ? j.rope_theta
      : typeof params?.rope_theta === 'number'
        ? params.rope_theta
        : undefined;
  if (!rs) return { theta, scaling: null };
  const type = rs.rope_type ?? rs.type ?? 'default';
  const num = (k: string): number => {
    if (typeof rs[k] !== 'number')
      throw new ConfigError(
        `config.json: rope_scaling ${JSON.stringify(type)} needs a number "${k}", got ${JSON.stringify(rs[k])}`,
      );
    return rs[k] as number;
  };
  if (type === 'default') return { theta, scaling: null };
  if (type === 'linear') return { theta, scaling: { type: 'linear', factor: num('factor') } };
  if (type === 'llama3')
    return {
      theta,
      scaling: {
        type: 'llama3',
        factor: num('factor'),
        lowFreqFactor: num('low_freq_factor'),
        highFreqFactor: num('high_freq_factor'),
        originalMaxPositionEmbeddings: num('original_max_position_embeddings'),
      },
    };
  throw unsupported(`rope_scaling type ${JSON.stringify(type)}`, 'supported: linear, llama3');
}

/**
 * Parse a Hugging Face `config.json` object (model_type llama, mistral, qwen2 or qwen3). A key
 * or value that would change the computation in a way this engine does not implement is refused
 * with one line naming it. `generation` (generation_config.json) adds its eos_token_id(s) to the
 * stop tokens.
 */
export function fromHfConfig(j0: Record<string, unknown>, generation?: Record<string, unknown> | null): ModelConfig {
  const need = (k: string): number => {
    const v = j[k];
    if (typeof v !== 'number') throw new ConfigError(`config.json: "${k}" must be a number, got ${JSON.stringify(v)}`);
    return v;
  };
  const modelType = j0.model_type;
  // transformers ≥ 4.52 may nest the decoder's keys under text_config; the top level wins
  const j: Record<string, unknown> =
    j0.text_config && typeof j0.text_config === 'object' && !Array.isArray(j0.text_config)
      ? { ...(j0.text_config as Record<string, unknown>), ...j0 }
      : j0;
  if (!(MODEL_TYPES as readonly unknown[]).includes(modelType))
    throw unsupported(`model_type ${JSON.stringify(modelType)}`, `supported: ${MODEL_TYPES.join(', ')}`);
  const mt = modelType as ModelConfig['modelType'];
  const vl = mt === 'qwen2_vl' || mt === 'qwen2_5_vl';
  if (j.hidden_act !== undefined && j.hidden_act !== 'silu')
    throw unsupported(`hidden_act ${JSON.stringify(j.hidden_act)}`, 'only "silu"');
  if (j.mlp_bias === true) throw unsupported('mlp_bias true');
  if (j.attention_bias === true && mt !== 'qwen2' && mt !== 'qwen2_vl' && mt !== 'qwen2_5_vl')
    throw unsupported(`attention_bias true for model_type ${mt}`, 'it adds an o_proj bias');
  if (j.quantization_config !== undefined && j.quantization_config !== null)
    throw unsupported('quantization_config', 'a quantized model; use the unquantized bf16/f16/f32 weights');
  if (j.use_sliding_window === true) throw unsupported('use_sliding_window true');
  if (Array.isArray(j.layer_types) && j.layer_types.some((t) => t !== 'full_attention'))
    throw unsupported(`layer_types ${JSON.stringify([...new Set(j.layer_types)])}`, 'only "full_attention"');
  if (typeof j.pretraining_tp === 'number' && j.pretraining_tp !== 1)
    throw unsupported(`pretraining_tp ${j.pretraining_tp}`, 'only 1');
  const archs = Array.isArray(j.architectures) ? (j.architectures as unknown[]).map(String) : [];
  const head = archs.some((a) => a.endsWith('ForTokenClassification') || a.endsWith('ForSequenceClassification'))
    ? 'value'
    : 'lm';
  const hidden = need('hidden_size'),
    heads = need('num_attention_heads');
  const headDim = vl ? undefined : typeof j.head_dim === 'number' ? j.head_dim : mt === 'qwen3' ? 128 : undefined;
  let mropeSection: number[] | undefined;
  if (vl) {
    // Qwen2-VL's M-RoPE: rope_scaling {type: "mrope" (or "default"), mrope_section: [t, h, w]}
    const rs = (j.rope_scaling ?? j.rope_parameters) as Record<string, unknown> | undefined;
    const sec = rs && typeof rs === 'object' ? rs.mrope_section : undefined;
    if (!Array.isArray(sec) || sec.length !== 3 || !sec.every((x) => Number.isInteger(x) && x > 0))
      throw new ConfigError(
        `config.json: model_type ${mt} needs rope_scaling.mrope_section [t, h, w], got ${JSON.stringify(sec)}`,
      );
    const type = rs!.rope_type ?? rs!.type ?? 'default';
    if (type !== 'mrope' && type !== 'default')
      throw unsupported(`rope_scaling type ${JSON.stringify(type)} for ${mt}`, 'only "mrope" (default)');
    mropeSection = sec as number[];
  }
  const { theta, scaling } = vl
    ? { theta: typeof j.rope_theta === 'number' ? j.rope_theta : undefined, scaling: null }
    : ropeScalingFrom(j);
  const idList = (v: unknown): number[] =>
    (Array.isArray(v) ? v : typeof v === 'number' ? [v] : []).filter((x): x is number => typeof x === 'number');
  const eosList = idList(j.eos_token_id);
  if (!eosList.length)
    throw new ConfigError(
      `config.json: "eos_token_id" must be a number or a list of numbers, got ${JSON.stringify(j.eos_token_id)}`,
    );
  const allEos = [...new Set([...eosList, ...idList(generation?.eos_token_id)])];
  const bos =
    typeof j.bos_token_id === 'number'
      ? j.bos_token_id
      : typeof generation?.bos_token_id === 'number'
        ? generation.bos_token_id
        : eosList[0];
  const pad =
    typeof j.pad_token_id === 'number'
      ? j.pad_token_id
      : typeof generation?.pad_token_id === 'number'
        ? generation.pad_token_id
        : eosList[0];
  const extra: Record<string, unknown> = {};
  const vision = vl ? qwenVisionFromHf(j, mt) : visionFromHf(j);
  for (const [k, v] of Object.entries(j0))
    if (!MODELLED.has(k) && !(mt === 'mistral' && k === 'sliding_window')) extra[k] = v;
  return modelConfig({
    modelType: mt,
    head,
    hiddenSize: hidden,
    intermediateSize: need('intermediate_size'),
    numHiddenLayers: need('num_hidden_layers'),
    numAttentionHeads: heads,
    numKeyValueHeads: typeof j.num_key_value_heads === 'number' ? j.num_key_value_heads : heads,
    ...(headDim !== undefined ? { headDim } : {}),
    vocabSize: need('vocab_size'),
    maxPositionEmbeddings: need('max_position_embeddings'),
    rmsNormEps: typeof j.rms_norm_eps === 'number' ? j.rms_norm_eps : 1e-6,
    ropeTheta: theta ?? 10000,
    ropeScaling: scaling,
    tieWordEmbeddings: j.tie_word_embeddings === true,
    attentionBias: vl || (mt === 'qwen2' ? j.attention_bias !== false : false),
    ...(mropeSection ? { mropeSection } : {}),
    bosTokenId: bos,
    eosTokenId: eosList[0],
    ...(allEos.length > 1 || Array.isArray(j.eos_token_id) ? { eosTokenIds: allEos } : {}),
    padTokenId: pad,
    slidingWindow: mt === 'mistral' && typeof j.sliding_window === 'number' ? j.sliding_window : null,
    ...(vision ? { vision } : {}),
    ...(Object.keys(extra).length ? { extra } : {}),
  });
}
