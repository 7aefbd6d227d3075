/**
 * Fault-injection helpers that need root: a size-limited tmpfs mounted over a directory (a full
 * disk), made larger again (space freed), and unmounted even when a test fails. Tests that use
 * them skip themselves (with the reason) where mounting is not permitted.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';

/** Why mounts cannot be used here, or null when they can. */
export function mountUnavailable(): string | null {
  if (process.platform !== 'linux') return 'needs Linux';
  if (process.getuid?.() !== 0) return 'needs root (mount -t tmpfs)';
  return null;
}

export interface TinyDisk {
  dir: string;
  grow(size: string): void;
  unmount(): void;
}

/** Mounts a tmpfs of `size` (e.g. `600k`) over `dir` (created if missing). */
export function tinyDisk(dir: string, size: string): TinyDisk {
  mkdirSync(dir, { recursive: true });
  execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${size}`, 'tmpfs', dir]);
  let mounted = true;
  return {
    dir,
    grow(s: string) {
      execFileSync('mount', ['-o', `remount,size=${s}`, dir]);
    },
    unmount() {
      if (!mounted) return;
      mounted = false;
      try {
        execFileSync('umount', [dir]);
      } catch {
        execFileSync('umount', ['-l', dir]);
      }
    },
  };
}
