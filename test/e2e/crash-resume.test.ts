/**
 * Checkpoints as resume points: the checkpoint row and trainer_state.json carry the real dataset
 * position, consumed offsets, KL and LR state; `trainer.load_checkpoint_path` starts a new run
 * directory from a checkpoint (weights + AdamW state + step) and, with the same run id, ends with
 * exactly the original run's final checkpoint; `trainer.find_last_checkpoint: false` refuses a
 * run that already has state, saying what to do.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../lib/app/run.ts';
import { createLogger, silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { ROOT } from '../support/pipeline-procs.ts';
import { resumeLines } from '../support/chaos-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'resume';
const tmp = join(ROOT, 'test/.tmp', `crash-resume-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

const data = ['data.task_size.train=16', 'trainer.total_epochs=2', 'trainer.max_steps=8', 'trainer.save_freq=4', `pipeline.run_id=${RUN_ID}`];
const cfgFor = (dir: string, extra: string[] = []) => loadConfig({ file: CONFIG, overrides: [...data, `trainer.run_dir=${dir}`, ...extra] });

async function checkpoints(dir: string) {
  const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
  try { return { list: await store.listCheckpoints(RUN_ID), rows: await store.countTrajectories(RUN_ID) }; } finally { await store.close(); }
}

test('load_checkpoint_path resumes a new run directory from a checkpoint and reproduces the original run; find_last_checkpoint=false refuses existing state', { timeout: 300_000 }, async () => {
  const a = join(tmp, 'a');
  const ra = await trainEmbedded(cfgFor(a), silentLogger(RUN_ID));
  assert.equal(ra.status, 'completed', ra.message);
  const ca = await checkpoints(a);
  assert.deepEqual(ca.list.map((c) => c.step), [4, 8]);
  const c4 = ca.list[0];
  // the row carries real values: 4 steps done = epoch 1, prompt 0 of 16; every update group consumed; LR/KL state
  assert.deepEqual(c4.datasetPosition, { step: 4, epoch: 1, index: 0, train_size: 16, rollout_batch_size: 4, steps_per_epoch: 4, shuffle: true, seed: 3, shuffle_seed: '3:epoch:1' });
  const consumed = Object.values(c4.consumedOffsets as Record<string, number>).reduce((x, y) => x + y, 0);
  assert.ok(consumed >= 4 * 4, `the update stage consumed at least the 16 update groups of steps 1-4 (offsets ${JSON.stringify(c4.consumedOffsets)})`);
  assert.equal((c4.lrState as { optimizer_steps: number }).optimizer_steps, 4 * 2, '2 mini-batches per step');
  assert.equal((c4.klCtlState as { value: number }).value, 0.01);
  assert.equal((c4.rngState as { seed: number }).seed, 3);
  const state = JSON.parse(readFileSync(join(c4.path, 'trainer_state.json'), 'utf8'));
  assert.equal(state.sha256, c4.sha256);
  assert.deepEqual(state.dataset_position, c4.datasetPosition);

  // find_last_checkpoint=false on a run that has state: a clear refusal
  await assert.rejects(trainEmbedded(cfgFor(a, ['trainer.find_last_checkpoint=false']), silentLogger(RUN_ID)),
    (e: Error) => /already has state/.test(e.message) && /find_last_checkpoint=true/.test(e.message) && e.message.includes(`trainer.load_checkpoint_path=${ca.list[1].path}`));

  // a new run directory started from global_step_4 (same run id: same sampling) ends with run a's checkpoint
  const b = join(tmp, 'b');
  const logFile = join(tmp, 'b.log');
  const rb = await trainEmbedded(cfgFor(b, [`trainer.load_checkpoint_path=${c4.path}`]), createLogger({ runId: RUN_ID, destination: logFile, pretty: false }));
  assert.equal(rb.status, 'completed', rb.message);
  const cb = await checkpoints(b);
  assert.deepEqual(cb.list.map((c) => [c.step, c.sha256]), [[8, ca.list[1].sha256]], 'the resumed run ends with the original final checkpoint');
  assert.equal(cb.rows, 4 * 4 * 4, 'it generated steps 5-8 only');
  const lines = resumeLines(readFileSync(logFile, 'utf8'));
  assert.equal(lines.length, 1);
  assert.match(lines[0].text, new RegExp(`^resumed at step 4, epoch 1, prompt 0 of 16, from checkpoint ${c4.path.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} \\(sha256 ${c4.sha256}\\)$`));

  // the same command again resumes run b (its own state); another checkpoint path is refused
  const again = await trainEmbedded(cfgFor(b, [`trainer.load_checkpoint_path=${c4.path}`]), silentLogger(RUN_ID));
  assert.equal(again.status, 'completed');
  await assert.rejects(trainEmbedded(cfgFor(b, [`trainer.load_checkpoint_path=${ca.list[1].path}`]), silentLogger(RUN_ID)), /applies to a new run only/);
});
