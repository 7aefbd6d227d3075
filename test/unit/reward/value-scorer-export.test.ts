/**
 * The model engine's value model exported as an ONNX sequence scorer: its score is the value
 * model's value at the last real token (checked against lib/model's ValueScorer), independent of
 * batching and padding, it declares what it accepts (vocabulary, length, pad id), and it runs as
 * `reward.type: model` on a trajectory's token ids through onnxruntime-node.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { modelConfig, type ModelConfigInput } from '../../../lib/model/config.ts';
import { initWeights } from '../../../lib/model/init.ts';
import { ValueScorer } from '../../../lib/model/value.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { saveCheckpoint } from '../../../lib/model/checkpoint.ts';
import { buildValueSequenceScorer, exportValueSequenceScorer } from '../../../lib/reward/value-scorer-export.ts';
import { createModelRewardScorer, loadOnnxSequenceScorer, readOnnxMetadata } from '../../../lib/reward/onnx-scorer.ts';
import { ConfigError } from '../../../lib/errors.ts';

// a tiny value model over the byte tokenizer's vocabulary (256 bytes + PAD/BOS/EOS)
const base: ModelConfigInput = {
  head: 'value',
  hiddenSize: 32,
  intermediateSize: 48,
  numHiddenLayers: 2,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  vocabSize: 259,
  maxPositionEmbeddings: 64,
  bosTokenId: 257,
  eosTokenId: 258,
  padTokenId: 256,
  attentionBias: true,
};
const cfg = modelConfig(base);
const W = initWeights(cfg, 11, { std: 0.3 });
let dir = '';
let path = '';
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'rl-value-scorer-'));
  path = join(dir, 'value.onnx');
  writeFileSync(path, buildValueSequenceScorer(cfg, W));
});
after(() => rmSync(dir, { recursive: true, force: true }));

test("score = the value model's value at the last real token, whatever the batch and padding", async () => {
  const s = await loadOnnxSequenceScorer({ path, padId: cfg.padTokenId });
  const seqs = [[72, 101, 108, 108, 111], [33, 34], [1, 2, 3, 4, 5, 6, 7, 8, 9], [200]];
  const batched = await s.rawScores(seqs);
  const alone = await Promise.all(seqs.map(async (q) => (await s.rawScores([q]))[0]));
  // ValueScorer gives V(prompt, response[<j]) for each response token j: with response = rest ⧺ [any],
  // its last value is read at the sequence's last position.
  const ref = await new ValueScorer(cfg, { threads: 1, cache: new SessionCache() }).values(
    W,
    seqs.map((q) => ({ prompt: q.slice(0, 1), response: [...q.slice(1), 0] })),
  );
  seqs.forEach((_, i) => {
    assert.ok(Math.abs(batched[i] - ref[i][ref[i].length - 1]) < 1e-5, `row ${i}: ${batched[i]} vs ${ref[i].at(-1)}`);
    assert.ok(Math.abs(batched[i] - alone[i]) < 1e-5);
  });
  assert.ok(new Set(batched.map((x) => x.toFixed(6))).size === seqs.length, 'scores differ between sequences');
  await s.close();
});

test('declares its vocabulary, maximum length and pad id; refuses ids and lengths outside them', async () => {
  assert.deepEqual(readOnnxMetadata(readFileSync(path)), {
    vocab_size: '259',
    max_sequence_length: '64',
    pad_token_id: '256',
  });
  const s = await loadOnnxSequenceScorer({ path, padId: 0 });
  assert.deepEqual(s.limits, { vocabSize: 259, maxSequenceLength: 64, padTokenId: 256, padId: 256 });
  assert.match(s.problem([1, 259])!, /token id 259 at position 1 is outside the reward model's vocabulary \[0, 259\)/);
  assert.match(
    s.problem(new Array(65).fill(3))!,
    /sequence of 65 tokens is longer than the 64 the reward model accepts/,
  );
  assert.equal(s.problem(new Array(64).fill(3)), null);
  await s.close();
});

test("from a checkpoint directory, run as reward.type: model on the trajectory's token ids (prompt ⧺ response, sigmoid)", async () => {
  const ck = join(dir, 'ckpt');
  await saveCheckpoint(ck, cfg, W);
  const out = join(dir, 'from-ckpt.onnx');
  await exportValueSequenceScorer(ck, out);
  const m = await createModelRewardScorer(
    { path: out, transform: 'sigmoid', scale: 1, threshold: null },
    { padId: cfg.padTokenId },
  );
  const ids = (...x: number[]) => Int32Array.from(x);
  const outs = await m.scoreBatch([
    {
      id: 'a',
      step: 0,
      prompt_text: '2+2=',
      response_text: '4',
      prompt_ids: ids(257, 5, 6, 7),
      response_ids: ids(8, 258),
    },
    {
      id: 'b',
      step: 0,
      prompt_text: '2+2=',
      response_text: '5',
      prompt_ids: ids(257, 5, 6, 7),
      response_ids: ids(9, 258),
    },
    { id: 'c', step: 0, prompt_text: '2+2=', response_text: '6', prompt_ids: ids(257, 5), response_ids: ids(300) },
  ]);
  await m.close();
  const direct = await loadOnnxSequenceScorer({ path, padId: cfg.padTokenId });
  const raw = await direct.rawScores([
    [257, 5, 6, 7, 8, 258],
    [257, 5, 6, 7, 9, 258],
  ]);
  await direct.close();
  assert.ok(Math.abs(raw[0] - raw[1]) > 1e-6, 'the response ids change the score');
  raw.forEach((r, i) => {
    const o = outs[i];
    assert.ok(o.ok, JSON.stringify(o));
    assert.ok(Math.abs(o.reward - 1 / (1 + Math.exp(-r))) < 1e-6);
    assert.ok(Math.abs((o.details.score_raw as number) - r) < 1e-6);
  });
  assert.ok(
    !outs[2].ok &&
      /token id 300 at position 2 is outside the reward model's vocabulary \[0, 259\)/.test(outs[2].reason),
    JSON.stringify(outs[2]),
  );
});

test('a policy model cannot be exported as a value scorer', () => {
  const { headDim: _hd, ...rest } = cfg;
  const policy = modelConfig({ ...rest, head: 'lm' });
  assert.throws(
    () => buildValueSequenceScorer(policy, initWeights(policy, 1)),
    (e: Error) => e instanceof ConfigError && /needs a value model/.test(e.message),
  );
});
