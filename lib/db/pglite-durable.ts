/**
 * PGlite on a node file system, durable like PostgreSQL: PGlite starts PostgreSQL with `-F`
 * (fsync off), and its node file system (Emscripten's NODEFS) has no fsync, so nothing it writes
 * is ever flushed to the disk — a power loss, a kernel crash or a file system that goes read-only
 * after an I/O error leaves a data directory of empty files. Here PostgreSQL runs with fsync on
 * and `wal_sync_method = fsync` (Emscripten's fdatasync does nothing), and NODEFS's fsync calls
 * fsync(2): every commit flushes the WAL before it returns, checkpoints flush the data files, as
 * in PostgreSQL. A data directory PGlite has just created (initdb, or the cached empty cluster of
 * lib/db/pglite-template.ts) is flushed once, whole.
 * Cost: one fsync per committed transaction (docs/durability.md, bench/embedded-fsync.ts).
 */
import { closeSync, fsyncSync, openSync, readdirSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import type { PGlite } from '@electric-sql/pglite';
import { errorMessage, storageFault } from '../errors.ts';
import { dropTemplate, readTemplate, templatePath, writeTemplate } from './pglite-template.ts';

/** PGlite's own start parameters without `-F`, WAL flushed with fsync(2). */
export function durableStartParams(defaults: readonly string[]): string[] {
  return [...defaults.filter((p) => p !== '-F'), '-c', 'fsync=on', '-c', 'wal_sync_method=fsync'];
}

/** fsync(2) every file and directory under `dir` (a fresh data directory, once). */
export function fsyncTree(dir: string): void {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) fsyncTree(p);
    else if (e.isFile()) fsyncPath(p);
  }
  fsyncPath(dir);
}

function fsyncPath(p: string): void {
  const fd = openSync(p, 'r');
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/**
 * A failed fsync of the embedded database (EROFS after an I/O error, EIO, ENOSPC): the process
 * stops at once with one line naming the directory and the cause, exit status 1. The run
 * resumes from its last commit once the disk is fixed (as PostgreSQL after its PANIC).
 */
function onFsyncFailure(e: unknown, dataDir: string): never {
  const fault = storageFault(e, dataDir);
  const msg = fault
    ? fault.message
    : `cannot flush the embedded database ${dataDir} to disk (${errorMessage(e)}); fix that file system, then run the same command again: the run continues from its last commit`;
  writeSync(2, `rlstream: ${msg}\n`);
  process.exit(1);
}

/**
 * The embedded PostgreSQL stopped under a running process: when its directory cannot be written
 * (checked by writing a probe file), the StorageError line; otherwise what it said.
 */
function onDatabaseDied(what: unknown, dataDir: string): never {
  const probe = join(dataDir, `.rlstream-probe-${process.pid}`);
  try {
    writeFileSync(probe, 'x');
    fsyncPath(probe);
    rmSync(probe, { force: true });
  } catch (e) {
    onFsyncFailure(e, dataDir);
  }
  writeSync(
    2,
    `rlstream: the embedded database ${dataDir} stopped (${errorMessage(what)}); run the same command again: the run continues from its last commit\n`,
  );
  process.exit(1);
}

/** Whether `dataDir` holds nothing yet (a new database). */
function isFresh(dataDir: string): boolean {
  try {
    return readdirSync(dataDir).length === 0;
  } catch {
    return true;
  }
}

/**
 * A new cluster in `dataDir`: unpacked from the cached empty cluster when there is one
 * (lib/db/pglite-template.ts), else made by initdb and then cached. A cached copy that does not
 * open is dropped and the directory made again by initdb.
 */
async function createFresh(
  dataDir: string,
  startParams: readonly string[],
  open: (template?: Blob) => Promise<PGlite>,
): Promise<PGlite> {
  const path = templatePath(startParams);
  const template = readTemplate(path);
  if (template) {
    try {
      return await open(template);
    } catch {
      dropTemplate(path);
      rmSync(dataDir, { recursive: true, force: true });
    }
  }
  const pg = await open();
  await writeTemplate(pg, path);
  return pg;
}

/** Opens PGlite on `dataDir` with fsync on (durable: true) or as PGlite does by default. */
export async function createPglite(dataDir: string, durable: boolean): Promise<PGlite> {
  const { PGlite } = await import('@electric-sql/pglite');
  const fresh = isFresh(dataDir);
  if (!durable) {
    if (!fresh) return PGlite.create(dataDir);
    const startParams = PGlite.defaultStartParams;
    return createFresh(dataDir, startParams, (loadDataDir) => PGlite.create({ dataDir, startParams, loadDataDir }));
  }
  const { NodeFS } = await import('@electric-sql/pglite/nodefs');
  let closing = false;
  // until the database has opened, a failure is PGlite.create's to report (a damaged directory
  // is named so by the open path); afterwards the process stops with one line
  let opened = false;
  class DurableNodeFS extends NodeFS {
    override async init(pg: PGlite, opts: Parameters<InstanceType<typeof NodeFS>['init']>[1]) {
      const r = await super.init(pg, opts);
      const preRun = r.emscriptenOpts.preRun ?? [];
      r.emscriptenOpts.preRun = [
        ...(Array.isArray(preRun) ? preRun : [preRun]),
        (mod: { NODEFS: { stream_ops: Record<string, unknown> } }) => {
          mod.NODEFS.stream_ops.fsync = (stream: { nfd?: number }) => {
            if (stream.nfd === undefined) return 0;
            try {
              fsyncSync(stream.nfd);
            } catch (e) {
              // PostgreSQL's answer to a failed fsync is a PANIC: what was written may be lost, so
              // nothing may be acknowledged after it. Here: one line saying why, and exit.
              onFsyncFailure(e, dataDir);
            }
            return 0;
          };
        },
      ] as typeof preRun;
      // PostgreSQL PANICs when it cannot write its WAL (a read-only or failing disk): the WASM
      // module aborts or exits and PGlite's pending query never settles — say why and stop
      const mod = r.emscriptenOpts as Record<string, unknown>;
      const prevAbort = mod.onAbort as ((w: unknown) => void) | undefined;
      mod.onAbort = (what: unknown) => {
        prevAbort?.(what);
        if (opened) onDatabaseDied(what, dataDir);
      };
      const prevExit = mod.onExit as ((code: number) => void) | undefined;
      mod.onExit = (code: number) => {
        prevExit?.(code);
        if (opened && !closing) onDatabaseDied(`exit status ${code}`, dataDir);
      };
      return r;
    }
  }
  const startParams = durableStartParams(PGlite.defaultStartParams);
  const pg = fresh
    ? await createFresh(dataDir, startParams, (loadDataDir) =>
        PGlite.create({ fs: new DurableNodeFS(dataDir), startParams, loadDataDir }),
      )
    : await PGlite.create({ fs: new DurableNodeFS(dataDir), startParams });
  opened = true;
  if (fresh) fsyncTree(dataDir);
  const close = pg.close.bind(pg);
  pg.close = async () => {
    closing = true;
    await close();
  };
  return pg;
}
