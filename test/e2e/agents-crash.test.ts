/**
 * A multi-turn run SIGKILLed while its episodes are in flight (RLSTREAM_CRASH_AT =
 * rollout:env-answered: right after an environment answered a turn, the other episodes of the
 * batch part-way through theirs) — once in the first step, once in the second — and started
 * again with the same command ends with the undisturbed run's checkpoint sha256, and SQL holds
 * every episode exactly once, each with its trajectory, equal to the undisturbed run's.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { deadline, killHard, selfKilledAt, spawnCli, type CliProc } from '../support/chaos-procs.ts';

const CONFIG = join(ROOT, 'examples/guess-number.yaml');
const RUN_ID = 'agents-crash';
const STEPS = 2,
  ROWS = 4,
  N = 4;
const tmp = join(ROOT, 'test/.tmp', `agents-crash-${process.pid}`);
const procs: CliProc[] = [];
after(async () => {
  for (const p of procs) await killHard(p);
  rmSync(tmp, { recursive: true, force: true });
});

const overrides = (dir: string) => [
  `trainer.run_dir=${dir}`,
  `pipeline.run_id=${RUN_ID}`,
  `data.task_size.train=${STEPS * ROWS}`,
  'data.task_size.val=0',
  'trainer.val_freq=-1',
  'trainer.val_before_train=false',
  `data.rollout_batch_size=${ROWS}`,
  `rollout.n=${N}`,
  `actor.global_batch_size=${ROWS * N}`,
  `actor.micro_batch_size_per_device_for_update=${ROWS * N}`,
  `actor.micro_batch_size_per_device_for_experience=${ROWS * N}`,
  'actor.ppo_epochs=1',
  `trainer.max_steps=${STEPS}`,
  `trainer.save_freq=${STEPS}`,
];

interface EpisodeRow {
  trajectory_id: string;
  step: number;
  assistant_turns: number;
  reward: number;
  turns: number;
  trajectories: number;
}

async function state(dir: string) {
  const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
  try {
    const episodes = (
      await sql<EpisodeRow>`select e.trajectory_id, e.step, e.assistant_turns, e.reward,
        (select count(*)::int from episode_turns t where t.run_id = e.run_id and t.trajectory_id = e.trajectory_id) as turns,
        (select count(*)::int from trajectories r where r.run_id = e.run_id and r.id = e.trajectory_id) as trajectories
      from episodes e where e.run_id = ${RUN_ID} and e.kind = 'train' order by e.trajectory_id`.execute(
        store.database.db,
      )
    ).rows;
    const [dup] = (
      await sql<{
        n: number;
        distinct_ids: number;
        trajectories: number;
      }>`select count(*)::int as n, count(distinct trajectory_id)::int as distinct_ids,
        (select count(*)::int from trajectories where run_id = ${RUN_ID} and kind = 'train') as trajectories
      from episodes where run_id = ${RUN_ID} and kind = 'train'`.execute(store.database.db)
    ).rows;
    return { episodes, counts: dup, sha: (await store.latestCheckpoint(RUN_ID))?.sha256 ?? null };
  } finally {
    await store.close();
  }
}

test(
  'multi-turn run SIGKILLed mid-episode (step 1, then step 2) resumes to the undisturbed sha256; every episode stored once',
  { timeout: 900_000 },
  async () => {
    const t0 = Date.now();
    const refDir = join(tmp, 'reference');
    const ref = await trainEmbedded(loadConfig({ file: CONFIG, overrides: overrides(refDir) }), silentLogger(RUN_ID));
    assert.equal(ref.status, 'completed', ref.message);
    const want = await state(refDir);
    assert.equal(want.episodes.length, STEPS * ROWS * N);
    console.log(`  reference run: ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    const perStep = want.episodes.filter((e) => e.step === 1).reduce((a, e) => a + e.assistant_turns, 0);

    const dir = join(tmp, 'crashed');
    const args = ['train', CONFIG, ...overrides(dir)];
    // the 5th answer: every episode of step 1 is in flight; then one past step 1's answers (≤ 6 per
    // episode): in step 2, after step 1 committed
    const kills = ['rollout:env-answered@5', `rollout:env-answered@${ROWS * N * 6 + 1}`];
    for (const spec of kills) {
      const p = spawnCli(args, { RLSTREAM_CRASH_AT: spec });
      procs.push(p);
      const done = await Promise.race([p.exit, deadline(300_000)]);
      if (!done) {
        await killHard(p);
        assert.fail(`process with ${spec} neither crashed nor finished:\n${p.output().slice(-3000)}`);
      }
      assert.equal(done.signal, 'SIGKILL', `killed at ${spec}:\n${p.output().slice(-3000)}`);
      assert.equal(selfKilledAt(p.output()), spec);
      console.log(`  killed at ${spec}: ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    }
    const last = spawnCli(args);
    procs.push(last);
    const ex = await Promise.race([last.exit, deadline(300_000)]);
    assert.equal(ex?.code, 0, last.output().slice(-3000));

    const got = await state(dir);
    assert.ok(perStep > 0);
    assert.deepEqual(got.counts, {
      n: STEPS * ROWS * N,
      distinct_ids: STEPS * ROWS * N,
      trajectories: STEPS * ROWS * N,
    });
    assert.ok(
      got.episodes.every((e) => e.trajectories === 1),
      'each episode has its trajectory',
    );
    assert.deepEqual(got.episodes, want.episodes, 'the same episodes, turns and rewards as the undisturbed run');
    assert.equal(got.sha, want.sha, 'the undisturbed run’s checkpoint sha256');
  },
);
