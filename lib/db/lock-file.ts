/**
 * An exclusive lock file for an embedded (PGlite) data directory. PGlite has no lock between
 * processes: a second writer's rows are silently lost. So the first process to open a run
 * directory writes its PID to `<dir>/rlstream.lock` with O_EXCL; a second process gets a clear
 * error naming the holder. A lock left by a dead process (kill -9) is taken over.
 */
import { openSync, writeSync, closeSync, readFileSync, unlinkSync, mkdirSync, fsyncSync } from 'node:fs';
import { join } from 'node:path';
import { hostname } from 'node:os';
import { RlError } from '../errors.ts';

export interface LockHandle { path: string; release(): void }

function alive(pid: number): boolean {
  try { process.kill(pid, 0); } catch (e) { return (e as NodeJS.ErrnoException).code === 'EPERM'; }
  // a killed process whose parent has not reaped it yet (a zombie) holds nothing
  try { return !/^\d+ \(.*\) Z /.test(readFileSync(`/proc/${pid}/stat`, 'utf8')); } catch { return true; }
}

export function acquireLock(dir: string, what = 'embedded database'): LockHandle {
  mkdirSync(dir, { recursive: true });
  const path = join(dir, 'rlstream.lock');
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      const fd = openSync(path, 'wx');
      writeSync(fd, JSON.stringify({ pid: process.pid, host: hostname(), since: new Date().toISOString() }));
      fsyncSync(fd);
      closeSync(fd);
      let released = false;
      const release = () => {
        if (released) return;
        released = true;
        process.off('exit', release);
        try {
          const held = JSON.parse(readFileSync(path, 'utf8')) as { pid: number };
          if (held.pid === process.pid) unlinkSync(path);
        } catch { /* already gone */ }
      };
      process.once('exit', release);
      return { path, release };
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      let holder: { pid?: number; host?: string; since?: string } = {};
      try { holder = JSON.parse(readFileSync(path, 'utf8')); } catch { /* half-written: treat as stale below */ }
      const sameHost = !holder.host || holder.host === hostname();
      if (holder.pid && holder.pid !== process.pid && sameHost && alive(holder.pid)) {
        throw new RlError(`${what} at ${dir} is in use by another process (PID ${holder.pid}, since ${holder.since ?? '?'}); stop that process or use another run directory`, { retriable: false, code: 'ERR_LOCKED', details: { pid: holder.pid } });
      }
      if (holder.pid === process.pid) {
        throw new RlError(`${what} at ${dir} is already open in this process (PID ${process.pid}); close it first`, { code: 'ERR_LOCKED' });
      }
      try { unlinkSync(path); } catch { /* raced with another taker */ }
    }
  }
  throw new RlError(`could not take the lock ${path}`, { retriable: true, code: 'ERR_LOCKED' });
}
