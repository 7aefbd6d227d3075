/**
 * A Python `compute_score` (verl's shape) trains the README walkthrough's task: the same data and
 * config as "Your own data", with `reward.reward_fn_path: reward.py` run by Debian's python3 in
 * the reward stage's worker pool. The row's data_source and extra_info reach the function, its
 * `score` is the reward, its other keys are stored (numbers as metrics, strings as text).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const tmp = join(ROOT, 'test/.tmp', `python-reward-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

const REWARD_PY = `
import re

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    correct = 1 if solution_str.strip() == ground_truth else 0
    digits = 1 if re.fullmatch(r"\\d+", solution_str.strip()) else 0
    return {"score": correct + 0.1 * digits, "accuracy": correct, "format": digits,
            "seen": "%s a=%d (python)" % (data_source, extra_info["a"])}
`;

test('a Python compute_score trains the walkthrough task', { timeout: 120_000 }, async () => {
  const dir = join(tmp, 'my-task');
  mkdirSync(dir, { recursive: true });
  const rows = (from: number, to: number) =>
    Array.from({ length: to - from }, (_, i) => {
      const a = from + i;
      return JSON.stringify({ prompt: `${a}+1=`, answer: String(a + 1), data_source: 'plus-one', extra_info: { a } });
    }).join('\n') + '\n';
  writeFileSync(join(dir, 'train.jsonl'), rows(0, 32));
  writeFileSync(join(dir, 'val.jsonl'), rows(32, 40));
  writeFileSync(join(dir, 'reward.py'), REWARD_PY);
  writeFileSync(
    join(dir, 'config.yaml'),
    [
      'data:',
      '  train_files: train.jsonl',
      '  val_files: val.jsonl',
      '  max_prompt_length: 16',
      '  max_response_length: 4',
      '  rollout_batch_size: 8',
      'rollout:',
      '  n: 4',
      'actor:',
      '  model: { d_model: 32, n_layers: 1, n_heads: 2, n_kv_heads: 2, ffn: 64, max_seq_len: 32 }',
      '  optim: { lr: 1.0e-3 }',
      '  global_batch_size: 16',
      '  micro_batch_size_per_device_for_update: 16',
      '  micro_batch_size_per_device_for_experience: 16',
      'reward:',
      '  reward_fn_path: reward.py',
      `  python: ${existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3'}`,
      'trainer:',
      '  project_name: mine',
      '  experiment_name: my-task',
      '  max_steps: 4',
      '  val_freq: 2',
    ].join('\n'),
  );
  // a function the module does not have stops the start with one line, before the run opens anything
  const wrong = loadConfig({
    file: join(dir, 'config.yaml'),
    overrides: [`trainer.run_dir=${join(tmp, 'wrong')}`, 'reward.reward_fn_name=score'],
  });
  await assert.rejects(trainEmbedded(wrong, silentLogger('wrong')), (e: Error) => {
    assert.match(
      e.message,
      /reward\.py has no function 'score' \(it defines: compute_score\); set reward\.reward_fn_name/,
    );
    assert.ok(!e.message.includes('\n'));
    return true;
  });
  assert.ok(!existsSync(join(tmp, 'wrong')), 'nothing was opened');
  const runId = 'python-reward';
  const cfg = loadConfig({
    file: join(dir, 'config.yaml'),
    overrides: [`trainer.run_dir=${join(tmp, 'run')}`, `pipeline.run_id=${runId}`],
  });
  const out = await trainEmbedded(cfg, silentLogger(runId));
  assert.equal(out.status, 'completed', out.message);
  const store = await openStore({ kind: 'pglite', dir: join(tmp, 'run', 'db') });
  try {
    const train = await store.getTrajectories(runId, { kind: 'train' });
    assert.equal(new Set(train.map((r) => r.step)).size, 4, 'four steps trained');
    for (const r of [...train, ...(await store.getTrajectories(runId, { kind: 'val' }))]) {
      const d = r.rewardDetails as Record<string, unknown>;
      const a = Number(/(\d+)\+1=/.exec(r.promptText)![1]);
      assert.equal(d.seen, `plus-one a=${a} (python)`, 'data_source and extra_info reached compute_score');
      const correct = r.responseText.trim() === r.groundTruth ? 1 : 0;
      const digits = /^\d+$/.test(r.responseText.trim()) ? 1 : 0;
      assert.equal(d.accuracy, correct);
      assert.ok(Math.abs(r.reward! - (correct + 0.1 * digits)) < 1e-9, 'score is the reward');
    }
    const names = new Set((await store.getMetrics(runId)).map((m) => m.name));
    assert.ok(names.has('val/accuracy') && names.has('reward/format'), [...names].join(', '));
  } finally {
    await store.close();
  }
});
