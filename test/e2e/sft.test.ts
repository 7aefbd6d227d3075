/**
 * `rlstream sft` end to end: killed with SIGKILL again and again (before a checkpoint, half-way
 * through one, after its rename, after its row, at a random time), the same command resumes from
 * the newest checkpoint at the same data position and ends with the uninterrupted run's final
 * checkpoint (same sha256) and the same per-step losses; the run is in the store (status, metrics
 * rows with its run_id, v_runs), its TensorBoard file is written, and its final checkpoint's
 * actor/ is an actor.model.path that `rlstream train` runs GRPO steps from.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { loadConfig } from '../../lib/config/index.ts';
import { sftRun } from '../../app/sft.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { loadCheckpoint } from '../../lib/model/index.ts';
import { tasks } from '../../lib/tasks/index.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { deadline, killHard, Rng, selfKilledAt, spawnCli, type CliProc } from '../support/chaos-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/sft-tiny.yaml');
const RUN_ID = 'sft-e2e';
const tmp = join(ROOT, 'test/.tmp', `sft-${process.pid}`);
const procs: CliProc[] = [];
after(async () => {
  for (const p of procs) await killHard(p);
  rmSync(tmp, { recursive: true, force: true });
});

mkdirSync(tmp, { recursive: true });
const rowsFile = join(tmp, 'rows.jsonl');
// 52 arithmetic rows: 6 full batches of 8 per epoch (the last 4 dropped), 12 steps in 2 epochs
writeFileSync(
  rowsFile,
  tasks
    .get('arithmetic')
    .generate(52, 11)
    .map((r) => JSON.stringify({ prompt: r.prompt, response: r.answer }))
    .join('\n') + '\n',
);
const overrides = (dir: string) => [
  `data.train_files=${rowsFile}`,
  `trainer.run_dir=${dir}`,
  `pipeline.run_id=${RUN_ID}`,
];
const STEPS = 12;

async function runState(dir: string) {
  const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
  try {
    const losses = (
      await sql<{
        step: number;
        value: number;
        n: number;
      }>`select step, max(value) as value, count(*)::int as n from step_metrics where run_id = ${RUN_ID} and name = 'sft/loss' group by step order by step`.execute(
        store.database.db,
      )
    ).rows;
    const runs = (
      await sql<{
        status: string;
        steps: number;
        checkpoints: number;
      }>`select status, steps::int, checkpoints::int from v_runs where run_id = ${RUN_ID}`.execute(store.database.db)
    ).rows;
    return { run: await store.getRun(RUN_ID), checkpoints: await store.listCheckpoints(RUN_ID), losses, runs };
  } finally {
    await store.close();
  }
}

test(
  'rlstream sft SIGKILLed at every phase resumes at the same data position and ends with the uninterrupted checkpoint; the output trains with GRPO',
  { timeout: 420_000 },
  async () => {
    const refDir = join(tmp, 'reference');
    const ref = await sftRun(
      loadConfig({ file: CONFIG, overrides: overrides(refDir), command: 'sft' }),
      silentLogger(RUN_ID),
    );
    assert.equal(ref.status, 'completed');
    assert.equal(ref.checkpoint?.step, STEPS);
    const want = await runState(refDir);
    assert.deepEqual(
      want.checkpoints.map((c) => c.step),
      [3, 6, 9, 12],
    );
    assert.deepEqual(want.checkpoints[1].datasetPosition, {
      step: 6,
      epoch: 1,
      index: 0,
      train_size: 52,
      rollout_batch_size: 8,
      steps_per_epoch: 6,
      shuffle: true,
      seed: 3,
      shuffle_seed: '3:sft:epoch:1',
    });
    assert.deepEqual(
      want.losses.map((l) => [l.step, l.n]),
      Array.from({ length: STEPS }, (_, i) => [i + 1, 1]),
    );
    assert.ok(
      want.losses[STEPS - 1].value < want.losses[0].value,
      `the loss falls (${want.losses[0].value} → ${want.losses[STEPS - 1].value})`,
    );
    assert.deepEqual(want.runs, [{ status: 'completed', steps: STEPS, checkpoints: 4 }]);
    assert.ok(readdirSync(join(refDir, 'tensorboard')).some((f) => f.startsWith('events.out.tfevents.')));

    // the same command, killed again and again
    const dir = join(tmp, 'crashed');
    const args = ['sft', CONFIG, ...overrides(dir)];
    const plan = [
      'sft:trained@2',
      'checkpoint:half-written@1',
      'checkpoint:renamed@1',
      'checkpoint:recorded@1',
      'random',
      'sft:trained@3',
    ];
    const resumedAt: Array<number | null> = [];
    const rng = Rng.fromSeed('sft-e2e:random-kill');
    for (const spec of plan) {
      const p = spawnCli(args, spec === 'random' ? { RLSTREAM_CRASH_TRACE: '1' } : { RLSTREAM_CRASH_AT: spec });
      procs.push(p);
      if (spec === 'random') {
        // killed from outside at a point drawn among the first few it reaches: a timed delay could
        // outlast the whole run on a fast machine (tiny steps take milliseconds), leaving nothing
        // for the next kill to interrupt
        const k = 1 + Math.floor(rng.next() * 6);
        assert.ok(
          await p.waitFor(new RegExp(`(rlstream-crash-point [^\\n]*\\n[\\s\\S]*?){${k}}`), 90_000),
          p.output().slice(-2000),
        );
        await killHard(p);
      }
      const ex = await Promise.race([p.exit, deadline(120_000)]);
      assert.ok(ex, `process with ${spec} neither crashed nor finished`);
      assert.equal(
        ex.signal,
        'SIGKILL',
        `the process with ${spec} ended by itself (code ${ex.code}):\n${p.output().slice(-3000)}`,
      );
      if (spec !== 'random') assert.equal(selfKilledAt(p.output()), spec);
      const m = /resumed at step (\d+) \(epoch (\d+), example (\d+) of 52\)/.exec(p.output());
      resumedAt.push(m ? Number(m[1]) : null);
      if (m)
        assert.deepEqual(
          [Number(m[2]), Number(m[3])],
          [Math.floor(Number(m[1]) / 6), (Number(m[1]) % 6) * 8],
          'the data position of the resumed step',
        );
    }
    // until step 3's checkpoint has its row there is nothing to resume from (one renamed into place
    // but not recorded is redone and rewritten); after that, the newest checkpoint
    assert.deepEqual(resumedAt.slice(0, 4), [null, null, null, null]);
    assert.equal(resumedAt[4], 3);
    assert.ok(
      resumedAt[5] !== null && resumedAt[5] % 3 === 0 && resumedAt[5] >= 3,
      `resumed at checkpoints: ${JSON.stringify(resumedAt)}`,
    );
    const last = spawnCli(args);
    procs.push(last);
    const done = await Promise.race([last.exit, deadline(150_000)]);
    assert.equal(done?.code, 0, last.output().slice(-3000));
    const got = await runState(dir);
    assert.equal(got.run?.status, 'completed');
    assert.deepEqual(
      got.checkpoints.map((c) => [c.step, c.sha256]),
      want.checkpoints.map((c) => [c.step, c.sha256]),
      'the same checkpoints, byte for byte',
    );
    assert.ok(last.output().includes(`sha256 ${want.checkpoints[3].sha256}`), 'the summary names the final checkpoint');
    assert.deepEqual(got.losses, want.losses, 'one loss row per step, equal to the uninterrupted run');
    assert.deepEqual(
      readdirSync(join(dir, 'checkpoints')).filter((n) => n.startsWith('.')),
      [],
      'no half-written checkpoint is left',
    );
    // started again when finished: says so and changes nothing
    const again = spawnCli(args);
    procs.push(again);
    assert.equal((await again.exit).code, 0);
    assert.match(again.output(), /already complete \(step 12\)/);

    // the output is a model directory that rlstream train starts from: two GRPO steps on the same task
    const actor = join(want.checkpoints[3].path, 'actor');
    assert.ok(existsSync(join(actor, 'config.json')) && existsSync(join(actor, 'model.safetensors')));
    const rlDir = join(tmp, 'grpo');
    const rl = await trainEmbedded(
      loadConfig({
        file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
        overrides: [
          'data.task=arithmetic',
          'actor.model.tokenizer=byte',
          `actor.model.path=${actor}`,
          'data.max_prompt_length=8',
          'data.max_response_length=4',
          'trainer.max_steps=2',
          `trainer.run_dir=${rlDir}`,
          'pipeline.run_id=sft-e2e-grpo',
        ],
      }),
      silentLogger('sft-e2e-grpo'),
    );
    assert.equal(rl.status, 'completed', rl.message);
    const v0 = await loadCheckpoint(join(rlDir, 'policy', 'v000000'), { optimizer: false });
    const sftW = await loadCheckpoint(actor, { optimizer: false });
    const bytes = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
    for (const [k, w] of sftW.weights)
      assert.ok(bytes(w).equals(bytes(v0.weights.get(k)!)), `the GRPO run starts from the SFT weights (${k})`);
    assert.ok(existsSync(join(rlDir, 'checkpoints', 'global_step_2', 'actor', 'model.safetensors')));
  },
);
