import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parquetWriteFile } from 'hyparquet-writer';
import sharp from 'sharp';
import { loadDataset } from '../../../lib/data/dataset.ts';
import { ConfigError } from '../../../lib/errors.ts';

const keys = { prompt_key: 'prompt', answer_key: 'answer', image_key: 'images' };
const dir = mkdtempSync(join(tmpdir(), 'rl-data-'));

test('jsonl rows load with their file and line, custom keys work', async () => {
  const f = join(dir, 'a.jsonl');
  const png = await sharp({ create: { width: 56, height: 56, channels: 3, background: '#336699' } })
    .png()
    .toBuffer();
  writeFileSync(
    f,
    ['{"q":"1 2 3:","a":2}', '', `{"q":"héllo ✓","a":"x","img":"${png.toString('base64')}"}`].join('\n'),
  );
  const { rows, bad } = await loadDataset([f], { prompt_key: 'q', answer_key: 'a', image_key: 'img' });
  assert.equal(bad.length, 0);
  assert.deepEqual(
    rows.map((r) => [r.prompt, r.answer, r.source.line]),
    [
      ['1 2 3:', '2', 1],
      ['héllo ✓', 'x', 3],
    ],
  );
  // EasyR1's defaults: a 56×56 image is scaled up past min_pixels 262144: 56·sqrt(262144/3136)/28 = 18.3 → 19·28 = 532
  assert.deepEqual([rows[0].images.length, rows[1].images[0].width, rows[1].images[0].height], [0, 532, 532]);
  assert.equal(rows[1].index, 1);
});

test('a bad row stops the load naming file:line, or is skipped and reported', async () => {
  const f = join(dir, 'b.jsonl');
  writeFileSync(
    f,
    ['{"prompt":"ok","answer":"1"}', '{"prompt":"no answer"}', 'not json', '{"prompt":"ok2","answer":"0"}'].join('\n'),
  );
  await assert.rejects(
    loadDataset([f], keys),
    (e: unknown) =>
      e instanceof ConfigError &&
      /b\.jsonl:2: missing answer field "answer"/.test(e.message) &&
      /on_bad_row=skip/.test(e.message),
  );
  const { rows, bad } = await loadDataset([f], { ...keys, on_bad_row: 'skip' });
  assert.deepEqual(
    rows.map((r) => r.prompt),
    ['ok', 'ok2'],
  );
  assert.deepEqual(
    bad.map((b) => b.line),
    [2, 3],
  );
  assert.match(bad[1].reason, /not valid JSON/);
});

test('verl parquet rows: chat prompt and reward_model.ground_truth', async () => {
  const f = join(dir, 'c.parquet');
  parquetWriteFile({
    filename: f,
    columnData: [
      {
        name: 'prompt',
        data: [
          [{ role: 'user', content: '1 2 3:' }],
          [
            { role: 'system', content: 'be brief' },
            { role: 'user', content: '9 8 7:' },
          ],
        ],
      },
      {
        name: 'reward_model',
        data: [
          { ground_truth: '2', style: 'rule' },
          { ground_truth: '0', style: 'rule' },
        ],
      },
    ],
  });
  const { rows } = await loadDataset([f], { ...keys, answer_key: 'reward_model.ground_truth' });
  assert.deepEqual(
    rows.map((r) => [r.prompt, r.answer]),
    [
      ['1 2 3:', '2'],
      ['system: be brief\nuser: 9 8 7:', '0'],
    ],
  );
});

test('missing files, unknown extensions and empty datasets are clear errors', async () => {
  await assert.rejects(loadDataset([join(dir, 'nope.jsonl')], keys), /data file not found/);
  const f = join(dir, 'd.csv');
  writeFileSync(f, 'x');
  await assert.rejects(loadDataset([f], keys), /cannot tell the format.*data\.format/);
  const g = join(dir, 'e.jsonl');
  writeFileSync(g, '{"prompt":"","answer":"1"}\n');
  await assert.rejects(
    loadDataset([g], { ...keys, on_bad_row: 'skip' }),
    /no usable rows.*prompt field "prompt" is empty/,
  );
});

test('verl data_source and extra_info of each row are kept for the reward (JSONL and parquet)', async () => {
  const j = join(dir, 'ds.jsonl');
  writeFileSync(
    j,
    [
      '{"prompt":"p1","answer":"1","data_source":"gsm8k","extra_info":{"split":"train","index":7}}',
      '{"prompt":"p2","answer":"2"}',
    ].join('\n'),
  );
  const { rows } = await loadDataset([j], keys);
  assert.deepEqual(
    rows.map((r) => [r.dataSource, r.extraInfo === undefined ? undefined : JSON.parse(r.extraInfo)]),
    [
      ['gsm8k', { split: 'train', index: 7 }],
      [undefined, undefined],
    ],
  );
  const bad = join(dir, 'ds-bad.jsonl');
  writeFileSync(bad, '{"prompt":"p","answer":"1","extra_info":[1]}\n');
  await assert.rejects(loadDataset([bad], keys), /ds-bad\.jsonl:1: field "extra_info" must be an object/);
  const f = join(dir, 'ds.parquet');
  parquetWriteFile({
    filename: f,
    columnData: [
      { name: 'prompt', data: [[{ role: 'user', content: '1 2 3:' }]] },
      { name: 'data_source', data: ['openai/gsm8k'] },
      { name: 'reward_model', data: [{ ground_truth: '2', style: 'rule' }] },
      { name: 'extra_info', data: [{ split: 'test', index: 3, question: 'q?' }] },
    ],
  });
  const pq = await loadDataset([f], { ...keys, answer_key: 'reward_model.ground_truth' });
  assert.equal(pq.rows[0].dataSource, 'openai/gsm8k');
  assert.deepEqual(JSON.parse(pq.rows[0].extraInfo!), { split: 'test', index: 3, question: 'q?' });
});

