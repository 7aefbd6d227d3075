/**
 * An exclusive lock file for an embedded (PGlite) data directory. PGlite has no lock between
 * processes: a second writer's rows are silently lost (or duplicated). So the first process to
 * open a run directory holds `<dir>/rlstream.lock`, naming its PID, host and a random nonce.
 *
 * Acquisition is atomic: the lock's full content is written and fsynced under a private name, then
 * hard-linked to `rlstream.lock` (link(2) fails with EEXIST when it exists), so the lock never
 * exists empty or half-written and of many simultaneous takers exactly one wins. A lock whose
 * holder is a dead process on this host (kill -9) is stale; taking it over is done by one taker
 * at a time (the one that links `rlstream.lock.break`), which re-reads the lock and replaces it
 * only if it is still the same stale one. A lock held on another host is never judged stale (we
 * cannot see its processes): only `breakLock` (`rlstream train --break-lock`) takes it over.
 *
 * PIDs are only meaningful within one PID namespace and one boot, and a container's process is
 * usually PID 1: so the lock also names the holder's PID namespace and the kernel's boot id, and
 * the holder refreshes its mtime every few seconds. A lock naming this process's own PID that this
 * process does not hold (a restarted container's PID 1 finds its predecessor's), one from an
 * earlier boot, and one from another PID namespace of this machine (another container) whose
 * mtime has not moved for `HEARTBEAT_STALE_MS` are stale.
 */
import {
  openSync,
  writeSync,
  closeSync,
  readFileSync,
  unlinkSync,
  mkdirSync,
  fsyncSync,
  linkSync,
  statSync,
  readlinkSync,
  utimesSync,
} from 'node:fs';
import { join } from 'node:path';
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import { RlError, storageFault } from '../errors.ts';

export interface LockHandle {
  path: string;
  release(): void;
}
export interface LockOptions {
  /** Take over a lock held on another host (the user says no process there uses the directory). */
  breakLock?: boolean;
  /** How long a lock of another PID namespace may go without a heartbeat before it is stale (tests shorten it). */
  heartbeatStaleMs?: number;
}

/** The holder touches its lock this often; a lock of another PID namespace untouched for HEARTBEAT_STALE_MS is stale. */
const HEARTBEAT_MS = 3000;
const HEARTBEAT_STALE_MS = 15_000;
/** Nonces of the locks this process holds now. */
const heldHere = new Set<string>();

function readId(path: string): string | undefined {
  try {
    return (readlinkOr(path) ?? readFileSync(path, 'utf8')).trim() || undefined;
  } catch {
    return undefined;
  }
}
function readlinkOr(path: string): string | null {
  try {
    return readlinkSync(path);
  } catch {
    return null;
  }
}
/** This process's PID namespace (`pid:[4026531836]`) and the kernel's boot id, where /proc shows them. */
const PID_NS = readId('/proc/self/ns/pid');
const BOOT_ID = readId('/proc/sys/kernel/random/boot_id');

interface Holder {
  pid?: number;
  host?: string;
  since?: string;
  nonce?: string;
  pidns?: string;
  boot?: string;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
  // a killed process whose parent has not reaped it yet (a zombie) holds nothing
  try {
    return !/^\d+ \(.*\) Z /.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return true;
  }
}

const pause = (ms: number) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);

