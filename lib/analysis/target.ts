/**
 * Where a run's data lives, from what a user types: a run directory (embedded store in
 * `<run_dir>/db/pgdata`), a bare run name found under `runs/`, or a `postgres://` URL.
 *
 * An embedded run directory is opened with openDatabase({kind:'pglite'}), which takes the run
 * directory's lock file: a directory held by a live training process fails with the lock's message
 * naming its PID. Opening an embedded run applies pending migrations (so an older run gains the
 * analysis views); a PostgreSQL is opened without migrating — it is shared, and the stages that
 * write to it apply the migrations.
 */
import { existsSync, statSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { openDatabase, redactUrl, type Database, type DatabaseTarget } from '../db/database.ts';
import { RlError } from '../errors.ts';

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
  if (!spec) throw new RlError('no run given: pass a run directory (containing db/pgdata/) or a postgres:// URL', { code: 'ERR_NO_RUN' });
  if (isDatabaseUrl(spec)) return { target: { kind: 'postgres', url: spec, poolSize: 2 }, label: redactUrl(spec) };
  const cwd = opts.cwd ?? process.cwd();
  const abs = resolve(cwd, spec);
  const candidates = [abs];
  if (!spec.includes('/') && !spec.includes('\\')) candidates.push(resolve(cwd, opts.runsDir ?? 'runs', spec));
  for (const dir of candidates) {
    // a training run's directory keeps its embedded database in <run_dir>/db (pipeline layout)
    if (isPgData(join(dir, 'db', 'pgdata'))) return { target: { kind: 'pglite', dir: join(dir, 'db') }, runDir: dir, label: dir };
    if (isPgData(join(dir, 'pgdata'))) return { target: { kind: 'pglite', dir }, runDir: dir, label: dir };
    if (basename(dir) === 'pgdata' && isPgData(dir)) {
      const runDir = dirname(dir);
      return { target: { kind: 'pglite', dir: runDir }, runDir, label: runDir };
    }
  }
  if (isDir(abs)) {
    throw new RlError(`${abs} is not a run directory: it has no db/pgdata/ (the embedded store a run writes); pass a run directory such as runs/<experiment>, or a postgres:// URL`, { code: 'ERR_NO_RUN' });
  }
  throw new RlError(`no run directory at ${abs}${candidates.length > 1 ? ` or ${candidates[1]}` : ''}; pass a run directory (containing db/pgdata/) or a postgres:// URL`, { code: 'ERR_NO_RUN' });
}

/** Opens the database of a located run (see the module comment for locking and migrations). */
export async function openRun(loc: RunLocation): Promise<Database> {
  return openDatabase(loc.target, { migrate: loc.target.kind === 'pglite' });
}
