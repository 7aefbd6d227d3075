/**
 * Uses the shared test database (RLSTREAM_TEST_PG_URL): this file runs alone (@runs-alone).
 * The store contract on a real PostgreSQL (RLSTREAM_TEST_PG_URL, default
 * postgres://postgres@127.0.0.1:5432/test), plus what only this adapter does: COPY on the client of
 * a caller's transaction, and the fall-back when a concurrent writer stores the same ids between
 * the duplicate check and the COPY.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { sql } from 'kysely';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import { PostgresStore } from '../../../lib/store/postgres-store.ts';
import { runStoreContract } from '../../support/store-contract.ts';
import { trajectory, uniqueRunId } from '../../support/store-fixtures.ts';

const url = process.env.RLSTREAM_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

runStoreContract('postgres', async () => {
  const database = await openDatabase({ kind: 'postgres', url });
  return { database, store: new PostgresStore(database) };
});

describe('PostgresStore specifics', () => {
  let database: Database;
  let store: PostgresStore;
  const runId = uniqueRunId('pg-specific');

  before(async () => {
    database = await openDatabase({ kind: 'postgres', url });
    store = new PostgresStore(database);
    await store.upsertRun({ runId, project: 'pg-specific', experiment: 'x', config: {} });
  });

  after(async () => {
    await sql`delete from runs where run_id = ${runId}`.execute(database.db);
    await store.close();
    await database.close();
  });

  it("finds the pooled client a caller's transaction runs on (so the COPY joins that transaction)", async () => {
    await database.db.transaction().execute(async (tx) => {
      const client = await store.clientOf(tx);
      assert.ok(client, "the transaction's client is known");
      const { rows } = await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(tx);
      assert.equal((client as unknown as { processID: number }).processID, rows[0]!.pid);
    });
  });

  it('falls back to staging + on-conflict when a concurrent writer stores the same ids after the check', async () => {
    const rows = Array.from({ length: 40 }, (_, i) => trajectory(runId, 1000 + i));
    let release!: () => void;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    let firstInserted!: () => void;
    const inserted = new Promise<void>((r) => {
      firstInserted = r;
    });
    // Writer 1 inserts the rows in a transaction it keeps open.
    const writer1 = database.db.transaction().execute(async (tx) => {
      const r = await store.insertTrajectories(rows, { tx });
      firstInserted();
      await gate;
      return r;
    });
    await inserted;
    // Writer 2 sees no stored ids (writer 1 has not committed), so it COPYs and blocks on writer 1's keys.
    const writer2 = store.insertTrajectories(rows);
    const monitor = await database.pool.connect();
    try {
      for (let waited = 0; ; waited++) {
        const { rows: waiting } = await monitor.query(
          `select 1 from pg_stat_activity where wait_event_type = 'Lock' and query like 'copy trajectories%'`,
        );
        if (waiting.length > 0) break;
        assert.ok(waited < 2000, 'writer 2 never blocked in its COPY');
        await new Promise((r) => setTimeout(r, 5));
      }
    } finally {
      monitor.release();
    }
    release();
    assert.deepEqual(await writer1, { inserted: 40, duplicates: 0 });
    assert.deepEqual(await writer2, { inserted: 0, duplicates: 40 });
    assert.equal(await store.countTrajectories(runId), 40);
  });
});
