/**
 * `rlstream serve` as a cluster runs it: five stage processes over Kafka (librdkafka
 * mock) and PostgreSQL, each with its OWN run directory (policy_store = postgres: no shared
 * volume), HTTP on a free port each. The stages wait for `rlstream migrate` (/readyz 503 says so),
 * become ready once it ran (twice at once), and a SIGTERM in the middle of a batch (update, then
 * rollout) stops the process with exit 0 within the grace period; each is restarted — the update
 * stage on "another node", with an empty run directory — and the run ends with the same final
 * checkpoint sha256 as the embedded run. /metrics carries the values the store received. After
 * the run the stages stay up idle (/readyz 503 "completed", rlstream_run_finished 1), also one
 * started after the end; SIGTERM then exits them with 0.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { rmSync, readdirSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { openDatabase } from '../../lib/db/database.ts';
import { ROOT, freshDatabase, kafkaForRun } from '../../devkit/pipeline-procs.ts';
import { spawnCli, sleep, type CliProc } from '../support/chaos-procs.ts';

const run = promisify(execFile);
const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'serve-e2e';
const tmp = join(ROOT, 'test/.tmp', `serve-${process.pid}`);
const procs: CliProc[] = [];
const cleanups: Array<() => Promise<void>> = [];
after(async () => {
  for (const p of procs)
    if (p.child.exitCode === null && p.child.signalCode === null) {
      try {
        process.kill(p.pid, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  rmSync(tmp, { recursive: true, force: true });
});

/** A cluster's stage: no on-exit/migrate conveniences of the test helpers, a free HTTP port. */
const CLUSTER_ENV = {
  RLSTREAM_PIPELINE__ON_RUN_END: 'idle',
  RLSTREAM_PIPELINE__MIGRATE_ON_START: 'false',
  RLSTREAM_PIPELINE__HTTP_PORT: '0',
  RLSTREAM_CRASH_TRACE: '1',
};

async function portOf(p: CliProc): Promise<number> {
  assert.ok(
    await p.waitFor(/serving \/healthz, \/readyz and \/metrics on port (\d+)/, 60_000),
    `no HTTP port:\n${p.output().slice(-2000)}`,
  );
  return Number(/serving \/healthz, \/readyz and \/metrics on port (\d+)/.exec(p.output())![1]);
}

async function get(port: number, path: string): Promise<{ status: number; body: string }> {
  const r = await fetch(`http://127.0.0.1:${port}${path}`);
  return { status: r.status, body: await r.text() };
}

async function until(what: string, check: () => Promise<boolean>, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await check().catch(() => false)) return;
    await sleep(200);
  }
  assert.fail(`timed out waiting for ${what}`);
}

async function exited(p: CliProc, ms: number): Promise<{ code: number | null; signal: NodeJS.Signals | null } | null> {
  return Promise.race([p.exit, sleep(ms).then(() => null)]);
}

