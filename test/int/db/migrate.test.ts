/**
 * `rlstream migrate` and lib/db/migrate.ts on a fresh PostgreSQL database: several migrators at
 * once (separate connections, as several pods would) apply each migration exactly once under the
 * advisory lock; a second run applies nothing; stages waiting for the schema see it complete.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { sql } from 'kysely';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import { listMigrations, migrate, migrationStatus, waitForMigrations } from '../../../lib/db/migrate.ts';
import { ROOT, freshDatabase } from '../../../devkit/pipeline-procs.ts';

const run = promisify(execFile);
const cleanups: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
});

async function open(url: string): Promise<Database> {
  const d = await openDatabase({ kind: 'postgres', url, poolSize: 2 }, { migrate: false });
  cleanups.push(() => d.close());
  return d;
}

test(
  'concurrent migrators apply every migration once; waiters see the schema complete',
  { timeout: 120_000 },
  async () => {
    const db = await freshDatabase(`rl_migrate_${process.pid}`);
    cleanups.push(db.drop);
    const waiter = await open(db.url);
    const before = await migrationStatus(waiter.db);
    assert.deepEqual(before.applied, []);
    assert.deepEqual(
      before.pending,
      listMigrations().map((m) => m.name),
    );
    let told: string[] | null = null;
    const waiting = waitForMigrations(waiter.db, {
      pollMs: 50,
      onWait: (s) => {
        told = s.pending;
      },
    });

    const dbs = await Promise.all([0, 1, 2, 3].map(() => open(db.url)));
    const results = await Promise.all(dbs.map((d) => migrate(d.db)));
    // exactly one migrator applied each migration; the others found it applied
    const all = results.flat().sort();
    assert.deepEqual(
      all,
      listMigrations().map((m) => m.name),
    );
    const done = await waiting;
    assert.deepEqual(done.pending, []);
    assert.ok(told && (told as string[]).length > 0, 'the waiter was told what it waits for');
    const rows = (await sql<{ n: number }>`select count(*)::int as n from rlstream_migrations`.execute(waiter.db))
      .rows[0].n;
    assert.equal(rows, listMigrations().length);
    // the policy store tables of the newest migration exist
    await sql`select run_id, kind, version, name, seq, data from policy_chunks limit 0`.execute(waiter.db);

    // the CLI: two at once, each one line, exit 0
    const env = { ...process.env, RLSTREAM_PIPELINE__STORE: 'postgres', RLSTREAM_PIPELINE__DATABASE_URL: db.url };
    const cli = () =>
      run(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), 'migrate', join(ROOT, 'test/e2e/fixtures/tiny.yaml')], {
        cwd: ROOT,
        env,
      });
    const outs = await Promise.all([cli(), cli()]);
    for (const o of outs) {
      assert.equal(o.stdout.trim().split('\n').length, 1, o.stdout);
      assert.match(
        o.stdout,
        /^migrated PostgreSQL postgres:\/\/.*: nothing to apply; schema at \d{8}_\d{4}_\w+\.sql \(\d+ migrations\)$/m,
      );
    }
  },
);

test('rlstream migrate refuses the embedded store with one line', async () => {
  const r = await run(
    process.execPath,
    [join(ROOT, 'bin/rlstream.mjs'), 'migrate', join(ROOT, 'test/e2e/fixtures/tiny.yaml')],
    { cwd: ROOT, env: { ...process.env, RLSTREAM_PIPELINE__STORE: 'embedded' } },
  ).then(
    () => null,
    (e: { code: number; stderr: string }) => e,
  );
  assert.ok(r, 'exits non-zero');
  assert.equal(r.code, 1);
  assert.match(r.stderr, /rlstream migrate: .*pipeline\.store=postgres/);
});
