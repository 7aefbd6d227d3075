/**
 * Where a run's data lives, from what a user types: a run directory (embedded store in
 * `<run_dir>/db/pgdata`), a bare run name found under `runs/`, or a `postgres://` URL.
 *
 * An embedded run directory is opened with openDatabase({kind:'pglite'}), which takes the run
 * directory's lock file; a directory held by a live training process is read through a snapshot
 * that process serves (lib/db/snapshot.ts), or fails saying what to do meanwhile. Opening an embedded run applies pending migrations (so an older run gains the
 * analysis views); a PostgreSQL is opened without migrating — it is shared, and the stages that
 * write to it apply the migrations.
 */
import { existsSync, statSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { openDatabase, redactUrl, type Database, type DatabaseTarget } from '../db/database.ts';
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { fetchSnapshot, snapshotAvailable } from '../db/snapshot.ts';
import { migrate } from '../db/migrate.ts';
import { RlError, errorMessage } from '../errors.ts';

export interface RunLocation {
  target: DatabaseTarget;
  /** The run directory of an embedded run (where report.html and tensorboard/ go). */
  runDir?: string;
  /** For messages: the directory or the redacted URL. */
  label: string;
}

export const isDatabaseUrl = (s: string) => /^postgres(ql)?:\/\//i.test(s);

const isDir = (p: string) => existsSync(p) && statSync(p).isDirectory();
/** A PostgreSQL data directory (PGlite's pgdata) has a PG_VERSION file. */
const isPgData = (p: string) => isDir(p) && existsSync(join(p, 'PG_VERSION'));

/**
 * Resolves `<run-or-url>`: a postgres:// URL; a run directory containing db/pgdata/ (or pgdata/); the pgdata
 * directory itself; or a name under `runsDir` (default `runs`). Throws a clear error otherwise.
 */
export function locateRun(spec: string, opts: { cwd?: string; runsDir?: string } = {}): RunLocation {
  if (!spec)
    throw new RlError('no run given: pass a run directory (containing db/pgdata/) or a postgres:// URL', {
      code: 'ERR_NO_RUN',
    });
  if (isDatabaseUrl(spec)) return { target: { kind: 'postgres', url: spec, poolSize: 2 }, label: redactUrl(spec) };
  const cwd = opts.cwd ?? process.cwd();
  const abs = resolve(cwd, spec);
  const candidates = [abs];
  if (!spec.includes('/') && !spec.includes('\\')) candidates.push(resolve(cwd, opts.runsDir ?? 'runs', spec));
  for (const dir of candidates) {
    // a training run's directory keeps its embedded database in <run_dir>/db (pipeline layout)
    if (isPgData(join(dir, 'db', 'pgdata')))
      return { target: { kind: 'pglite', dir: join(dir, 'db') }, runDir: dir, label: dir };
    if (isPgData(join(dir, 'pgdata'))) return { target: { kind: 'pglite', dir }, runDir: dir, label: dir };
    if (basename(dir) === 'pgdata' && isPgData(dir)) {
      const runDir = dirname(dir);
      return { target: { kind: 'pglite', dir: runDir }, runDir, label: runDir };
    }
  }
  if (isDir(abs)) {
    throw new RlError(
      `${abs} is not a run directory: it has no db/pgdata/ (the embedded store a run writes); pass a run directory such as runs/<experiment>, or a postgres:// URL`,
      { code: 'ERR_NO_RUN' },
    );
  }
  throw new RlError(
    `no run directory at ${abs}${candidates.length > 1 ? ` or ${candidates[1]}` : ''}; pass a run directory (containing db/pgdata/) or a postgres:// URL`,
    { code: 'ERR_NO_RUN' },
  );
}

/**
 * Opens the database of a located run (see the module comment for locking and migrations). An
 * embedded run held by a live process (a training run) is read through a snapshot that process
 * serves (lib/db/snapshot.ts); `onSnapshot` is told so. Without one, the error says what to do.
 */
export async function openRun(loc: RunLocation, opts: { onSnapshot?: (note: string) => void } = {}): Promise<Database> {
  return openDatabaseOrSnapshot(loc.target, opts);
}

/** openDatabase, or for a PGlite held by a live process its snapshot (see openRun). */
export async function openDatabaseOrSnapshot(
  target: DatabaseTarget,
  opts: { onSnapshot?: (note: string) => void } = {},
): Promise<Database> {
  try {
    return await openDatabase(target, { migrate: target.kind === 'pglite' });
  } catch (e) {
    if (target.kind !== 'pglite' || (e as RlError)?.code !== 'ERR_LOCKED') throw e;
    // no pid in the lock error: the holder is this very process
    const pid = ((e as RlError).details as { pid?: number } | undefined)?.pid ?? process.pid;
    if (snapshotAvailable(target.dir)) {
      try {
        const db = await openSnapshot(target.dir);
        opts.onSnapshot?.(`${target.dir} is in use by a live process (PID ${pid}): reading a snapshot taken now`);
        return db;
      } catch (s) {
        throw new RlError(
          `${errorMessage(e)}; a snapshot could not be read either (${errorMessage(s)}) — wait for that process to finish, then run this command again`,
          { code: 'ERR_LOCKED', details: (e as RlError).details, cause: e },
        );
      }
    }
    throw new RlError(
      `${errorMessage(e)}; that process serves no snapshots (an older rlstream, or a run directory path too long for a Unix socket) — wait for it to finish, or stop it (Ctrl-C; the same command resumes it), then run this command again`,
      { code: 'ERR_LOCKED', details: (e as RlError).details, cause: e },
    );
  }
}

/**
 * A read-only view of a live embedded database: the holder's snapshot loaded into an in-memory
 * PGlite (pending migrations applied to the copy, so an older run gains the analysis views).
 */
async function openSnapshot(dir: string): Promise<Database> {
  const tar = await fetchSnapshot(dir);
  const { PGlite } = await import('@electric-sql/pglite');
  const { createPgConfig } = await import('@electric-sql/pglite/node-postgres');
  const pglite = await PGlite.create({ loadDataDir: new Blob([new Uint8Array(tar)]) });
  const pool = new pg.Pool(createPgConfig(pglite) as unknown as pg.PoolConfig);
  const db = new Kysely<any>({ dialect: new PostgresDialect({ pool }) });
  const database: Database = {
    kind: 'pglite',
    db,
    pool,
    pglite,
    where: `snapshot of the live embedded database ${dir}`,
    async close() {
      await db.destroy().catch(() => undefined);
      await pglite.close().catch(() => undefined);
    },
  };
  try {
    await migrate(db);
  } catch (e) {
    await database.close();
    throw e;
  }
  return database;
}
