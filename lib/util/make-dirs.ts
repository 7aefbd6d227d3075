/**
 * `mkdir -p` that says why it cannot. Node's recursive mkdirSync spins forever, synchronously (no
 * signal handler runs, Ctrl-C included), on a path under /proc, and reports ENOENT for a parent on
 * a read-only mount (the cause is EROFS). Here each missing level is created on its own, so the
 * error is the real one: a full, read-only or failing disk is a StorageError; anything else (a
 * pseudo file system such as /proc, no permission, a file in the way) one ConfigError naming the
 * directory, the failing level and the reason.
 */
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { ConfigError, storageFault } from '../errors.ts';

const REASON: Record<string, string> = {
  ENOENT: 'that file system does not allow creating directories there (e.g. /proc or /sys)',
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  ENOTDIR: 'a file is in the way',
  ENAMETOOLONG: 'the name is too long',
};

/** Creates `dir` and its missing parents; `what` names it in errors (e.g. "the run directory (trainer.run_dir)"). */
export function makeDirs(dir: string, what: string): string {
  const abs = resolve(dir);
  const missing: string[] = [];
  let cur = abs;
  while (!existsSync(cur)) {
    missing.unshift(cur);
    const up = dirname(cur);
    if (up === cur) break;
    cur = up;
  }
  if (existsSync(cur) && !statSync(cur).isDirectory())
    throw new ConfigError(`cannot create ${what} ${abs}: ${cur} is a file, not a directory; choose another path`);
  for (const d of missing) {
    try {
      mkdirSync(d);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code ?? '';
      if (code === 'EEXIST' && statSync(d).isDirectory()) continue;
      const storage = storageFault(e, d);
      if (storage) throw storage;
      throw new ConfigError(
        `cannot create ${what} ${abs}: ${REASON[code] ?? (e as Error).message} (${code || 'error'} creating ${d}); choose a directory on a writable file system`,
      );
    }
  }
  return abs;
}
