/**
 * Exports the model engine's value model (a Llama/Qwen2 trunk with the `score.weight` head) as an
 * ONNX sequence scorer for `reward.type: model` / `rlstream reward-server --scorer x.onnx`:
 *
 *   inputs  input_ids [B, T] int64, attention_mask [B, T] int64 (right-padded, 1 = real token)
 *   output  score [B] float32 = V(sequence) read at the last real token, position Σ_t mask[b,t] − 1
 *
 * The weights are baked in as initializers. With right padding and causal attention, the hidden
 * state at a real token never sees the padding, so the score of a row does not depend on what it
 * was batched with.
 *
 * The model declares what it accepts in its metadata_props (read by onnx-scorer.ts):
 * `vocab_size` (token ids must be below it — the vocabulary of the tokenizer the value model was
 * built for), `max_sequence_length` (= maxPositionEmbeddings, the rotary tables' length) and
 * `pad_token_id`; the reward stage refuses a sequence outside them instead of feeding it.
 */
import { writeFileSync } from 'node:fs';
import onnxProto from 'onnx-proto';
import { SCORER_METADATA_KEYS } from './onnx-scorer.ts';
import { ConfigError } from '../errors.ts';
import { GraphBuilder } from '../onnx/builder.ts';
import type { ModelConfig } from '../model/config.ts';
import { declareParams, llamaForward, valueHead } from '../model/llama.ts';
import { validateWeights, type Weights } from '../model/params.ts';
import { loadCheckpoint } from '../model/checkpoint.ts';

export function buildValueSequenceScorer(c: ModelConfig, weights: Weights): Uint8Array {
  if (c.head !== 'value')
    throw new ConfigError(
      'value scorer export: needs a value model (head "value"); a policy (head "lm") has no score head',
    );
  validateWeights(c, weights, 'value scorer export weights');
  const b = new GraphBuilder({ name: 'value_sequence_scorer' });
  const p = declareParams(b, c, weights);
  const ids = b.input('input_ids', 'int64', ['B', 'T']);
  const mask = b.input('attention_mask', 'int64', ['B', 'T']);
  const { hidden } = llamaForward(b, c, p, { ids }); // [B·T, D]
  // flat row of the last real token of each sequence: b·T + (Σ_t mask[b,t] − 1)
  const lengths = b.reduceSum(mask, [1]); // [B]
  const last = b.sub(lengths, b.const(1, 'int64'));
  const rowStart = b.mul(b.range('B'), b.reshape(b.dimTensor('T'), [])); // [B]
  const rows = b.add(rowStart, last);
  const h = b.gather(hidden, rows); // [B, D]
  b.output(valueHead(b, c, p, h), 'score'); // [B]
  const model = b.toModelProto();
  model.metadataProps = [
    { key: SCORER_METADATA_KEYS.vocabSize, value: String(c.vocabSize) },
    { key: SCORER_METADATA_KEYS.maxSequenceLength, value: String(c.maxPositionEmbeddings) },
    { key: SCORER_METADATA_KEYS.padTokenId, value: String(c.padTokenId) },
  ];
  return onnxProto.onnx.ModelProto.encode(model).finish();
}

/** Writes the scorer for a model checkpoint directory (config.json + model.safetensors) to `out`. */
export async function exportValueSequenceScorer(checkpointDir: string, out: string): Promise<void> {
  const ck = await loadCheckpoint(checkpointDir);
  writeFileSync(out, buildValueSequenceScorer(ck.config, ck.weights));
}