test('images: paths relative to image_dir or the data file, base64, data URLs and parquet bytes; bad images are bad rows with file:line', async () => {
  const img = (w: number, h: number) =>
    sharp({ create: { width: w, height: h, channels: 4, background: { r: 200, g: 10, b: 10, alpha: 0.5 } } })
      .png()
      .toBuffer();
  const a = await img(60, 40);
  const sub = mkdtempSync(join(dir, 'imgs-'));
  writeFileSync(join(sub, 'a.png'), a);
  writeFileSync(join(dir, 'tiny.png'), await img(10, 10));
  writeFileSync(join(dir, 'a.jpg'), await sharp(a).jpeg().toBuffer());
  const image = { factor: 28, minPixels: 3136, maxPixels: 1003520, resample: 'bicubic' as const };
  const f = join(dir, 'img.jsonl');
  writeFileSync(
    f,
    [
      JSON.stringify({ prompt: 'p1', answer: '1', images: ['a.png'] }),
      JSON.stringify({ prompt: 'p2', answer: '2', images: `data:image/png;base64,${a.toString('base64')}` }),
      JSON.stringify({ prompt: 'p3', answer: '3', images: ['missing.png'] }),
      JSON.stringify({ prompt: 'p4', answer: '4', images: [a.toString('base64'), a.toString('base64')] }),
      JSON.stringify({ prompt: 'p5', answer: '5', images: [Buffer.from('garbage').toString('base64')] }),
      JSON.stringify({ prompt: 'p6', answer: '6', images: null }),
    ].join('\n'),
  );
  const opts = { ...keys, image_dir: sub, image, on_bad_row: 'skip' as const };
  const { rows, bad } = await loadDataset([f], opts);
  assert.deepEqual(
    rows.map((r) => [r.prompt, r.images.length]),
    [
      ['p1', 1],
      ['p2', 1],
      ['p6', 0],
    ],
  );
  // the same pixels from a file and from a data URL are one image: same PNG, same hash
  assert.equal(rows[0].images[0].hash, rows[1].images[0].hash);
  // 60×40 rounds to 56×28 = 1568 < 3136: beta = sqrt(3136/2400); 60·beta/28 = 2.45 → 84, 40·beta/28 = 1.63 → 56
  assert.deepEqual([rows[0].images[0].width, rows[0].images[0].height], [84, 56]);
  assert.deepEqual(
    bad.map((b) => `${b.line}: ${b.reason}`),
    [
      `3: image 0 in "images" file not found: ${join(sub, 'missing.png')} (paths are relative to data.image_dir)`,
      '4: 2 images in "images", over data.limit_images = 1 (raise it, or drop images from the row)',
      '5: image 0 in "images" cannot be decoded (Input buffer contains unsupported image format)',
    ],
  );
  // data.limit_images raises the cap
  const two = await loadDataset([f], { ...opts, limit_images: 2 });
  assert.deepEqual(
    two.rows.map((r) => [r.prompt, r.images.length]),
    [
      ['p1', 1],
      ['p2', 1],
      ['p4', 2],
      ['p6', 0],
    ],
  );
  // on_bad_row = stop: the first bad image stops the load naming file:line
  await assert.rejects(
    loadDataset([f], { ...opts, on_bad_row: 'stop' }),
    (e: unknown) => e instanceof ConfigError && /img\.jsonl:3: image 0 in "images" file not found/.test(e.message),
  );
  // without image_dir, paths resolve against the data file's directory; too small is a bad row
  const g = join(dir, 'img2.jsonl');
  writeFileSync(
    g,
    [
      JSON.stringify({ prompt: 'q', answer: '1', images: ['a.jpg'] }),
      JSON.stringify({ prompt: 'r', answer: '1', images: ['tiny.png'] }),
    ].join('\n'),
  );
  const r2 = await loadDataset([g], { ...keys, image, on_bad_row: 'skip' });
  assert.deepEqual(
    r2.rows.map((r) => r.prompt),
    ['q'],
  );
  assert.deepEqual(
    r2.bad.map((b) => `${b.file}:${b.line}: ${b.reason}`),
    [`${g}:2: image 0 in "images" is 10×10, smaller than the 28-pixel patch grid (data.image_factor) on a side`],
  );
  // parquet: image bytes in a binary column
  const pq = join(dir, 'img.parquet');
  parquetWriteFile({
    filename: pq,
    columnData: [
      { name: 'prompt', data: ['pq'] },
      { name: 'answer', data: ['1'] },
      { name: 'images', data: [new Uint8Array(a)], type: 'BYTE_ARRAY' },
    ],
  });
  const r3 = await loadDataset([pq], { ...keys, image });
  assert.equal(r3.rows[0].images[0].hash, rows[0].images[0].hash);
});
