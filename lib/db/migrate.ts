/**
 * Applies the frozen SQL migrations in migrations/ (date-prefixed `YYYYMMDD_NNNN_name.sql`) in
 * name order, each in its own transaction, recording them in `rlstream_migrations`. A Postgres
 * advisory lock serialises concurrent starters (several stage processes on one database).
 * Migrations are plain SQL: they import no app code, and once landed they never change —
 * a changed checksum is an error.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sql, type Kysely } from 'kysely';
import { RlError } from '../errors.ts';

export const MIGRATIONS_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '../../migrations');
const LOCK_KEY = 7_470_221_011; // arbitrary, stable

export interface Migration { name: string; sql: string; checksum: string }

export function listMigrations(dir = MIGRATIONS_DIR): Migration[] {
  return readdirSync(dir)
    .filter((f) => /^\d{8}_\d{4}_[a-z0-9_]+\.sql$/.test(f))
    .sort()
    .map((name) => {
      const text = readFileSync(join(dir, name), 'utf8');
      return { name, sql: text, checksum: createHash('sha256').update(text).digest('hex') };
    });
}

export async function migrate(db: Kysely<any>, dir = MIGRATIONS_DIR): Promise<string[]> {
  const migrations = listMigrations(dir);
  const applied: string[] = [];
  await db.connection().execute(async (conn) => {
    await sql`select pg_advisory_lock(${LOCK_KEY})`.execute(conn);
    try {
      await sql`create table if not exists rlstream_migrations (name text primary key, checksum text not null, applied_at timestamptz not null default now())`.execute(conn);
      const done = new Map((await sql<{ name: string; checksum: string }>`select name, checksum from rlstream_migrations`.execute(conn)).rows.map((r) => [r.name, r.checksum]));
      for (const m of migrations) {
        const prev = done.get(m.name);
        if (prev !== undefined) {
          if (prev !== m.checksum) throw new RlError(`migration ${m.name} was changed after it was applied (checksum differs); migrations are frozen — add a new migration instead`, { code: 'ERR_MIGRATION' });
          continue;
        }
        await conn.transaction().execute(async (tx) => {
          await sql.raw(m.sql).execute(tx);
          await sql`insert into rlstream_migrations (name, checksum) values (${m.name}, ${m.checksum})`.execute(tx);
        });
        applied.push(m.name);
      }
    } finally {
      await sql`select pg_advisory_unlock(${LOCK_KEY})`.execute(conn);
    }
  });
  return applied;
}
