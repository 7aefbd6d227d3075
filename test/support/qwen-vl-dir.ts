/**
 * A small random-weight Qwen2.5-VL (or Qwen2-VL) directory laid out as Hugging Face saves one
 * (for tests): config.json in transformers' flat layout with `vision_config` and
 * rope_scaling {type: mrope}, bf16 weights over two shards with the checkpoint's tensor names,
 * preprocessor_config.json, chat_template.json and the real Qwen tokenizer files (which include
 * the vision tokens). Every structural feature is present at a tiny shape: grouped-query attention,
 * M-RoPE sections, a windowed and a full-attention vision block (Qwen2.5-VL), a 2×2 merger.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fromHfConfig } from '../../lib/model/config.ts';
import { initWeights } from '../../lib/model/init.ts';
import { paramSpecs, type Weights } from '../../lib/model/params.ts';
import { preprocessorJson } from '../../lib/model/processor.ts';
import type { ModelConfig } from '../../lib/model/config.ts';
import { Rng } from '../../lib/util/rng.ts';
import { QWEN3_TOKENIZER_DIR, writeHfModelDir } from './hf-model-dir.ts';

export const QWEN_VL_TOKENS = { imagePad: 151655, visionStart: 151652, visionEnd: 151653, imEnd: 151645 } as const;

/** A chat template in Qwen-VL's message format: string content, or a list of {type: text | image} parts. */
export const QWEN_VL_CHAT_TEMPLATE = [
  '{%- for m in messages -%}',
  "{{ '<|im_start|>' + m.role + '\\n' }}",
  '{%- if m.content is string -%}{{ m.content }}',
  '{%- else -%}{%- for c in m.content -%}',
  "{%- if c.type == 'image' -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{%- else -%}{{ c.text }}{%- endif -%}",
  '{%- endfor -%}{%- endif -%}',
  "{{ '<|im_end|>\\n' }}",
  '{%- endfor -%}',
  "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}",
].join('');

export function qwenVlHfConfig(modelType: 'qwen2_5_vl' | 'qwen2_vl' = 'qwen2_5_vl'): Record<string, unknown> {
  const vision =
    modelType === 'qwen2_5_vl'
      ? {
          depth: 2,
          hidden_act: 'silu',
          hidden_size: 16,
          intermediate_size: 24,
          num_heads: 2,
          in_chans: 3,
          out_hidden_size: 64,
          patch_size: 4,
          spatial_merge_size: 2,
          spatial_patch_size: 4,
          window_size: 16,
          fullatt_block_indexes: [1],
          tokens_per_second: 2,
          temporal_patch_size: 2,
        }
      : {
          depth: 2,
          embed_dim: 16,
          mlp_ratio: 1.5,
          num_heads: 2,
          in_chans: 3,
          hidden_size: 64,
          hidden_act: 'quick_gelu',
          patch_size: 4,
          spatial_merge_size: 2,
          temporal_patch_size: 2,
        };
  return {
    architectures: [
      modelType === 'qwen2_5_vl' ? 'Qwen2_5_VLForConditionalGeneration' : 'Qwen2VLForConditionalGeneration',
    ],
    attention_dropout: 0,
    bos_token_id: 151643,
    eos_token_id: QWEN_VL_TOKENS.imEnd,
    vision_start_token_id: QWEN_VL_TOKENS.visionStart,
    vision_end_token_id: QWEN_VL_TOKENS.visionEnd,
    vision_token_id: 151654,
    image_token_id: QWEN_VL_TOKENS.imagePad,
    video_token_id: 151656,
    hidden_act: 'silu',
    hidden_size: 64,
    initializer_range: 0.02,
    intermediate_size: 96,
    max_position_embeddings: 512,
    max_window_layers: 2,
    model_type: modelType,
    num_attention_heads: 4,
    num_hidden_layers: 2,
    num_key_value_heads: 2,
    rms_norm_eps: 1e-6,
    rope_theta: 1000000,
    sliding_window: 32768,
    tie_word_embeddings: true,
    use_cache: true,
    use_sliding_window: false,
    vision_config: vision,
    rope_scaling: { type: 'mrope', mrope_section: [2, 3, 3] },
    vocab_size: 151936,
  };
}

/** Writes the directory; returns its config and f32 weights (bf16-representable, as stored). */
export function writeQwenVlDir(
  dir: string,
  o: { modelType?: 'qwen2_5_vl' | 'qwen2_vl'; seed?: number } = {},
): { config: ModelConfig; weights: Weights } {
  const j = qwenVlHfConfig(o.modelType);
  const config = fromHfConfig(j);
  const seed = o.seed ?? 1;
  const weights = initWeights(config, seed, { std: 0.2 });
  const rng = Rng.fromSeed(`qwen-vl-dir:${seed}`);
  for (const s of paramSpecs(config)) {
    const a = weights.get(s.name)!;
    // norms near 1 and biases near 0 but not exactly, so a missing or misplaced one shows
    if (/norm\d?\.weight$|layernorm\.weight$|ln_q\.weight$|\.bias$/.test(s.name))
      for (let i = 0; i < a.length; i++) a[i] = (s.name.endsWith('.bias') ? 0 : 1) + 0.2 * (rng.next() - 0.5);
    // stored bf16: round here so the returned weights are what a loader reads
    const u = new Uint32Array(a.buffer, a.byteOffset, a.length);
    for (let i = 0; i < u.length; i++) u[i] = ((u[i] + 0x7fff + ((u[i] >>> 16) & 1)) >>> 16) << 16;
  }
  writeHfModelDir(dir, {
    config: j,
    generation: { bos_token_id: 151643, eos_token_id: [QWEN_VL_TOKENS.imEnd, 151643], pad_token_id: 151643 },
    tensors: paramSpecs(config).map((s) => [s.name, s.shape]),
    weights,
    dtype: 'bfloat16',
    shards: 2,
    tokenizerFrom: QWEN3_TOKENIZER_DIR,
  });
  writeFileSync(
    join(dir, 'preprocessor_config.json'),
    JSON.stringify(preprocessorJson(config, 16 * 16, 64 * 64), null, 2),
  );
  writeFileSync(join(dir, 'chat_template.json'), JSON.stringify({ chat_template: QWEN_VL_CHAT_TEMPLATE }, null, 2));
  return { config, weights };
}