function readRaw(path: string): string | null {
  try {
    return readFileSync(path, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw e;
  }
}

function parse(raw: string): Holder | null {
  try {
    const h = JSON.parse(raw) as Holder;
    return h && typeof h === 'object' && typeof h.pid === 'number' ? h : null;
  } catch {
    return null;
  }
}

/** Links `src` to `dst`: true when this call created `dst`, false when it already existed. */
function tryLink(src: string, dst: string): boolean {
  try {
    linkSync(src, dst);
    return true;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw e;
  }
}

/** Age in ms of `path`'s last change, or null when it is gone. */
function ageMs(path: string): number | null {
  try {
    return Date.now() - statSync(path).mtimeMs;
  } catch {
    return null;
  }
}

export function acquireLock(dir: string, what = 'embedded database', opts: LockOptions = {}): LockHandle {
  const path = join(dir, 'rlstream.lock');
  const breakPath = `${path}.break`;
  const me: Holder = {
    pid: process.pid,
    host: hostname(),
    since: new Date().toISOString(),
    nonce: randomBytes(8).toString('hex'),
    pidns: PID_NS,
    boot: BOOT_ID,
  };
  const staleMs = opts.heartbeatStaleMs ?? HEARTBEAT_STALE_MS;
  const mine = JSON.stringify(me);
  const candidate = join(dir, `.rlstream.lock.${process.pid}.${me.nonce}`);
  try {
    mkdirSync(dir, { recursive: true });
    const fd = openSync(candidate, 'wx');
    try {
      writeSync(fd, mine);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  } catch (e) {
    const fault = storageFault(e, dir);
    if (fault)
      throw new RlError(`cannot take the lock of the ${what} at ${dir}: ${fault.message}`, {
        code: 'ERR_LOCK_IO',
        cause: e,
        details: { path: dir },
      });
    throw e;
  }
  try {
    for (let attempt = 0; attempt < 400; attempt++) {
      if (tryLink(candidate, path)) return handle(path, me.nonce!);
      const raw = readRaw(path);
      if (raw === null) continue; // released meanwhile: try again at once
      const holder = parse(raw);
      if (holder === null) {
        // not written by this version's atomic acquisition (an older one wrote it in place): its
        // writer may be between open and write for an instant; an old empty or garbled one is stale
        if ((ageMs(path) ?? 0) < 2000) {
          pause(20);
          continue;
        }
      } else if (
        holder.host !== undefined &&
        holder.host !== hostname() &&
        !(holder.boot !== undefined && holder.boot === BOOT_ID)
      ) {
        if (!opts.breakLock) {
          throw new RlError(
            `${what} at ${dir} is locked by PID ${holder.pid} on host ${holder.host} (since ${holder.since ?? '?'}), which this host cannot check; stop that process, or if none on ${holder.host} uses the directory any more, run again with --break-lock`,
            { code: 'ERR_LOCKED', details: { pid: holder.pid, host: holder.host } },
          );
        }
      } else if (holder.boot !== undefined && BOOT_ID !== undefined && holder.boot !== BOOT_ID) {
        // taken before this machine last booted: its holder is gone
      } else if (holder.pidns !== undefined && PID_NS !== undefined && holder.pidns !== PID_NS) {
        // another PID namespace (a container) of this machine: its PIDs cannot be checked from here,
        // its heartbeat can: wait until the lock's mtime moves (alive) or has not for staleMs (gone)
        if (!opts.breakLock && heartbeatAlive(path, staleMs)) {
          throw new RlError(
            `${what} at ${dir} is in use by PID ${holder.pid} in another PID namespace (a container; host ${holder.host ?? '?'}, since ${holder.since ?? '?'}); stop that process or use another run directory`,
            { retriable: false, code: 'ERR_LOCKED', details: { pid: holder.pid, pidns: holder.pidns } },
          );
        }
      } else if (holder.pid === process.pid) {
        // this PID, but not a lock this process holds: its predecessor with the same PID (a
        // restarted container's PID 1) died without releasing it
        if (heldHere.has(holder.nonce ?? ''))
          throw new RlError(`${what} at ${dir} is already open in this process (PID ${process.pid}); close it first`, {
            code: 'ERR_LOCKED',
          });
      } else if (alive(holder.pid!)) {
        throw new RlError(
          `${what} at ${dir} is in use by another process (PID ${holder.pid}, since ${holder.since ?? '?'}); stop that process or use another run directory`,
          { retriable: false, code: 'ERR_LOCKED', details: { pid: holder.pid } },
        );
      }
      // stale: replace it, one taker at a time, and only if it is still the lock judged stale
      if (!tryLink(candidate, breakPath)) {
        const breaker = parse(readRaw(breakPath) ?? '');
        // a taker that died while breaking (a double fault) leaves the break file: clear it
        if (breaker?.pid && breaker.host === hostname() && !alive(breaker.pid) && (ageMs(breakPath) ?? 0) > 1000) {
          if (readRaw(breakPath) === JSON.stringify(breaker)) {
            try {
              unlinkSync(breakPath);
            } catch {
              /* another did */
            }
          }
        }
        pause(5 + Math.random() * 10);
        continue;
      }
      try {
        if (readRaw(path) === raw) {
          try {
            unlinkSync(path);
          } catch {
            /* gone already */
          }
          if (tryLink(candidate, path)) return handle(path, me.nonce!);
        }
      } finally {
        try {
          unlinkSync(breakPath);
        } catch {
          /* gone */
        }
      }
    }
    throw new RlError(
      `could not take the lock ${path}: other processes kept taking and releasing it; stop them and try again`,
      { retriable: true, code: 'ERR_LOCKED' },
    );
  } finally {
    try {
      unlinkSync(candidate);
    } catch {
      /* gone */
    }
  }
}

/**
 * Whether the lock at `path` is kept alive by its holder's heartbeat: true as soon as its mtime
 * moves, false once it has not moved for `staleMs` (waits up to that long).
 */
function heartbeatAlive(path: string, staleMs: number): boolean {
  const first = mtimeMs(path);
  if (first === null) return false;
  for (;;) {
    const now = mtimeMs(path);
    if (now === null) return false;
    if (now !== first) return true;
    if (Date.now() - now > staleMs) return false;
    pause(Math.min(250, staleMs / 4));
  }
}
function mtimeMs(path: string): number | null {
  try {
    return statSync(path).mtimeMs;
  } catch {
    return null;
  }
}

function handle(path: string, nonce: string): LockHandle {
  let released = false;
  heldHere.add(nonce);
  const beat = setInterval(() => {
    try {
      const t = new Date();
      utimesSync(path, t, t);
    } catch {
      /* released or the disk failed: the next write says so */
    }
  }, HEARTBEAT_MS);
  beat.unref();
  const release = () => {
    if (released) return;
    released = true;
    clearInterval(beat);
    heldHere.delete(nonce);
    process.off('exit', release);
    const held = parse(readRaw(path) ?? '');
    if (held?.nonce === nonce) {
      try {
        unlinkSync(path);
      } catch {
        /* already gone */
      }
    }
  };
  process.once('exit', release);
  return { path, release };
}

/**
 * Who holds `<dir>/rlstream.lock`, read without taking it: null when no lock file (or an unreadable
 * one) is there; `live` is whether its holder still runs — null when it is on another host.
 */
export function lockHolder(dir: string): { pid: number; host?: string; since?: string; live: boolean | null } | null {
  const holder = parse(readRaw(join(dir, 'rlstream.lock')) ?? '');
  if (!holder) return null;
  const live = holder.host !== undefined && holder.host !== hostname() ? null : alive(holder.pid!);
  return { pid: holder.pid!, host: holder.host, since: holder.since, live };
}
