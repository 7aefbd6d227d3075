import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parquetWriteFile } from 'hyparquet-writer';
import { loadDataset } from '../../../lib/data/dataset.ts';
import { ConfigError } from '../../../lib/errors.ts';

const keys = { prompt_key: 'prompt', answer_key: 'answer', image_key: 'images' };
const dir = mkdtempSync(join(tmpdir(), 'rl-data-'));

test('jsonl rows load with their file and line, custom keys work', async () => {
  const f = join(dir, 'a.jsonl');
  writeFileSync(f, ['{"q":"1 2 3:","a":2}', '', '{"q":"héllo ✓","a":"x","img":"aGk="}'].join('\n'));
  const { rows, bad } = await loadDataset([f], { prompt_key: 'q', answer_key: 'a', image_key: 'img' });
  assert.equal(bad.length, 0);
  assert.deepEqual(rows.map((r) => [r.prompt, r.answer, r.source.line]), [['1 2 3:', '2', 1], ['héllo ✓', 'x', 3]]);
  assert.equal(rows[1].images[0].toString(), 'hi');
  assert.equal(rows[1].index, 1);
});

test('a bad row stops the load naming file:line, or is skipped and reported', async () => {
  const f = join(dir, 'b.jsonl');
  writeFileSync(f, ['{"prompt":"ok","answer":"1"}', '{"prompt":"no answer"}', 'not json', '{"prompt":"ok2","answer":"0"}'].join('\n'));
  await assert.rejects(loadDataset([f], keys), (e: unknown) => e instanceof ConfigError && /b\.jsonl:2: missing answer field "answer"/.test(e.message) && /on_bad_row=skip/.test(e.message));
  const { rows, bad } = await loadDataset([f], { ...keys, on_bad_row: 'skip' });
  assert.deepEqual(rows.map((r) => r.prompt), ['ok', 'ok2']);
  assert.deepEqual(bad.map((b) => b.line), [2, 3]);
  assert.match(bad[1].reason, /not valid JSON/);
});

test('verl parquet rows: chat prompt and reward_model.ground_truth', async () => {
  const f = join(dir, 'c.parquet');
  parquetWriteFile({ filename: f, columnData: [
    { name: 'prompt', data: [[{ role: 'user', content: '1 2 3:' }], [{ role: 'system', content: 'be brief' }, { role: 'user', content: '9 8 7:' }]] },
    { name: 'reward_model', data: [{ ground_truth: '2', style: 'rule' }, { ground_truth: '0', style: 'rule' }] },
  ] });
  const { rows } = await loadDataset([f], { ...keys, answer_key: 'reward_model.ground_truth' });
  assert.deepEqual(rows.map((r) => [r.prompt, r.answer]), [['1 2 3:', '2'], ['system: be brief\nuser: 9 8 7:', '0']]);
});

test('missing files, unknown extensions and empty datasets are clear errors', async () => {
  await assert.rejects(loadDataset([join(dir, 'nope.jsonl')], keys), /data file not found/);
  const f = join(dir, 'd.csv');
  writeFileSync(f, 'x');
  await assert.rejects(loadDataset([f], keys), /cannot tell the format.*data\.format/);
  const g = join(dir, 'e.jsonl');
  writeFileSync(g, '{"prompt":"","answer":"1"}\n');
  await assert.rejects(loadDataset([g], { ...keys, on_bad_row: 'skip' }), /no usable rows.*prompt field "prompt" is empty/);
});

test('verl data_source and extra_info of each row are kept for the reward (JSONL and parquet)', async () => {
  const j = join(dir, 'ds.jsonl');
  writeFileSync(j, ['{"prompt":"p1","answer":"1","data_source":"gsm8k","extra_info":{"split":"train","index":7}}', '{"prompt":"p2","answer":"2"}'].join('\n'));
  const { rows } = await loadDataset([j], keys);
  assert.deepEqual(rows.map((r) => [r.dataSource, r.extraInfo === undefined ? undefined : JSON.parse(r.extraInfo)]), [['gsm8k', { split: 'train', index: 7 }], [undefined, undefined]]);
  const bad = join(dir, 'ds-bad.jsonl');
  writeFileSync(bad, '{"prompt":"p","answer":"1","extra_info":[1]}\n');
  await assert.rejects(loadDataset([bad], keys), /ds-bad\.jsonl:1: field "extra_info" must be an object/);
  const f = join(dir, 'ds.parquet');
  parquetWriteFile({ filename: f, columnData: [
    { name: 'prompt', data: [[{ role: 'user', content: '1 2 3:' }]] },
    { name: 'data_source', data: ['openai/gsm8k'] },
    { name: 'reward_model', data: [{ ground_truth: '2', style: 'rule' }] },
    { name: 'extra_info', data: [{ split: 'test', index: 3, question: 'q?' }] },
  ] });
  const pq = await loadDataset([f], { ...keys, answer_key: 'reward_model.ground_truth' });
  assert.equal(pq.rows[0].dataSource, 'openai/gsm8k');
  assert.deepEqual(JSON.parse(pq.rows[0].extraInfo!), { split: 'test', index: 3, question: 'q?' });
});
