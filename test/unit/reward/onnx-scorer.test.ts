/**
 * reward.type: model — a real ONNX graph (built with onnx-proto) run by onnxruntime-node:
 * batched scores equal the JS reference, padding does not leak into scores, transforms apply,
 * bad models and empty sequences are clear failures (never zeros).
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  applyTransform,
  byteTokenize,
  createModelRewardScorer,
  loadOnnxSequenceScorer,
} from '../../../lib/reward/onnx-scorer.ts';
import { ConfigError } from '../../../lib/errors.ts';
import { referenceMeanScore, writeScorerModel, embeddingTable } from '../../support/reward-onnx-model.ts';

let dir = '';
let meanPath = '',
  perTokenPath = '';
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'rl-reward-onnx-'));
  meanPath = writeScorerModel(join(dir, 'mean.onnx'), 'mean');
  perTokenPath = writeScorerModel(join(dir, 'value.onnx'), 'per_token');
});
after(() => rmSync(dir, { recursive: true, force: true }));

const close = (a: number, b: number, tol = 1e-5) => assert.ok(Math.abs(a - b) <= tol, `${a} ≉ ${b}`);

test('batched scores equal the reference per sequence, whatever the padding', async () => {
  const s = await loadOnnxSequenceScorer({ path: meanPath });
  const texts = ['a', 'hello world', 'ünïcödé ✓', 'x'.repeat(300)];
  const seqs = texts.map(byteTokenize);
  const together = await s.rawScores(seqs);
  const alone = await Promise.all(seqs.map((q) => s.rawScores([q]).then((r) => r[0])));
  seqs.forEach((q, i) => {
    close(together[i], referenceMeanScore(q));
    close(alone[i], together[i]);
  });
  await s.close();
});

test('concurrent callers are coalesced and still get their own scores; token ids are used as given', async () => {
  const s = await loadOnnxSequenceScorer({ path: meanPath, maxBatch: 3, maxLength: 4 });
  const seqs = Array.from({ length: 10 }, (_, i) => byteTokenize(`seq-${i}-${'z'.repeat(i)}`));
  const outs = await Promise.all(seqs.map((q) => s.rawScores([q])));
  // maxLength is for text only: ids are never cut
  outs.forEach((o, i) => close(o[0], referenceMeanScore(seqs[i])));
  await s.close();
});

test('text input (reward-server): tokenized with the byte tokenizer, maxLength keeps the tail', async () => {
  const s = await loadOnnxSequenceScorer({ path: meanPath, maxLength: 4 });
  const pairs = [
    { prompt: 'long prompt ', response: 'and its answer' },
    { prompt: 'ab', response: 'c' },
  ];
  assert.deepEqual(s.textIds('ab', 'c'), byteTokenize('abc'));
  const got = await s.scoreTexts(pairs);
  pairs.forEach((p, i) => close(got[i], referenceMeanScore(byteTokenize(p.prompt + p.response).slice(-4))));
  await s.close();
});

test('a [B, T] value model: the value at the last real token is the score', async () => {
  const s = await loadOnnxSequenceScorer({ path: perTokenPath });
  const emb = embeddingTable();
  const seqs = [byteTokenize('abc'), byteTokenize('longer sequence'), byteTokenize('q')];
  const r = await s.rawScores(seqs);
  seqs.forEach((q, i) => close(r[i], emb[q[q.length - 1]]));
  await s.close();
});

test('transforms: sigmoid, scale, threshold on scale · transform', () => {
  close(applyTransform(0, { transform: 'sigmoid' }), 0.5);
  close(applyTransform(2, { transform: 'none', scale: 3 }), 6);
  close(applyTransform(0, { transform: 'sigmoid', scale: 4 }), 2);
  assert.equal(applyTransform(0, { transform: 'sigmoid', scale: 4, threshold: 2 }), 1);
  assert.equal(applyTransform(-0.1, { transform: 'sigmoid', scale: 4, threshold: 2 }), 0);
  assert.ok(
    Number.isNaN(applyTransform(Number.NaN, { transform: 'sigmoid', threshold: 0 })),
    'NaN never becomes a thresholded 0',
  );
});

test("createModelRewardScorer: the trajectory's own prompt ⧺ response ids, not its text; transform applied; empty sequence is a failure not a zero", async () => {
  const m = await createModelRewardScorer({ path: meanPath, transform: 'sigmoid', scale: 2, threshold: null });
  // ids of another tokenizer (an alphabet one: nothing like the text's UTF-8 bytes)
  const prompt = Int32Array.from([3, 9, 4, 12]),
    response = Int32Array.from([7, 2]);
  const outs = await m.scoreBatch([
    { id: 'a', step: 1, prompt_text: 'What is 2+2? ', response_text: '4', prompt_ids: prompt, response_ids: response },
    {
      id: 'b',
      step: 1,
      prompt_text: 'x',
      response_text: 'y',
      prompt_ids: new Int32Array(0),
      response_ids: new Int32Array(0),
    },
  ]);
  const raw = referenceMeanScore([3, 9, 4, 12, 7, 2]);
  assert.ok(Math.abs(raw - referenceMeanScore(byteTokenize('What is 2+2? 4'))) > 1e-3, 'the test tells ids from text');
  assert.ok(outs[0].ok);
  close(outs[0].reward, 2 / (1 + Math.exp(-raw)));
  close(outs[0].details.score_raw as number, raw);
  assert.equal(outs[1].ok, false);
  assert.equal((outs[1] as Record<string, unknown>).reward, undefined);
  assert.match((outs[1] as { reason: string }).reason, /non-finite score \(empty sequence/);
  await m.close();
});

test('createModelRewardScorer: an item with text only is scored like reward-server does (byte tokenizer); half the ids is refused', async () => {
  const m = await createModelRewardScorer({ path: meanPath, transform: 'none', scale: 1, threshold: null });
  const outs = await m.scoreBatch([
    { id: 'a', step: 1, prompt_text: 'What is 2+2? ', response_text: '4' },
    { id: 'b', step: 1, prompt_text: 'p', response_text: 'r', prompt_ids: Int32Array.from([1, 2]) } as never,
  ]);
  assert.ok(outs[0].ok);
  close(outs[0].reward, referenceMeanScore(byteTokenize('What is 2+2? 4')));
  assert.equal(outs[1].ok, false);
  assert.match((outs[1] as { reason: string }).reason, /trajectory b .*carries prompt_ids but no response_ids/);
  await m.close();
});

test('bad models: missing file, not ONNX, wrong inputs → ConfigError naming the problem', async () => {
  await assert.rejects(
    createModelRewardScorer({ path: null, transform: 'none', scale: 1 }),
    (e: Error) => e instanceof ConfigError && /reward\.model\.path: required/.test(e.message),
  );
  await assert.rejects(loadOnnxSequenceScorer({ path: join(dir, 'nope.onnx') }), /file not found/);
  writeFileSync(join(dir, 'junk.onnx'), 'not a model');
  await assert.rejects(
    loadOnnxSequenceScorer({ path: join(dir, 'junk.onnx') }),
    (e: Error) => e instanceof ConfigError && /cannot load it/.test(e.message),
  );
  writeScorerModel(join(dir, 'tokens.onnx'), 'mean', 'tokens');
  await assert.rejects(
    loadOnnxSequenceScorer({ path: join(dir, 'tokens.onnx') }),
    (e: Error) =>
      e instanceof ConfigError &&
      /inputs are \[tokens, attention_mask\]; a sequence scorer needs exactly input_ids and attention_mask/.test(
        e.message,
      ),
  );
});
