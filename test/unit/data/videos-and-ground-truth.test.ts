/**
 * Rows with videos stop the load whatever data.on_bad_row says (rlstream trains on text and
 * images; videos are never dropped silently); a row without data.answer_key falls back to
 * reward_model.ground_truth, in JSONL as in parquet.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadDataset } from '../../../lib/data/dataset.ts';
import { ConfigError } from '../../../lib/errors.ts';

const keys = { prompt_key: 'prompt', answer_key: 'answer', image_key: 'images' };
const dir = mkdtempSync(join(tmpdir(), 'rl-videos-'));

test('a row with videos stops the load with its file:line, even with on_bad_row = skip', async () => {
  const f = join(dir, 'v.jsonl');
  writeFileSync(
    f,
    [
      '{"prompt":"a","answer":"1","videos":[]}',
      '{"prompt":"b","answer":"2","videos":null}',
      '{"prompt":"c","answer":"3","videos":["clip.mp4"]}',
    ].join('\n'),
  );
  for (const on_bad_row of ['stop', 'skip'] as const) {
    await assert.rejects(
      loadDataset([f], { ...keys, on_bad_row }),
      (e: unknown) =>
        e instanceof ConfigError &&
        e.message.startsWith(`${f}:3: the row has videos in "videos"`) &&
        !e.message.includes('\n'),
    );
  }
  // another video field: the rows' `videos` are not videos for this config
  const { rows } = await loadDataset([f], { ...keys, video_key: 'clips' });
  assert.equal(rows.length, 3);
});

test('the ground truth falls back to reward_model.ground_truth in JSONL rows', async () => {
  const f = join(dir, 'gt.jsonl');
  writeFileSync(
    f,
    [
      '{"prompt":"2+2?","reward_model":{"ground_truth":"4","style":"rule"},"data_source":"openai/gsm8k"}',
      '{"prompt":"3+3?","answer":"6","reward_model":{"ground_truth":"ignored"}}',
    ].join('\n'),
  );
  const { rows } = await loadDataset([f], keys);
  assert.deepEqual(
    rows.map((r) => [r.answer, r.dataSource ?? null]),
    [
      ['4', 'openai/gsm8k'],
      ['6', null],
    ],
  );
  writeFileSync(f, '{"prompt":"x"}\n');
  await assert.rejects(loadDataset([f], keys), /missing answer field "answer" \(and no reward_model\.ground_truth/);
});
