/**
 * Uses the shared test database (RLSTREAM_TEST_PG_URL): this file runs alone (@runs-alone).
 * `rlstream sql` against PostgreSQL with a superuser URL: statements outside plain
 * read queries are refused before they are sent — the attack strings (copy to
 * program / to a file, pg_read_file, lo_import, lock inside do $$ … $$, a data-modifying CTE) and
 * their disguises — while keywords inside strings, quoted identifiers and comments are fine; a
 * query waits at most lock_timeout for a lock; a superuser connection is refused (the reader role's
 * tests: sql-reader-role.test.ts).
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import { runReadOnlyQuery } from '../../../lib/analysis/query.ts';
import { assertPlainRead } from '../../../lib/analysis/sql-guard.ts';
import { runSql } from '../../../app/cli/commands/sql.ts';
import { docQueries } from '../../unit/analysis/doc-queries.ts';
import { PG_URL, freshDatabase } from '../../../devkit/pipeline-procs.ts';

let db: { url: string; drop(): Promise<void> };
let database: Database;
/** The same database as rlstream_reader (created by migrate; logins enabled here). */
let readerUrl: string;
const marker = join(tmpdir(), `rlstream-sql-guard-${process.pid}`);
before(async () => {
  db = await freshDatabase(`rl_int_sqlguard_${process.pid}`);
  database = await openDatabase({ kind: 'postgres', url: db.url });
  await database.pool.query('alter role rlstream_reader login');
  const u = new URL(db.url);
  u.username = 'rlstream_reader';
  readerUrl = u.toString();
  await database.pool.query(
    `insert into runs (run_id, project, experiment, status, config) values ('r', 'p', 'e', 'running', '{}')`,
  );
});
after(async () => {
  await database?.close();
  await db?.drop();
  rmSync(marker, { force: true });
});

const ATTACKS = [
  `copy (select 1) to program 'psql ${PG_URL} -c "delete from runs"'`,
  `copy (select 1) to '${marker}'`,
  `select pg_read_file('/etc/passwd')`,
  `select lo_import('/etc/passwd')`,
  `do $$ begin lock table runs in access exclusive mode; perform pg_sleep(5); end $$`,
  `with d as (delete from runs returning *) select count(*) from d`,
  `with d as (update runs set status = 'x' returning *) select * from d`,
  `select 1; delete from runs`,
  `select * into stolen from runs`,
  `select "pg_read_file"('/etc/passwd')`,
  `select pg_catalog.pg_read_file('/etc/passwd')`,
  `select PG_READ_FILE('/etc/passwd')`,
  `select set_config('transaction_read_only', 'off', true)`,
  `explain analyze delete from runs`,
  `select * from runs for update`,
  `select query_to_xml('copy (select 1) to program ''true''', true, true, '')`,
  `/* select */ lock table runs`,
  `set role postgres`,
  `call something()`,
  `notify ch, 'x'`,
  `prepare p as delete from runs`,
];

test('every attack string is refused before it is sent, and nothing happened', async () => {
  for (const q of ATTACKS) {
    await assert.rejects(
      runReadOnlyQuery(database, q),
      (e: Error & { code?: string }) =>
        (e.code === 'ERR_READ_ONLY' && /the query must only read: .*refused/.test(e.message)) ||
        /one SQL statement per call/.test(e.message),
      q,
    );
  }
  assert.equal(
    (await database.pool.query('select count(*)::int as n from runs')).rows[0].n,
    1,
    'the row is still there',
  );
  assert.equal(existsSync(marker), false, 'no file was written');
});

test("plain reads pass, keywords inside strings, quoted identifiers and comments included; so do the docs' queries", async () => {
  const ok = [
    `select 'copy; delete from runs' as s, "update" from (values (1)) t("update")`,
    `/* delete */ select 1 -- drop table runs`,
    `select $$; drop table runs $$ as s, $tag$ lock $tag$ as t, E'it\\'s; delete' as u`,
    `explain select * from runs`,
    `explain (analyze, costs off) select count(*) from runs`,
    `table runs`,
    `values (1), (2)`,
    `(select run_id from runs) union all (select 'x')`,
    `select run_id from runs order by run_id fetch first 1 rows only;`,
  ];
  for (const q of ok) await runReadOnlyQuery(database, q);
  for (const d of docQueries()) assert.doesNotThrow(() => assertPlainRead(d.sql), d.title);
});

test('a query waits at most lock_timeout behind a lock; a superuser connection is refused, the reader is not', async () => {
  const holder = new pg.Client({ connectionString: db.url });
  await holder.connect();
  try {
    await holder.query('begin');
    await holder.query('lock table runs in access exclusive mode');
    const t0 = Date.now();
    await assert.rejects(
      runReadOnlyQuery(database, 'select count(*) from runs', { lockTimeoutS: 0.5 }),
      /lock timeout/,
    );
    assert.ok(Date.now() - t0 < 5000);
  } finally {
    await holder.query('rollback').catch(() => undefined);
    await holder.end();
  }
  const err: string[] = [];
  const io = {
    out: () => undefined,
    err: (t: string) => {
      err.push(t);
    },
  };
  await assert.rejects(
    runSql([db.url, 'select 1 as one'], io),
    /does not run queries as the superuser postgres.*ALTER ROLE rlstream_reader LOGIN/,
  );
  assert.equal(await runSql([readerUrl, 'select 1 as one'], io), 0);
});

test('every query runs under a statement_timeout: 300 s unless --timeout-s says otherwise, and a slow query is cancelled', async () => {
  const out: string[] = [];
  const io = {
    out: (t: string) => {
      out.push(t);
    },
    err: () => undefined,
  };
  assert.equal(await runSql([readerUrl, `select current_setting('statement_timeout') as t`, '--json'], io), 0);
  assert.match(out.join(''), /"t":\s*"5min"/);
  out.length = 0;
  assert.equal(
    await runSql([readerUrl, `select current_setting('statement_timeout') as t`, '--json', '--timeout-s', '0'], io),
    0,
  );
  assert.match(out.join(''), /"t":\s*"0"/);
  const err: string[] = [];
  await assert.rejects(
    runSql([readerUrl, 'select pg_sleep(5)', '--timeout-s', '0.5'], {
      out: () => undefined,
      err: (t) => {
        err.push(t);
      },
    }),
    /cancelled: canceling statement due to statement timeout/,
  );
});
