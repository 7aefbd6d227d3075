/**
 * One database handle for the run: PGlite in a run directory (embedded default) or a real
 * PostgreSQL via a URL. Both are driven through Kysely's PostgresDialect over a node-postgres
 * Pool (for PGlite: `@electric-sql/pglite/node-postgres`), so the same SQL serves both.
 * The embedded event log and the store share this handle, so a stage can consume a batch, write
 * its outputs and commit its offset in one transaction.
 */
import { Kysely, PostgresDialect, sql, type Transaction } from 'kysely';
import pg from 'pg';
import { acquireLock, type LockHandle } from './lock-file.ts';
import { migrate } from './migrate.ts';
import { createPglite } from './pglite-durable.ts';
import { makeDirs } from '../util/make-dirs.ts';
import { serveSnapshots, type SnapshotServer } from './snapshot.ts';
import { RlError, errorMessage, storageFault } from '../errors.ts';

export type DatabaseTarget =
  | {
      kind: 'pglite';
      dir: string;
      breakLock?: boolean;
      /** fsync at every commit, as PostgreSQL (default true; lib/db/pglite-durable.ts). */
      durable?: boolean;
    }
  | { kind: 'postgres'; url: string; poolSize?: number };

/** Kysely over our tables. Rows are typed where they are used (lib/store, lib/bus). */
export type Db = Kysely<any>;
export type Tx = Transaction<any>;
/** Where a query runs: the database handle, or a transaction on it. */
export type Executor = Db | Tx;

export interface Database {
  readonly kind: 'pglite' | 'postgres';
  readonly db: Db;
  /** Raw node-postgres pool (COPY on real Postgres; PGlite's pool of size 1). */
  readonly pool: pg.Pool;
  /** PGlite instance when kind === 'pglite' (fast COPY FROM blob). */
  readonly pglite?: import('@electric-sql/pglite').PGlite;
  /** Human-readable location for messages (never contains a password). */
  readonly where: string;
  close(): Promise<void>;
}

// int8 → JS number (offsets, steps fit comfortably in 2^53); numeric → number.
pg.types.setTypeParser(20, (v) => Number(v));
pg.types.setTypeParser(1700, (v) => Number(v));

export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '<unparseable database url>';
  }
}

/**
 * Why an embedded database could not be opened, in one line naming its directory: a full or
 * read-only disk (PGlite's Emscripten errno), or files PGlite aborted on (a missing pg_control, a
 * truncated table file: damaged, e.g. by a copy or a disk failure), with what to do.
 */
export function embeddedOpenError(e: unknown, pgdata: string): unknown {
  const storage = storageFault(e, pgdata);
  if (storage) return storage;
  const msg = errorMessage(e);
  const code = (e as { code?: unknown })?.code;
  if (
    code === 'XX001' ||
    code === 'XX002' ||
    /Aborted\(|RuntimeError|unreachable|could not (open|read) file|could not read blocks? |invalid page|pg_control/i.test(
      msg,
    )
  ) {
    return new RlError(
      `the embedded database ${pgdata} cannot be opened: its files are damaged or incomplete (${/Aborted\(/.test(msg) ? 'PGlite aborted reading them, e.g. global/pg_control is missing' : msg.split('\n')[0].slice(0, 200)}). ` +
        'Restore the run directory from a copy, or continue in a new run directory from the last complete checkpoint: trainer.run_dir=<new dir> trainer.load_checkpoint_path=<this run dir>/checkpoints/global_step_N',
      { code: 'ERR_DB_DAMAGED', cause: e },
    );
  }
  return e instanceof Error
    ? e
    : new RlError(`cannot open the embedded database ${pgdata}: ${msg}`, { code: 'ERR_DB_OPEN', cause: e });
}

export async function openDatabase(target: DatabaseTarget, opts: { migrate?: boolean } = {}): Promise<Database> {
  const doMigrate = opts.migrate ?? true;
  if (target.kind === 'pglite') {
    makeDirs(target.dir, 'the embedded database directory');
    const lock: LockHandle = acquireLock(target.dir, 'embedded database', { breakLock: target.breakLock });
    try {
      const { createPgConfig } = await import('@electric-sql/pglite/node-postgres');
      const pglite = await createPglite(`${target.dir}/pgdata`, target.durable ?? true).catch((e: unknown) => {
        throw embeddedOpenError(e, `${target.dir}/pgdata`);
      });
      const pool = new pg.Pool(createPgConfig(pglite) as unknown as pg.PoolConfig);
      const db = new Kysely<any>({ dialect: new PostgresDialect({ pool }) });
      let snapshots: SnapshotServer | null = null;
      const database: Database = {
        kind: 'pglite',
        db,
        pool,
        pglite,
        where: `embedded database ${target.dir}`,
        async close() {
          await snapshots?.close().catch(() => undefined);
          await db.destroy().catch(() => undefined);
          await pglite.close().catch(() => undefined);
          lock.release();
        },
      };
      if (doMigrate)
        await migrate(db).catch(async (e: unknown) => {
          await database.close();
          throw embeddedOpenError(e, `${target.dir}/pgdata`);
        });
      // other processes (rlstream sql / runs / report) read this database through snapshots
      snapshots = await serveSnapshots(pglite, target.dir).catch(() => null);
      return database;
    } catch (e) {
      lock.release();
      throw e;
    }
  }
  const pool = new pg.Pool({
    connectionString: target.url,
    max: target.poolSize ?? 8,
    connectionTimeoutMillis: 10_000,
  });
  pool.on('error', () => {
    /* idle client lost (server restart): the next query reconnects */
  });
  // A client checked out when its connection dies emits 'error' too, and pg-pool only listens on
  // idle ones: without this, a server restart mid-query crashed the process with an uncaught
  // 'Connection terminated unexpectedly'. The failure still reaches the caller as the rejected
  // query, and the pool discards the broken client when it is released.
  pool.on('connect', (client) => {
    client.on('error', () => undefined);
  });
  const db = new Kysely<any>({ dialect: new PostgresDialect({ pool }) });
  const where = `PostgreSQL ${redactUrl(target.url)}`;
  try {
    await sql`select 1`.execute(db);
  } catch (e) {
    await db.destroy().catch(() => undefined);
    throw new RlError(`cannot connect to ${where}: ${(e as Error).message}`, {
      retriable: true,
      code: 'ERR_DB_CONNECT',
      cause: e,
    });
  }
  if (doMigrate) await migrate(db);
  return {
    kind: 'postgres',
    db,
    pool,
    where,
    async close() {
      await db.destroy();
    },
  };
}
