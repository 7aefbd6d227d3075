/**
 * A new embedded database is unpacked from the cached empty cluster (lib/db/pglite-template.ts):
 * initdb gives every cluster its own system identifier, so a database with the cache's identifier
 * came from the cache. The copy opens, migrates, keeps rows across a reopen; a damaged cache file
 * is replaced by a fresh initdb's; a cache directory that cannot be written changes nothing but time.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { openDatabase } from '../../../lib/db/database.ts';
import { cacheDir } from '../../../lib/db/pglite-template.ts';

const tmp = join(import.meta.dirname, '../../.tmp', `pglite-template-${process.pid}`);
const saved = process.env.RLSTREAM_CACHE_DIR;
after(() => {
  if (saved === undefined) delete process.env.RLSTREAM_CACHE_DIR;
  else process.env.RLSTREAM_CACHE_DIR = saved;
  rmSync(tmp, { recursive: true, force: true });
});

/** Opens (migrating) the embedded database in `dir`, returns its cluster's system identifier. */
async function systemId(dir: string, write?: string): Promise<{ id: string; rows: string[] }> {
  const db = await openDatabase({ kind: 'pglite', dir });
  try {
    const r = await sql<{ id: string }>`select system_identifier::text as id from pg_control_system()`.execute(db.db);
    await sql`create table if not exists t (v text)`.execute(db.db);
    if (write) await sql`insert into t values (${write})`.execute(db.db);
    const rows = await sql<{ v: string }>`select v from t order by v`.execute(db.db);
    return { id: r.rows[0]!.id, rows: rows.rows.map((x) => x.v) };
  } finally {
    await db.close();
  }
}

function templates(dir: string): string[] {
  return existsSync(dir) ? readdirSync(dir).filter((n) => n.endsWith('.tar')) : [];
}

test('RLSTREAM_CACHE_DIR, else XDG_CACHE_HOME/rlstream, else ~/.cache/rlstream', () => {
  assert.equal(cacheDir({ RLSTREAM_CACHE_DIR: '/c', XDG_CACHE_HOME: '/x' }), '/c');
  assert.equal(cacheDir({ XDG_CACHE_HOME: '/x' }), '/x/rlstream');
  assert.match(cacheDir({}), /\.cache\/rlstream$/);
});

test('new databases after the first are copies of the cached empty cluster; a damaged copy is replaced', async () => {
  const cache = join(tmp, 'cache');
  process.env.RLSTREAM_CACHE_DIR = cache;
  const first = await systemId(join(tmp, 'a'), 'a1');
  const [tar] = templates(cache);
  assert.ok(tar, 'the first new database wrote the cache');
  const second = await systemId(join(tmp, 'b'), 'b1');
  assert.equal(second.id, first.id, 'the second database is the cached cluster');
  assert.deepEqual(second.rows, ['b1'], 'nothing of the first database is in the copy');
  // the copy is a database like any other: reopened, it keeps its rows and takes more
  assert.deepEqual((await systemId(join(tmp, 'b'), 'b2')).rows, ['b1', 'b2']);
  assert.deepEqual((await systemId(join(tmp, 'a'))).rows, ['a1']);

  // a damaged cache file: initdb makes the database and a new copy replaces the damaged one
  writeFileSync(join(cache, tar), 'not a tar');
  const third = await systemId(join(tmp, 'c'), 'c1');
  assert.notEqual(third.id, first.id, 'made by initdb');
  assert.ok(statSync(join(cache, tar)).size > 1_000_000, 'the cache holds a whole cluster again');
  assert.equal((await systemId(join(tmp, 'd'))).id, third.id, 'the next database is the new copy');
});

test('a cache directory that cannot be made: databases open as before', async () => {
  const blocked = join(tmp, 'blocked');
  mkdirSync(tmp, { recursive: true });
  writeFileSync(blocked, 'a file where the cache directory would be');
  process.env.RLSTREAM_CACHE_DIR = join(blocked, 'cache');
  const one = await systemId(join(tmp, 'e'), 'e1');
  const two = await systemId(join(tmp, 'f'), 'f1');
  assert.notEqual(one.id, two.id, 'each made by initdb');
  assert.deepEqual(two.rows, ['f1']);
});
