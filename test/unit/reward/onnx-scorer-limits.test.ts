/**
 * reward.type: model — what a scorer declares it accepts (metadata_props vocab_size,
 * max_sequence_length, pad_token_id; a fixed T of input_ids) is read and enforced: a sequence too
 * long or with an id outside the vocabulary is refused with a message naming it (never truncated,
 * clamped or scored as zero), without failing the other trajectories of the batch.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import onnxProto from 'onnx-proto';
import { createModelRewardScorer, loadOnnxSequenceScorer, readOnnxMetadata } from '../../../lib/reward/onnx-scorer.ts';
import { ConfigError, RlError } from '../../../lib/errors.ts';
import { buildScorerModel, referenceMeanScore } from '../../support/reward-onnx-model.ts';

const { onnx } = onnxProto;

/** The test "mean" scorer (256-entry embedding) with metadata entries and optionally a fixed T. */
function scorerWith(path: string, meta: Record<string, string>, fixedT?: number): string {
  const m = onnx.ModelProto.decode(buildScorerModel('mean'));
  m.metadataProps = Object.entries(meta).map(([key, value]) => onnx.StringStringEntryProto.create({ key, value }));
  if (fixedT !== undefined)
    for (const inp of m.graph!.input!)
      inp.type!.tensorType!.shape!.dim![1] = onnx.TensorShapeProto.Dimension.create({ dimValue: fixedT });
  writeFileSync(path, onnx.ModelProto.encode(m).finish());
  return path;
}

let dir = '';
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'rl-reward-limits-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

const close = (a: number, b: number, tol = 1e-5) => assert.ok(Math.abs(a - b) <= tol, `${a} ≉ ${b}`);

test('readOnnxMetadata reads metadata_props', () => {
  assert.deepEqual(readOnnxMetadata(buildScorerModel('mean')), {});
  const path = scorerWith(join(dir, 'meta.onnx'), { vocab_size: '200', max_sequence_length: '6', note: 'ünï ✓' });
  assert.deepEqual(readOnnxMetadata(readFileSync(path)), {
    vocab_size: '200',
    max_sequence_length: '6',
    note: 'ünï ✓',
  });
  assert.throws(() => readOnnxMetadata(readFileSync(path).subarray(0, 40)), /truncated/);
});

test('declared vocabulary and length: out-of-vocabulary ids and over-long sequences are refused, the rest scored', async () => {
  const path = scorerWith(join(dir, 'limits.onnx'), { vocab_size: '200', max_sequence_length: '6', pad_token_id: '5' });
  const s = await loadOnnxSequenceScorer({ path, padId: 17 });
  assert.deepEqual(
    s.limits,
    { vocabSize: 200, maxSequenceLength: 6, padTokenId: 5, padId: 5 },
    'the declared pad wins over the option',
  );
  assert.equal(s.problem([1, 2, 3, 4, 5, 6]), null);
  assert.match(s.problem([1, 2, 3, 4, 5, 6, 7])!, /sequence of 7 tokens is longer than the 6 the reward model accepts/);
  assert.match(s.problem([1, 200])!, /token id 200 at position 1 is outside the reward model's vocabulary \[0, 200\)/);
  assert.match(s.problem([-1])!, /token id -1 at position 0/);
  await assert.rejects(
    s.rawScores([
      [1, 2],
      [3, 250],
    ]),
    (e: Error) => e instanceof RlError && !e.retriable && /sequence 1: token id 250/.test(e.message),
  );
  close((await s.rawScores([[1, 2, 199]]))[0], referenceMeanScore([1, 2, 199]));
  await s.close();

  const m = await createModelRewardScorer({ path, transform: 'none', scale: 1, threshold: null });
  const ids = (...x: number[]) => Int32Array.from(x);
  const outs = await m.scoreBatch([
    { id: 'ok', step: 0, prompt_text: '', response_text: '', prompt_ids: ids(3, 4, 5), response_ids: ids(6) },
    { id: 'vocab', step: 0, prompt_text: '', response_text: '', prompt_ids: ids(3), response_ids: ids(201, 4) },
    {
      id: 'long',
      step: 0,
      prompt_text: '',
      response_text: '',
      prompt_ids: ids(1, 2, 3, 4),
      response_ids: ids(5, 6, 7),
    },
    { id: 'ok2', step: 0, prompt_text: '', response_text: '', prompt_ids: ids(9), response_ids: ids(8, 7, 6, 5, 4) },
  ]);
  assert.ok(outs[0].ok && outs[3].ok, JSON.stringify(outs));
  close(outs[0].reward, referenceMeanScore([3, 4, 5, 6]));
  close(outs[3].reward, referenceMeanScore([9, 8, 7, 6, 5, 4]));
  const reason = (o: (typeof outs)[number]) =>
    o.ok ? assert.fail('expected a failure') : (assert.equal(o.retriable, false), o.reason);
  assert.match(
    reason(outs[1]),
    /trajectory vocab \(prompt 1 \+ response 2 tokens\): token id 201 at position 1 is outside the reward model's vocabulary \[0, 200\)/,
  );
  assert.match(
    reason(outs[2]),
    /trajectory long \(prompt 4 \+ response 3 tokens\): sequence of 7 tokens is longer than the 6/,
  );
  assert.equal((outs[1] as Record<string, unknown>).reward, undefined, 'never a zero reward');
  await m.close();
});

test('text input keeps the tail within the declared maximum length', async () => {
  const path = scorerWith(join(dir, 'text.onnx'), { max_sequence_length: '5' });
  const s = await loadOnnxSequenceScorer({ path, maxLength: 1024 });
  assert.equal(s.textIds('hello ', 'world').length, 5);
  close(
    (await s.scoreTexts([{ prompt: 'hello ', response: 'world' }]))[0],
    referenceMeanScore([...Buffer.from('world')]),
  );
  await s.close();
});

test("a fixed T in input_ids' shape is the maximum length, and batches are padded to it", async () => {
  const path = scorerWith(join(dir, 'fixed.onnx'), {}, 6);
  const s = await loadOnnxSequenceScorer({ path });
  assert.equal(s.limits.maxSequenceLength, 6);
  const r = await s.rawScores([
    [10, 20],
    [30, 40, 50, 60],
  ]);
  close(r[0], referenceMeanScore([10, 20]));
  close(r[1], referenceMeanScore([30, 40, 50, 60]));
  assert.match(s.problem([1, 2, 3, 4, 5, 6, 7])!, /longer than the 6/);
  await s.close();
});

test('pad id: the option when the model declares none; outside the declared vocabulary or bad metadata → ConfigError', async () => {
  const a = await loadOnnxSequenceScorer({
    path: scorerWith(join(dir, 'nopad.onnx'), { vocab_size: '256' }),
    padId: 7,
  });
  assert.equal(a.limits.padId, 7);
  await a.close();
  await assert.rejects(
    loadOnnxSequenceScorer({ path: join(dir, 'nopad.onnx'), padId: 256 }),
    (e: Error) => e instanceof ConfigError && /pad id 256 is outside the model's vocabulary \[0, 256\)/.test(e.message),
  );
  await assert.rejects(
    loadOnnxSequenceScorer({ path: scorerWith(join(dir, 'bad.onnx'), { vocab_size: 'many' }) }),
    (e: Error) => e instanceof ConfigError && /metadata vocab_size = "many" is not an integer ≥ 1/.test(e.message),
  );
});
