/**
 * A new embedded database starts from a copy of an empty PGlite cluster rather than running
 * initdb: unpacking the copy takes about 0.5 s on 2 cores, initdb about 1.5–2.5 s. The copy is a
 * tar (PGlite's dumpDataDir format) of a cluster that initdb has just made, checkpointed, cached
 * per PGlite version and start parameters under `$RLSTREAM_CACHE_DIR` (default
 * `$XDG_CACHE_HOME/rlstream`, else `~/.cache/rlstream`). The first new database on a machine runs
 * initdb and writes the copy (a temporary file renamed into place, so a reader never sees part of
 * one). A cache that cannot be read or written is skipped: that database runs initdb.
 */
import { createHash } from 'node:crypto';
import { accessSync, constants, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';
import type { PGlite } from '@electric-sql/pglite';

/** The directory of rlstream's machine-wide caches. */
export function cacheDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.RLSTREAM_CACHE_DIR) return env.RLSTREAM_CACHE_DIR;
  return join(env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'rlstream');
}

let pgliteVersion: string | undefined;
/** The installed PGlite's version ('unknown' if its package.json cannot be read). */
function installedPgliteVersion(): string {
  if (pgliteVersion === undefined) {
    // the package's exports leave out package.json: it sits above the entry point's dist/
    const entry = createRequire(import.meta.url).resolve('@electric-sql/pglite');
    try {
      pgliteVersion = String(JSON.parse(readFileSync(join(dirname(entry), '..', 'package.json'), 'utf8')).version);
    } catch {
      pgliteVersion = 'unknown';
    }
  }
  return pgliteVersion;
}

/** The cache file of the empty cluster for these start parameters. */
export function templatePath(startParams: readonly string[], dir = cacheDir()): string {
  const key = createHash('sha256').update(JSON.stringify(startParams)).digest('hex').slice(0, 16);
  return join(dir, `pglite-${installedPgliteVersion()}-empty-${key}.tar`);
}

/** The cached empty cluster, or null when there is none (or it cannot be read). */
export function readTemplate(path: string): Blob | null {
  try {
    return new Blob([readFileSync(path)]);
  } catch {
    return null;
  }
}

/** Forgets a cached copy that did not open. */
export function dropTemplate(path: string): void {
  rmSync(path, { force: true });
}

/**
 * Writes the copy of `pglite`, a cluster initdb has just made with nothing else in it. Errors
 * are swallowed: the cache only saves time.
 */
export async function writeTemplate(pglite: PGlite, path: string): Promise<void> {
  try {
    mkdirSync(dirname(path), { recursive: true });
    accessSync(dirname(path), constants.W_OK); // before the dump: nothing to do where it cannot be kept
    await pglite.exec('checkpoint');
    const tar = new Uint8Array(await (await pglite.dumpDataDir('none')).arrayBuffer());
    const tmp = `${path}.${process.pid}.tmp`;
    try {
      writeFileSync(tmp, tar);
      renameSync(tmp, path);
    } finally {
      rmSync(tmp, { force: true });
    }
  } catch {
    /* a read-only or full cache directory: the next new database runs initdb again */
  }
}
