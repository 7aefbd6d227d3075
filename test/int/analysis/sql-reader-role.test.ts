/**
 * `rlstream sql` runs the query as rlstream_reader (created by migrate), so what slips past its
 * syntax check still cannot act: a function name written with Unicode escapes
 * (`U&"pg\005fterminate\005fbackend"`), a query string handed to `ts_stat(…)` that reads a server
 * file or switches the role, `pg_stat_reset()`. On PostgreSQL (as the reader, the only way
 * `rlstream sql` runs there) another session survives, no file is read, the role stays; on an
 * embedded run (PGlite) the same queries are refused.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import { runReadOnlyQuery } from '../../../lib/analysis/query.ts';
import { assertPlainRead } from '../../../lib/analysis/sql-guard.ts';
import { runSql } from '../../../app/cli/commands/sql.ts';
import { freshDatabase } from '../../../devkit/pipeline-procs.ts';

let db: { url: string; drop(): Promise<void> };
let database: Database;
let readerUrl: string;
const dir = mkdtempSync(join(tmpdir(), 'rlstream-sqlrole-'));
before(async () => {
  db = await freshDatabase(`rl_int_sqlrole_${process.pid}`);
  database = await openDatabase({ kind: 'postgres', url: db.url });
  await database.pool.query('alter role rlstream_reader login');
  const u = new URL(db.url);
  u.username = 'rlstream_reader';
  readerUrl = u.toString();
});
after(async () => {
  await database?.close();
  await db?.drop();
  rmSync(dir, { recursive: true, force: true });
});

const TERMINATE = `select U&"pg\\005fterminate\\005fbackend"(pid) from pg_stat_activity where pid <> pg_backend_pid() and datname = current_database()`;
const READ_FILE = `select * from ts_stat('select to_tsvector(pg_read_file(''/etc/hostname''))')`;
const SWITCH_ROLE = `select * from ts_stat('select to_tsvector(set_config(''role'', ''postgres'', false))')`;
const RESET_STATS = 'select pg_stat_reset()';

test('the bypasses pass the syntax check: only the role stops them', () => {
  for (const q of [TERMINATE, READ_FILE, SWITCH_ROLE, RESET_STATS]) assertPlainRead(q);
});

test('PostgreSQL, as rlstream_reader: no session killed, no server file read, no role switched, no statistics reset', async () => {
  const victim = new pg.Client({ connectionString: db.url });
  await victim.connect();
  victim.on('error', () => undefined);
  const io = { out: () => undefined, err: () => undefined };
  try {
    await assert.rejects(runSql([readerUrl, TERMINATE], io), /permission denied|must be a (superuser|member)/i);
    assert.equal((await victim.query('select 1 as one')).rows[0].one, 1, 'the other session is alive');
    await assert.rejects(runSql([readerUrl, READ_FILE], io), /permission denied for function pg_read_file/);
    await assert.rejects(runSql([readerUrl, SWITCH_ROLE], io), /permission denied to set role "postgres"/);
    await assert.rejects(runSql([readerUrl, RESET_STATS], io), /permission denied for function pg_stat_reset/);
    // and through a library call on a superuser connection, the query still runs as the reader
    const who = await runReadOnlyQuery(database, 'select current_user');
    assert.equal(who.rows[0][0], 'rlstream_reader');
    await assert.rejects(runReadOnlyQuery(database, READ_FILE), /permission denied for function pg_read_file/);
    await assert.rejects(runReadOnlyQuery(database, RESET_STATS), /permission denied for function pg_stat_reset/);
  } finally {
    await victim.end();
  }
});

test('PGlite (an embedded run): the same queries are refused', async () => {
  const embedded = await openDatabase({ kind: 'pglite', dir: join(dir, 'db') });
  try {
    assert.equal((await runReadOnlyQuery(embedded, 'select current_user')).rows[0][0], 'rlstream_reader');
    await assert.rejects(
      runReadOnlyQuery(embedded, `select * from ts_stat('select to_tsvector(pg_read_file(''PG_VERSION''))')`),
      /permission denied for function pg_read_file/,
    );
    await assert.rejects(runReadOnlyQuery(embedded, RESET_STATS), /permission denied for function pg_stat_reset/);
  } finally {
    await embedded.close();
  }
});
