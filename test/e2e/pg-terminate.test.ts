/**
 * Lost database connections: the five stages as `rlstream serve` processes over the
 * embedded log on PostgreSQL, and every 0.4 s (once something new has committed) every backend
 * of the run's database is ended with pg_terminate_backend (57P01, as a failover or an
 * administrator does). Every PostgreSQL use of a stage — the store, the log over PostgreSQL,
 * stage state and the run watcher — must reconnect and retry, and the run must end with the
 * uninterrupted run's checkpoint sha256 and one row per sample.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { ROOT, freshDatabase, runDistributed } from '../../devkit/pipeline-procs.ts';
import { sleep } from '../support/chaos-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'pgterm';
const STEPS = 8;
const tmp = join(ROOT, 'test/.tmp', `pg-terminate-${process.pid}`);
const cleanups: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  rmSync(tmp, { recursive: true, force: true });
});

const common = [`pipeline.run_id=${RUN_ID}`, `trainer.max_steps=${STEPS}`, 'trainer.save_freq=4'];

async function final(target: { kind: 'pglite'; dir: string } | { kind: 'postgres'; url: string }) {
  const store = await openStore(target);
  try {
    return { ck: (await store.latestCheckpoint(RUN_ID))?.sha256, rows: await store.countTrajectories(RUN_ID) };
  } finally {
    await store.close();
  }
}

test(
  'pg_terminate_backend on every connection of a 5-process run, repeatedly: the run ends with the uninterrupted checkpoint',
  { timeout: 330_000 },
  async () => {
    const ref = await trainEmbedded(
      loadConfig({ file: CONFIG, overrides: [...common, `trainer.run_dir=${join(tmp, 'ref')}`] }),
      silentLogger(RUN_ID),
    );
    assert.equal(ref.status, 'completed', ref.message);
    const want = await final({ kind: 'pglite', dir: join(tmp, 'ref', 'db') });

    const name = `rl_e2e_pgterm_${process.pid}`;
    const db = await freshDatabase(name);
    cleanups.push(db.drop);
    const admin = new pg.Client({ connectionString: db.url });
    await admin.connect();
    cleanups.push(() => admin.end());
    let terminated = 0,
      rounds = 0,
      stop = false;
    // A round ends every backend, then waits until the run has committed something new (a message
    // in the log): on a loaded machine a transaction may take longer than a round, and killing it
    // again before anything commits would only stall the run, which a real failover does not do.
    let committed = 0;
    const killer = (async () => {
      while (!stop) {
        await sleep(400);
        if (stop) break;
        const now = await admin.query(`select count(*)::int as n from bus_messages`).then(
          (r) => r.rows[0].n as number,
          () => 0, // not migrated yet
        );
        if (now <= committed) continue;
        committed = now;
        const n = await admin.query(
          `select count(*)::int as n from (select pg_terminate_backend(pid) from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()) t`,
          [name],
        );
        terminated += n.rows[0].n as number;
        rounds++;
      }
    })();
    let procs;
    try {
      procs = await runDistributed(
        CONFIG,
        [
          ...common,
          `trainer.run_dir=${join(tmp, 'dist')}`,
          'pipeline.topic_prefix=pgterm',
          'pipeline.bus=embedded',
          'pipeline.store=postgres',
          `pipeline.database_url=${db.url}`,
        ],
        { timeoutMs: 240_000 },
      );
    } finally {
      stop = true;
      await killer;
    }
    for (const p of procs)
      assert.equal(
        await p.exit,
        0,
        `${p.stage} exited 0 (${rounds} rounds, ${terminated} backends terminated):\n${p.output().slice(-3000)}`,
      );
    console.log(`  ${rounds} rounds, ${terminated} backends terminated`);
    assert.ok(
      rounds >= 5 && terminated >= 10,
      `connections were terminated during the run (${rounds} rounds, ${terminated} backends)`,
    );
    const got = await final({ kind: 'postgres', url: db.url });
    assert.deepEqual(got, want, "the uninterrupted run's final checkpoint and one row per sample");
  },
);
