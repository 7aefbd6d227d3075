/**
 * The model engine's value model exported as an ONNX sequence scorer: its score is the value
 * model's value at the last real token (checked against lib/model's ValueScorer), independent of
 * batching and padding, and it runs as `reward.type: model` through onnxruntime-node.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { modelConfig, type ModelConfigInput } from '../../../lib/model/config.ts';
import { initWeights } from '../../../lib/model/init.ts';
import { ValueScorer } from '../../../lib/model/value.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { saveCheckpoint } from '../../../lib/model/checkpoint.ts';
import { buildValueSequenceScorer, exportValueSequenceScorer } from '../../../lib/reward/value-scorer-export.ts';
import { byteTokenize, createModelRewardScorer, loadOnnxSequenceScorer } from '../../../lib/reward/onnx-scorer.ts';
import { ConfigError } from '../../../lib/errors.ts';

// a tiny value model over the byte tokenizer's vocabulary (256 bytes + PAD/BOS/EOS)
const base: ModelConfigInput = {
  head: 'value', hiddenSize: 32, intermediateSize: 48, numHiddenLayers: 2, numAttentionHeads: 4, numKeyValueHeads: 2,
  vocabSize: 259, maxPositionEmbeddings: 64, bosTokenId: 257, eosTokenId: 258, padTokenId: 256, attentionBias: true,
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

test('score = the value model\'s value at the last real token, whatever the batch and padding', async () => {
  const s = await loadOnnxSequenceScorer({ path, padId: cfg.padTokenId });
  const seqs = [[72, 101, 108, 108, 111], [33, 34], [1, 2, 3, 4, 5, 6, 7, 8, 9], [200]];
  const batched = await s.rawScores(seqs);
  const alone = await Promise.all(seqs.map(async (q) => (await s.rawScores([q]))[0]));
  // ValueScorer gives V(prompt, response[<j]) for each response token j: with response = rest ⧺ [any],
  // its last value is read at the sequence's last position.
  const ref = await new ValueScorer(cfg, { threads: 1, cache: new SessionCache() }).values(W, seqs.map((q) => ({ prompt: q.slice(0, 1), response: [...q.slice(1), 0] })));
  seqs.forEach((_, i) => {
    assert.ok(Math.abs(batched[i] - ref[i][ref[i].length - 1]) < 1e-5, `row ${i}: ${batched[i]} vs ${ref[i].at(-1)}`);
    assert.ok(Math.abs(batched[i] - alone[i]) < 1e-5);
  });
  assert.ok(new Set(batched.map((x) => x.toFixed(6))).size === seqs.length, 'scores differ between sequences');
  await s.close();
});

test('from a checkpoint directory, run as reward.type: model (prompt ⧺ response, sigmoid)', async () => {
  const ck = join(dir, 'ckpt');
  await saveCheckpoint(ck, cfg, W);
  const out = join(dir, 'from-ckpt.onnx');
  await exportValueSequenceScorer(ck, out);
  const m = await createModelRewardScorer({ path: out, transform: 'sigmoid', scale: 1, threshold: null }, { padId: cfg.padTokenId, maxLength: cfg.maxPositionEmbeddings });
  const outs = await m.scoreBatch([{ id: 'a', step: 0, prompt_text: '2+2=', response_text: '4' }, { id: 'b', step: 0, prompt_text: '2+2=', response_text: '5' }]);
  await m.close();
  const direct = await loadOnnxSequenceScorer({ path, padId: cfg.padTokenId });
  const raw = await direct.rawScores([byteTokenize('2+2=4'), byteTokenize('2+2=5')]);
  await direct.close();
  outs.forEach((o, i) => {
    assert.ok(o.ok);
    assert.ok(Math.abs(o.reward - 1 / (1 + Math.exp(-raw[i]))) < 1e-6);
  });
});

test('a policy model cannot be exported as a value scorer', () => {
  const { headDim: _hd, ...rest } = cfg;
  const policy = modelConfig({ ...rest, head: 'lm' });
  assert.throws(() => buildValueSequenceScorer(policy, initWeights(policy, 1)), (e: Error) => e instanceof ConfigError && /needs a value model/.test(e.message));
});