test(
  'served stages: migrate, probes, metrics, SIGTERM mid-batch and restart without a shared run_dir, idle after the run',
  { timeout: 600_000 },
  async () => {
    // the uninterrupted reference: the embedded run
    const emb = await run(
      process.execPath,
      [
        join(ROOT, 'bin/rlstream.mjs'),
        'train',
        CONFIG,
        `trainer.run_dir=${join(tmp, 'embedded')}`,
        `pipeline.run_id=${RUN_ID}`,
      ],
      { cwd: ROOT, env: { ...process.env, RLSTREAM_LOG_JSON: '1' }, maxBuffer: 64 << 20 },
    );
    const want = /final checkpoint: .* sha256 ([0-9a-f]{64})\)/.exec(emb.stdout)?.[1];
    assert.ok(want, emb.stdout);

    const db = await freshDatabase(`rl_e2e_serve_${process.pid}`);
    cleanups.push(db.drop);
    const kafka = await kafkaForRun('serve', RUN_ID, 2);
    cleanups.push(() => kafka.stop());
    const common = [
      `pipeline.run_id=${RUN_ID}`,
      'pipeline.topic_prefix=serve',
      'pipeline.bus=kafka',
      `pipeline.brokers=[${kafka.brokers.join(',')}]`,
      'pipeline.policy_store=postgres',
      'trainer.save_freq=1',
    ];
    // the secret from the environment, as a Kubernetes Secret would give it
    const env = { ...CLUSTER_ENV, RLSTREAM_PIPELINE__STORE: 'postgres', RLSTREAM_PIPELINE__DATABASE_URL: db.url };
    let nodes = 0;
    const start = (stage: string, extraEnv: NodeJS.ProcessEnv = {}) => {
      // every process its own run directory: nothing shared but Kafka and PostgreSQL
      const p = spawnCli(
        [
          'serve',
          stage,
          CONFIG,
          ...common,
          `trainer.run_dir=${join(tmp, `${stage}-node${++nodes}`)}`,
          '--grace-seconds',
          '20',
        ],
        { ...env, ...extraEnv },
      );
      procs.push(p);
      return p;
    };
    const stages: Record<string, CliProc> = {};
    for (const s of ['update', 'controller', 'advantage', 'reward', 'rollout']) stages[s] = start(s);
    const ports: Record<string, number> = {};
    for (const s of Object.keys(stages)) ports[s] = await portOf(stages[s]);

    // not migrated yet: alive, not ready, and saying why
    assert.ok(
      await stages.update.waitFor(/waiting for the database schema/, 60_000),
      stages.update.output().slice(-2000),
    );
    assert.equal((await get(ports.update, '/healthz')).status, 200);
    const r0 = await get(ports.update, '/readyz');
    assert.equal(r0.status, 503);
    assert.match(JSON.parse(r0.body).reason, /waiting for migrations .*rlstream migrate/);

    // the migration Job, twice at once
    const migrate = () =>
      run(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), 'migrate', CONFIG], {
        cwd: ROOT,
        env: { ...process.env, ...env },
      });
    const m = await Promise.all([migrate(), migrate()]);
    const newest = readdirSync(join(ROOT, 'migrations'))
      .filter((f) => f.endsWith('.sql'))
      .sort()
      .at(-1)!;
    for (const x of m)
      assert.ok(x.stdout.startsWith('migrated PostgreSQL ') && x.stdout.includes(`schema at ${newest}`), x.stdout);

    for (const s of Object.keys(stages))
      await until(`${s} ready`, async () => (await get(ports[s], '/readyz')).status === 200, 120_000);
    // consumer lag per input partition while the run goes on
    assert.match(
      (await get(ports.advantage, '/metrics')).body,
      /rlstream_consumer_lag\{run_id="serve-e2e",stage="advantage",topic="serve\.serve-e2e\.scored",partition="1"\} \d+/,
    );

    // SIGTERM the update stage in the middle of training a step (the second: step 1's checkpoint is recorded)
    assert.ok(
      await stages.update.waitFor(/rlstream-crash-point update:start[\s\S]*rlstream-crash-point update:start/, 180_000),
      stages.update.output().slice(-3000),
    );
    const t0 = Date.now();
    process.kill(stages.update.pid, 'SIGTERM');
    const ue = await exited(stages.update, 25_000);
    assert.deepEqual(
      ue,
      { code: 0, signal: null },
      `update stops gracefully with 0:\n${stages.update.output().slice(-3000)}`,
    );
    assert.ok(Date.now() - t0 < 21_000, 'within the grace period');
    assert.match(stages.update.output(), /SIGTERM: stopping/);
    assert.match(stages.update.output(), /update stopped: consumer left its group/);
    // another node: an empty run directory; it resumes from the policy versions in PostgreSQL
    stages.update = start('update');
    ports.update = await portOf(stages.update);
    assert.ok(await stages.update.waitFor(/resumed at step \d+/, 120_000), stages.update.output().slice(-3000));
    // the checkpoint written on the old node is rebuilt from PostgreSQL on the new one
    const newNode = /"run_dir":"([^"]+)"/.exec(stages.update.output())![1];
    assert.ok(
      await stages.update.waitFor(/checkpoint global_step_1 rebuilt from the run's database/, 60_000),
      stages.update.output().slice(-3000),
    );
    assert.ok(
      existsSync(join(newNode, 'checkpoints', 'global_step_1', 'trainer_state.json')),
      'global_step_1 is on the new node',
    );

    // SIGTERM a rollout in the middle of generating: the next batch it starts, or its last one (step
    // 3's) when it started that before now — on a fast machine the restarted update may have
    // published v2 and the rollout begun step 3 already, and no batch follows the last
    const ro = stages.rollout;
    const batches = () => (ro.output().match(/rlstream-crash-point rollout:start/g) ?? []).length;
    const target = Math.min(batches() + 1, 3);
    await until('a rollout batch', async () => batches() >= target || ro.child.exitCode !== null, 180_000);
    process.kill(ro.pid, 'SIGTERM');
    assert.deepEqual(await exited(ro, 25_000), { code: 0, signal: null }, ro.output().slice(-3000));
    stages.rollout = start('rollout');
    ports.rollout = await portOf(stages.rollout);

    // the run ends; every stage stays up, idle, and says so
    for (const s of Object.keys(stages)) {
      await until(
        `${s} idle after the run`,
        async () => {
          const r = await get(ports[s], '/readyz');
          return r.status === 503 && /completed/.test(JSON.parse(r.body).reason as string);
        },
        300_000,
      );
    }
    assert.match(stages.controller.output(), /has finished; controller stays up idle/);
    const metrics = (await get(ports.update, '/metrics')).body;
    assert.match(metrics, /rlstream_run_finished\{run_id="serve-e2e",stage="update",status="completed"\} 1/);
    assert.match(metrics, /rlstream_policy_version\{run_id="serve-e2e",stage="update"\} 3/);
    assert.match(metrics, /rlstream_batches_total\{run_id="serve-e2e",stage="update"\} [1-9]/);
    assert.match(metrics, /rlstream_phase_seconds_total\{run_id="serve-e2e",stage="update",phase="compute"\} /);
    assert.match(metrics, /process_resident_memory_bytes\{run_id="serve-e2e",stage="update"\} /);

    const store = await openDatabase({ kind: 'postgres', url: db.url }, { migrate: false });
    try {
      const ck = (
        await sql<{
          step: number;
          sha256: string;
        }>`select step, sha256 from checkpoints where run_id = ${RUN_ID} order by step desc limit 1`.execute(store.db)
      ).rows[0];
      assert.equal(ck.step, 3);
      assert.equal(
        ck.sha256,
        want,
        "SIGTERMs and a restart on an empty run_dir end with the uninterrupted run's checkpoint",
      );
      // /metrics shows the value the store received (the restarted update trained step 3)
      const stored = (
        await sql<{
          value: number;
        }>`select value from step_metrics where run_id = ${RUN_ID} and name = 'actor/pg_loss' and step = 3`.execute(
          store.db,
        )
      ).rows[0];
      const shown = new RegExp(
        `rlstream_metric\\{run_id="serve-e2e",stage="update",name="actor/pg_loss"\\} (\\S+)`,
      ).exec(metrics);
      assert.ok(stored && shown, metrics.slice(0, 2000));
      assert.equal(Number(shown[1]), stored.value);
      // no version files anywhere but PostgreSQL and the processes' caches
      for (const d of readdirSync(tmp).filter((n) => n.includes('-node')))
        assert.ok(!existsSync(join(tmp, d, 'policy')), `${d} has no policy/ directory`);
    } finally {
      await store.close();
    }

    // a stage started after the run's end stays up too (a Deployment would restart an exited one)
    const late = start('reward');
    const latePort = await portOf(late);
    await until('the late stage idle', async () => /completed/.test((await get(latePort, '/readyz')).body), 120_000);
    assert.ok(
      await late.waitFor(/run serve-e2e has finished; reward stays up idle/, 60_000),
      late.output().slice(-2000),
    );
    await sleep(1500);
    assert.equal(late.child.exitCode, null, 'still running');

    for (const p of [...Object.values(stages), late]) process.kill(p.pid, 'SIGTERM');
    for (const p of [...Object.values(stages), late])
      assert.deepEqual(await exited(p, 25_000), { code: 0, signal: null }, p.output().slice(-2000));
  },
);
