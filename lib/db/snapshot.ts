/**
 * Reading an embedded (PGlite) run while its process holds it. PGlite has one writer and no
 * server, and the run directory's lock keeps every other process out; so the process that holds
 * the database answers, on a Unix socket next to it (`<dir>/snapshot.sock`), with a consistent
 * snapshot of its data directory (PGlite's dumpDataDir runs between statements; a transaction in
 * flight is rolled back by the recovery of the copy, as after a crash). `rlstream sql`, `runs`
 * and `report` load that snapshot into an in-memory PGlite and read it: the numbers of the moment
 * they asked, never a torn page, and nothing they do reaches the run.
 */
import { createConnection, createServer, type Server } from 'node:net';
import { existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { PGlite } from '@electric-sql/pglite';
import { RlError, errorMessage } from '../errors.ts';

/** The socket a database's holder listens on. */
export function snapshotSocket(dir: string): string {
  return join(dir, 'snapshot.sock');
}

/** Unix socket paths are limited to about 107 bytes (sockaddr_un). */
const MAX_SOCKET_PATH = 100;

export interface SnapshotServer {
  close(): Promise<void>;
}

/**
 * Serves snapshots of `pglite` on `<dir>/snapshot.sock` until closed. The caller holds the
 * directory's lock, so a socket file already there is a dead holder's and is replaced. Returns
 * null when the path is too long for a Unix socket (readers then say to wait for the run).
 */
export async function serveSnapshots(pglite: PGlite, dir: string): Promise<SnapshotServer | null> {
  const path = snapshotSocket(dir);
  if (Buffer.byteLength(path) > MAX_SOCKET_PATH || process.platform === 'win32') return null;
  rmSync(path, { force: true });
  const server: Server = createServer((sock) => {
    sock.on('error', () => undefined);
    sock.once('data', () => {
      void (async () => {
        try {
          const blob = await pglite.dumpDataDir('none');
          sock.end(Buffer.from(await blob.arrayBuffer()));
        } catch (e) {
          sock.destroy(e as Error);
        }
      })();
    });
  });
  const ok = await new Promise<boolean>((resolve) => {
    server.once('error', () => resolve(false));
    server.listen(path, () => resolve(true));
  });
  if (!ok) return null;
  server.unref(); // never keeps the process alive
  return {
    close: () =>
      new Promise<void>((resolve) =>
        server.close(() => {
          rmSync(path, { force: true });
          resolve();
        }),
      ),
  };
}

/** Asks the holder of `dir` for a snapshot of its data directory (a tar). */
export function fetchSnapshot(dir: string, timeoutMs = 120_000): Promise<Buffer> {
  const path = snapshotSocket(dir);
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const sock = createConnection(path);
    const timer = setTimeout(() => sock.destroy(new Error(`no snapshot after ${timeoutMs / 1000} s`)), timeoutMs);
    sock.on('connect', () => sock.write('snapshot\n'));
    sock.on('data', (d: Buffer) => chunks.push(d));
    sock.on('end', () => {
      clearTimeout(timer);
      const buf = Buffer.concat(chunks);
      if (buf.length === 0)
        reject(new RlError(`the process holding ${dir} sent an empty snapshot`, { code: 'ERR_SNAPSHOT' }));
      else resolve(buf);
    });
    sock.on('error', (e) => {
      clearTimeout(timer);
      reject(
        new RlError(`cannot get a snapshot from the process holding ${dir}: ${errorMessage(e)}`, {
          code: 'ERR_SNAPSHOT',
          cause: e,
        }),
      );
    });
  });
}

/** Whether the holder of `dir` may serve snapshots (its socket exists). */
export function snapshotAvailable(dir: string): boolean {
  return existsSync(snapshotSocket(dir));
}
