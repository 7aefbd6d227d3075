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

export interface LoopDisk {
  dir: string;
  /** The file system goes read-only at once, as ext4 does after an I/O error (errors=remount-ro): what is not on the disk yet is lost. */
  abort(): void;
  /** Unmounts (dropping every cached page) and mounts the image again: what a reboot after a crash sees (the journal replayed). */
  remount(): void;
  unmount(): void;
}

/**
 * An ext4 file system of `sizeMb` in an image file `image`, loop-mounted over `dir`: a disk that
 * can crash (`abort`, i.e. `mount -o remount,abort`) and be mounted again after the "reboot".
 */
export function loopDisk(dir: string, image: string, sizeMb: number): LoopDisk {
  mkdirSync(dir, { recursive: true });
  execFileSync('truncate', ['-s', `${sizeMb}M`, image]);
  execFileSync('mkfs.ext4', ['-q', '-F', image]);
  const mount = () => execFileSync('mount', ['-o', 'loop', image, dir]);
  mount();
  let mounted = true;
  const unmount = () => {
    if (!mounted) return;
    mounted = false;
    try {
      execFileSync('umount', [dir]);
    } catch {
      execFileSync('umount', ['-l', dir]);
    }
  };
  return {
    dir,
    abort() {
      execFileSync('mount', ['-o', 'remount,abort', dir]);
    },
    remount() {
      unmount();
      mount();
      mounted = true;
    },
    unmount,
  };
}

/** Why loop-mounted ext4 cannot be used here, or null when it can. */
export function loopUnavailable(): string | null {
  const why = mountUnavailable();
  if (why) return why;
  try {
    execFileSync('sh', ['-c', 'command -v mkfs.ext4 && command -v losetup && losetup -f'], { stdio: 'ignore' });
  } catch {
    return 'needs mkfs.ext4 and a free loop device';
  }
  return null;
}
