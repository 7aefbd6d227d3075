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
import { RlError, TransientError } from '../errors.ts';

export const MIGRATIONS_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '../../migrations');
const LOCK_KEY = 7_470_221_011; // arbitrary, stable

export interface Migration {
  name: string;
  sql: string;
  checksum: string;
}

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
      await sql`create table if not exists rlstream_migrations (name text primary key, checksum text not null, applied_at timestamptz not null default now())`.execute(
        conn,
      );
      const done = new Map(
        (
          await sql<{ name: string; checksum: string }>`select name, checksum from rlstream_migrations`.execute(conn)
        ).rows.map((r) => [r.name, r.checksum]),
      );
      for (const m of migrations) {
        const prev = done.get(m.name);
        if (prev !== undefined) {
          if (prev !== m.checksum)
            throw new RlError(
              `migration ${m.name} was changed after it was applied (checksum differs); migrations are frozen — add a new migration instead`,
              { code: 'ERR_MIGRATION' },
            );
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

export interface MigrationStatus {
  /** Names applied in the database, in order. */
  applied: string[];
  /** Names this rlstream has that the database lacks (what `rlstream migrate` would apply). */
  pending: string[];
  /** The newest migration this rlstream has (the schema version it needs). */
  wanted: string | null;
}

/** What is applied and what is missing, without taking the lock or changing anything. */
export async function migrationStatus(db: Kysely<any>, dir = MIGRATIONS_DIR): Promise<MigrationStatus> {
  const migrations = listMigrations(dir);
  const exists = (await sql<{ t: string | null }>`select to_regclass('rlstream_migrations')::text as t`.execute(db))
    .rows[0]?.t;
  const applied = exists
    ? (await sql<{ name: string }>`select name from rlstream_migrations order by name`.execute(db)).rows.map(
        (r) => r.name,
      )
    : [];
  const have = new Set(applied);
  return {
    applied,
    pending: migrations.filter((m) => !have.has(m.name)).map((m) => m.name),
    wanted: migrations.at(-1)?.name ?? null,
  };
}

/**
 * Waits until every migration this rlstream has is applied (by `rlstream migrate`, a Job or an
 * init container), checking every `pollMs`; `onWait` is told once what is missing. A stage over a
 * shared PostgreSQL calls this instead of migrating itself. Rejects when `signal` aborts.
 */
export async function waitForMigrations(
  db: Kysely<any>,
  opts: { pollMs?: number; signal?: AbortSignal; onWait?: (s: MigrationStatus) => void } = {},
): Promise<MigrationStatus> {
  let told = false;
  for (;;) {
    const s = await migrationStatus(db);
    if (s.pending.length === 0) return s;
    if (!told) {
      opts.onWait?.(s);
      told = true;
    }
    if (opts.signal?.aborted) throw new TransientError(`stopped while waiting for migrations ${s.pending.join(', ')}`);
    await new Promise<void>((r) => {
      const t = setTimeout(r, opts.pollMs ?? 2000);
      opts.signal?.addEventListener(
        'abort',
        () => {
          clearTimeout(t);
          r();
        },
        { once: true },
      );
    });
  }
}
