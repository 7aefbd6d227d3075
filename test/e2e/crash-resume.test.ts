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
import { trainEmbedded } from '../../app/run.ts';
import { createLogger, silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { loadCheckpoint } from '../../lib/model/index.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { resumeLines } from '../support/chaos-procs.ts';
import { sha256File } from '../../lib/policy-store/hash.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'resume';
const tmp = join(ROOT, 'test/.tmp', `crash-resume-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

const data = [
  'data.task_size.train=16',
  'trainer.total_epochs=2',
  'trainer.max_steps=8',
  'trainer.save_freq=4',
  `pipeline.run_id=${RUN_ID}`,
];
const cfgFor = (dir: string, extra: string[] = []) =>
  loadConfig({ file: CONFIG, overrides: [...data, `trainer.run_dir=${dir}`, ...extra] });

async function checkpoints(dir: string) {
  const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
  try {
    return { list: await store.listCheckpoints(RUN_ID), rows: await store.countTrajectories(RUN_ID) };
  } finally {
    await store.close();
  }
}

test(
  'load_checkpoint_path resumes a new run directory from a checkpoint and reproduces the original run; find_last_checkpoint=false refuses existing state',
  { timeout: 300_000 },
  async () => {
    const a = join(tmp, 'a');
    const ra = await trainEmbedded(cfgFor(a), silentLogger(RUN_ID));
    assert.equal(ra.status, 'completed', ra.message);
    const ca = await checkpoints(a);
    assert.deepEqual(
      ca.list.map((c) => c.step),
      [4, 8],
    );
    const c4 = ca.list[0];
    // the row carries real values: 4 steps done = epoch 1, prompt 0 of 16; every update group consumed; LR/KL state
    assert.deepEqual(c4.datasetPosition, {
      step: 4,
      epoch: 1,
      index: 0,
      train_size: 16,
      rollout_batch_size: 4,
      steps_per_epoch: 4,
      shuffle: true,
      seed: 3,
      shuffle_seed: '3:epoch:1',
    });
    const consumed = Object.values(c4.consumedOffsets as Record<string, number>).reduce((x, y) => x + y, 0);
    assert.ok(
      consumed >= 4 * 4,
      `the update stage consumed at least the 16 update groups of steps 1-4 (offsets ${JSON.stringify(c4.consumedOffsets)})`,
    );
    assert.equal((c4.lrState as { optimizer_steps: number }).optimizer_steps, 4 * 2, '2 mini-batches per step');
    assert.equal((c4.klCtlState as { value: number }).value, 0.01);
    assert.equal((c4.rngState as { seed: number }).seed, 3);
    const state = JSON.parse(readFileSync(join(c4.path, 'trainer_state.json'), 'utf8'));
    assert.equal(state.sha256, c4.sha256);
    assert.deepEqual(state.dataset_position, c4.datasetPosition);

    // find_last_checkpoint=false on a run that has state: a clear refusal
    await assert.rejects(
      trainEmbedded(cfgFor(a, ['trainer.find_last_checkpoint=false']), silentLogger(RUN_ID)),
      (e: Error) =>
        /already has state/.test(e.message) &&
        /find_last_checkpoint=true/.test(e.message) &&
        e.message.includes(`trainer.load_checkpoint_path=${ca.list[1].path}`),
    );

    // a new run directory started from global_step_4 (same run id: same sampling) ends with run a's checkpoint
    const b = join(tmp, 'b');
    const logFile = join(tmp, 'b.log');
    const rb = await trainEmbedded(
      cfgFor(b, [`trainer.load_checkpoint_path=${c4.path}`]),
      createLogger({ runId: RUN_ID, destination: logFile, pretty: false }),
    );
    assert.equal(rb.status, 'completed', rb.message);
    const cb = await checkpoints(b);
    assert.deepEqual(
      cb.list.map((c) => [c.step, c.sha256]),
      [[8, ca.list[1].sha256]],
      'the resumed run ends with the original final checkpoint',
    );
    assert.equal(cb.rows, 4 * 4 * 4, 'it generated steps 5-8 only');
    const lines = resumeLines(readFileSync(logFile, 'utf8'));
    assert.equal(lines.length, 1);
    assert.match(
      lines[0].text,
      new RegExp(
        `^resumed at step 4, epoch 1, prompt 0 of 16, from checkpoint ${c4.path.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} \\(sha256 ${c4.sha256}\\)$`,
      ),
    );

    // the same command again resumes run b (its own state); another checkpoint path is refused
    const again = await trainEmbedded(cfgFor(b, [`trainer.load_checkpoint_path=${c4.path}`]), silentLogger(RUN_ID));
    assert.equal(again.status, 'completed');
    await assert.rejects(
      trainEmbedded(cfgFor(b, [`trainer.load_checkpoint_path=${ca.list[1].path}`]), silentLogger(RUN_ID)),
      /applies to a new run only/,
    );
  },
);

test(
  'load_checkpoint_path restores the critic (weights and AdamW state) with GAE; a checkpoint without a critic is refused',
  { timeout: 300_000 },
  async () => {
    const gae = [
      'algorithm.adv_estimator=gae',
      'algorithm.use_kl_loss=false',
      'trainer.max_steps=4',
      'trainer.save_freq=2',
    ];
    const a = join(tmp, 'gae-a');
    const ra = await trainEmbedded(cfgFor(a, gae), silentLogger(RUN_ID));
    assert.equal(ra.status, 'completed', ra.message);
    const ca = await checkpoints(a);
    assert.deepEqual(
      ca.list.map((c) => c.step),
      [2, 4],
    );
    const c2 = ca.list[0];
    const savedCritic = await loadCheckpoint(join(c2.path, 'critic'), { optimizer: true });
    assert.ok(
      savedCritic.optimizer && savedCritic.optimizer.step > 0,
      'the checkpoint carries the critic and its AdamW state',
    );

    const b = join(tmp, 'gae-b');
    // keep_policy_versions: the test reads b's starting critic version after the run (it is no longer needed by then, so it would be pruned)
    const rb = await trainEmbedded(
      cfgFor(b, [...gae, `trainer.load_checkpoint_path=${c2.path}`, 'trainer.keep_policy_versions=4']),
      silentLogger(RUN_ID),
    );
    assert.equal(rb.status, 'completed', rb.message);
    // run b's critic at step 2 is the checkpoint's, bit for bit (a version holds weights only) …
    const startB = await loadCheckpoint(join(b, 'critic', 'v000002'), { optimizer: false });
    assert.equal(startB.weightsSha256, savedCritic.weightsSha256, 'critic weights restored');
    // … and so is its AdamW state: b's final checkpoint holds a's critic moments, byte for byte
    const ckB4 = (await checkpoints(b)).list[0];
    for (const f of ['critic/optimizer.safetensors', 'actor/optimizer.safetensors'])
      assert.equal(
        await sha256File(join(ckB4.path, f)),
        await sha256File(join(ca.list[1].path, f)),
        `${f} of the final checkpoint equals the original run's`,
      );
    // … so the value estimates, hence GAE advantages and the policy, continue exactly as in run a
    const cb = await checkpoints(b);
    assert.deepEqual(
      cb.list.map((c) => [c.step, c.sha256]),
      [[4, ca.list[1].sha256]],
      'the resumed GAE run ends with the original final policy',
    );
    const endA = await loadCheckpoint(join(a, 'critic', 'v000004'), { optimizer: false });
    const endB = await loadCheckpoint(join(b, 'critic', 'v000004'), { optimizer: false });
    assert.equal(endB.weightsSha256, endA.weightsSha256, 'and the original final critic');

    // a checkpoint of a run without a critic cannot silently start GAE with an untrained one
    const g = join(tmp, 'grpo');
    const rg = await trainEmbedded(cfgFor(g, ['trainer.max_steps=2', 'trainer.save_freq=2']), silentLogger(RUN_ID));
    assert.equal(rg.status, 'completed', rg.message);
    const cg = (await checkpoints(g)).list[0];
    await assert.rejects(
      trainEmbedded(
        cfgFor(join(tmp, 'gae-c'), [...gae, `trainer.load_checkpoint_path=${cg.path}`]),
        silentLogger(RUN_ID),
      ),
      (e: Error) =>
        /has no critic/.test(e.message) &&
        /critic\.model\.path/.test(e.message) &&
        e.message.includes(join(cg.path, 'actor')),
    );
  },
);
