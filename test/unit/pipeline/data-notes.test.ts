import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig } from '../../../lib/config/index.ts';
import { dataNotes, loadRunData } from '../../../lib/pipeline/data.ts';
import { tokenizerFor } from '../../../lib/pipeline/policy.ts';

const dir = mkdtempSync(join(tmpdir(), 'rl-data-notes-'));
after(() => rmSync(dir, { recursive: true, force: true }));

test('skipped bad rows and dropped overlong prompts: one line each with counts and file:line examples, no process warnings', async () => {
  const f = join(dir, 'train.jsonl');
  const rows = [
    '{"prompt":"ok 1","answer":"1"}',
    '{"prompt":"no answer"}',
    'not json',
    '{"prompt":"ok 2","answer":"2"}',
    `{"prompt":"${'x'.repeat(40)}","answer":"3"}`,
    '{"answer":"4"}',
    '{"q":1}',
    `{"prompt":"${'y'.repeat(30)}","answer":"5"}`,
  ];
  writeFileSync(f, rows.join('\n'));
  const cfg = loadConfig({
    env: {},
    onWarning: () => undefined,
    overrides: [
      `data.train_files=[${f}]`,
      'data.on_bad_row=skip',
      'data.max_prompt_length=16',
      'reward.reward_fn=exact_match',
      'trainer.val_before_train=false',
      'data.rollout_batch_size=1',
      'rollout.n=2',
      'actor.global_batch_size=2',
      'actor.micro_batch_size_per_device_for_update=2',
      'actor.micro_batch_size_per_device_for_experience=2',
    ],
  });
  const warnings: string[] = [];
  const onWarning = (w: Error) => warnings.push(w.message);
  process.on('warning', onWarning);
  try {
    for (let i = 0; i < 3; i++) await loadRunData(cfg, tokenizerFor(cfg)); // the run loads its data in several places
    await new Promise((r) => setImmediate(r));
  } finally {
    process.off('warning', onWarning);
  }
  assert.deepEqual(warnings, [], 'no Node process warnings');
  const data = await loadRunData(cfg, tokenizerFor(cfg));
  assert.deepEqual(
    data.train.map((r) => r.prompt),
    ['ok 1', 'ok 2'],
  );
  const notes = dataNotes(data, cfg);
  assert.equal(notes.length, 2);
  assert.match(
    notes[0]!,
    new RegExp(
      `^4 bad train rows skipped \\(data\\.on_bad_row = skip\\): ${f}:2: missing answer field "answer" \\(and no reward_model\\.ground_truth; set data\\.answer_key\\); ${f}:3: not valid JSON .*; ${f}:6: missing prompt field "prompt" .*, … \\(1 more\\)$`,
    ),
  );
  assert.match(
    notes[1]!,
    new RegExp(
      `^2 train prompts longer than data\\.max_prompt_length = 16 tokens dropped \\(data\\.filter_overlong_prompts = true; raise max_prompt_length to keep them\\): ${f}:5 \\(41 tokens\\), ${f}:8 \\(31 tokens\\)$`,
    ),
  );
  for (const n of notes) assert.ok(!n.includes('\n'));
});
