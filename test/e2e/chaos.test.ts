/**
 * Distributed chaos test: the five stages as separate `rlstream serve` processes over Kafka
 * (librdkafka mock) and PostgreSQL, a 30-step run of the tiny model across an epoch boundary.
 * A seeded, bounded harness SIGKILLs a random stage at random times (at least 15 kills; each
 * process is up long enough to have work in flight) and restarts it; in the middle of the run
 * PostgreSQL itself is stopped and started again, and the stages must back off and continue.
 * The run must end with the uninterrupted (embedded) run's checkpoint sha256 and exactly its
 * trajectories: one row per (step, prompt, sample), no gaps, no duplicates.
 *
 * Restarting PostgreSQL affects every database of the server, so this file runs alone
 * (@runs-alone, scripts/run-tests.ts): nothing else uses the server meanwhile.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, rmSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { sql } from 'kysely';
import pg from 'pg';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { ROOT, PG_URL, freshDatabase, kafkaForRun } from '../../devkit/pipeline-procs.ts';
import { ChaosHarness, sleep } from '../support/chaos-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'chaos';
const SEED = Number(process.env.RLSTREAM_CHAOS_SEED ?? 5);
const TRAIN = 64,
  BATCH = 4,
  N = 4,
  STEPS = 30,
  SPE = TRAIN / BATCH;
const MIN_KILLS = 15;
const tmp = join(ROOT, 'test/.tmp', `chaos-${process.pid}`);
const cleanups: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  rmSync(tmp, { recursive: true, force: true });
});

const common = [
  `pipeline.run_id=${RUN_ID}`,
  `data.task_size.train=${TRAIN}`,
  `data.rollout_batch_size=${BATCH}`,
  `rollout.n=${N}`,
  'trainer.total_epochs=2',
  `trainer.max_steps=${STEPS}`,
  'trainer.save_freq=5',
  'trainer.save_limit=2',
];

interface TrajRow {
  step: number;
  epoch: number;
  prompt_index: number;
  sample_index: number;
  response_tokens: number[];
  reward: number | null;
  advantages: number[] | null;
}

async function runState(target: { kind: 'pglite'; dir: string } | { kind: 'postgres'; url: string }) {
  const store = await openStore(target);
  try {
    const rows = (
      await sql<TrajRow>`select step, epoch, prompt_index, sample_index, response_tokens, reward, advantages
      from trajectories where run_id = ${RUN_ID} and kind = 'train' order by step, prompt_index, sample_index`.execute(
        store.database.db,
      )
    ).rows;
    return { latest: await store.latestCheckpoint(RUN_ID), checkpoints: await store.listCheckpoints(RUN_ID), rows };
  } finally {
    await store.close();
  }
}

function pgctl(action: 'stop' | 'start'): void {
  const version = readdirSync('/etc/postgresql')[0];
  execFileSync('pg_ctlcluster', ['--skip-systemctl-redirect', version, 'main', action], {
    stdio: 'pipe',
    timeout: 60_000,
  });
}

async function pgReady(timeoutMs: number): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const c = new pg.Client({ connectionString: PG_URL });
    try {
      await c.connect();
      await c.query('select 1');
      return;
    } catch (e) {
      if (Date.now() > end) throw e;
    } finally {
      await c.end().catch(() => undefined);
    }
    await sleep(300);
  }
}

test(
  `five stage processes killed at random ≥ ${MIN_KILLS} times, and a PostgreSQL restart, end with the uninterrupted checkpoint`,
  { timeout: 540_000 },
  async () => {
    const t0 = Date.now();
    const ref = await trainEmbedded(
      loadConfig({ file: CONFIG, overrides: [...common, `trainer.run_dir=${join(tmp, 'reference')}`] }),
      silentLogger(RUN_ID),
    );
    assert.equal(ref.status, 'completed', ref.message);
    const want = await runState({ kind: 'pglite', dir: join(tmp, 'reference', 'db') });
    assert.equal(want.latest?.step, STEPS);
    const tRef = Date.now();

    const db = await freshDatabase(`rl_e2e_chaos_${process.pid}`);
    cleanups.push(db.drop);
    const kafka = await kafkaForRun('chaos', RUN_ID, 2);
    cleanups.push(() => kafka.stop());
    const harness = new ChaosHarness({
      configFile: CONFIG,
      overrides: [
        ...common,
        `trainer.run_dir=${join(tmp, 'distributed')}`,
        'pipeline.topic_prefix=chaos',
        'pipeline.bus=kafka',
        `pipeline.brokers=[${kafka.brokers.join(',')}]`,
        'pipeline.store=postgres',
        `pipeline.database_url=${db.url}`,
      ],
      stages: ['update', 'controller', 'advantage', 'reward', 'rollout'],
      seed: SEED,
      maxKills: MIN_KILLS + 2,
      intervalMs: [1500, 4000],
      minUptimeMs: 12_000,
      restartDelayMs: 200,
      timeoutMs: 420_000,
      // the first processes of some stages die at exact points (the others at random times)
      hooks: {
        update: ['update:trained@1', 'checkpoint:half-written@1', 'update:version-written@2', 'checkpoint:recorded@1'],
        rollout: ['rollout:generated@1', 'rollout:start@2'],
        advantage: ['advantage:computed@1'],
        reward: ['reward:scored@1'],
      },
      log: (l) => console.log(`  [${((Date.now() - t0) / 1000).toFixed(0)} s] ${l}`),
    });
    cleanups.push(() => harness.stop());
    // PostgreSQL goes away for a few seconds in the middle of the run (once 10 steps are done)
    const pgRestart = { done: false, atStep: 0, downMs: 0 };
    let lastProbe = 0;
    harness.onTick = async () => {
      if (pgRestart.done || Date.now() - lastProbe < 2000) return;
      lastProbe = Date.now();
      const probe = await runState({ kind: 'postgres', url: db.url });
      const steps = probe.rows.length / (BATCH * N);
      if (steps < 10) return;
      const tDown = Date.now();
      console.log(
        `  PostgreSQL stop after ${harness.kills.length} kills (${steps} steps of trajectories, last checkpoint step ${probe.latest?.step ?? 0})`,
      );
      pgctl('stop');
      await sleep(3000);
      pgctl('start');
      await pgReady(60_000);
      Object.assign(pgRestart, { done: true, atStep: steps, downMs: Date.now() - tDown });
      console.log(`  PostgreSQL back after ${pgRestart.downMs} ms`);
    };
    await harness.run();
    const tRun = Date.now();

    console.log(
      `chaos (seed ${SEED}): ${harness.kills.length} kills in ${((tRun - tRef) / 1000).toFixed(0)} s (reference run ${((tRef - t0) / 1000).toFixed(0)} s)`,
    );
    const byStage: Record<string, number> = {},
      byPhase: Record<string, number> = {};
    for (const k of harness.kills) {
      byStage[k.stage] = (byStage[k.stage] ?? 0) + 1;
      byPhase[k.phase] = (byPhase[k.phase] ?? 0) + 1;
    }
    console.log(`  kills by stage: ${JSON.stringify(byStage)}`);
    console.log(`  kills by phase: ${JSON.stringify(byPhase)}`);
    console.log(
      `  self-kills at crash points: ${harness.kills.filter((k) => k.how !== 'random SIGKILL').length}, random SIGKILLs: ${harness.kills.filter((k) => k.how === 'random SIGKILL').length}`,
    );
    for (const need of ['rollout', 'update', 'checkpoint write'])
      assert.ok(byPhase[need], `a kill hit the ${need} phase`);
    assert.ok(harness.kills.length >= MIN_KILLS, `at least ${MIN_KILLS} kills (got ${harness.kills.length})`);
    assert.ok(pgRestart.done, 'PostgreSQL was restarted during the run');
    assert.ok(
      pgRestart.atStep >= 10 && pgRestart.atStep < STEPS,
      `the restart happened mid-run (step ${pgRestart.atStep} of ${STEPS})`,
    );
    // the stages saw the outage and retried instead of exiting (the harness fails on any other exit)
    const all = ['update', 'controller', 'advantage', 'reward', 'rollout']
      .flatMap((s) => harness.outputs(s))
      .join('\n');
    const retries = (all.match(/retriable handler error|bus error, retrying|cannot start yet|failed, retrying/g) ?? [])
      .length;
    console.log(`  retry warnings logged: ${retries}`);
    assert.ok(retries > 0, 'the stages logged retries while PostgreSQL was away');

    const got = await runState({ kind: 'postgres', url: db.url });
    assert.equal(got.latest?.step, STEPS);
    assert.equal(got.latest?.sha256, want.latest!.sha256, "the final checkpoint equals the uninterrupted run's");
    assert.deepEqual(
      got.checkpoints.map((c) => [c.step, c.sha256]),
      want.checkpoints.map((c) => [c.step, c.sha256]),
      "every checkpoint equals the uninterrupted run's",
    );
    assert.equal(got.rows.length, STEPS * BATCH * N, 'one trajectory row per (step, prompt, sample)');
    assert.equal(
      new Set(got.rows.map((r) => `${r.step}/${r.prompt_index}/${r.sample_index}`)).size,
      STEPS * BATCH * N,
      'no duplicates',
    );
    for (const r of got.rows) assert.equal(r.epoch, Math.floor((r.step - 1) / SPE));
    assert.deepEqual(got.rows, want.rows, "the trajectories equal the uninterrupted run's");
  },
);
