/**
 * `COPY … FROM STDIN` over a node-postgres client without an extra dependency. node-postgres
 * accepts any "submittable" object in `client.query()` and forwards the protocol events to it;
 * this one sends the statement, answers the server's CopyInResponse with CopyData messages taken
 * from an iterator of chunks (so encoding the next chunk overlaps the server parsing this one),
 * respects socket back-pressure, ends with CopyDone, and settles on ReadyForQuery or on the first
 * error. An exception from the iterator is sent as CopyFail, which aborts the COPY.
 */
import type pg from 'pg';
import type { Duplex } from 'node:stream';
import { once } from 'node:events';
import { errorMessage } from '../errors.ts';

/** The part of node-postgres' wire connection a submittable uses. */
interface WireConnection {
  stream: Duplex;
  query(text: string): void;
  sendCopyFromChunk(chunk: Buffer): void;
  endCopyFrom(): void;
  sendCopyFail(msg: string): void;
}

const MESSAGE_BYTES = 1 << 20;

/** Resolves when the socket can take more data, rejects when it closes or fails first. */
async function drained(stream: Duplex): Promise<void> {
  const ac = new AbortController();
  try {
    await Promise.race([
      once(stream, 'drain', { signal: ac.signal }),
      once(stream, 'close', { signal: ac.signal }).then(() => {
        throw new Error('connection closed during COPY');
      }),
    ]);
  } finally {
    ac.abort();
  }
}

/** Runs one `COPY … FROM STDIN` statement fed with `chunks`; resolves to the row count. */
export function copyFromStdin(client: pg.ClientBase, statement: string, chunks: Iterable<Buffer>): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    let settled = false;
    let rows = 0;
    let started = false;
    const settle = (err?: unknown) => {
      if (settled) return;
      settled = true;
      if (err) reject(err);
      else resolve(rows);
    };
    const pump = async (connection: WireConnection) => {
      try {
        for (const chunk of chunks) {
          for (let off = 0; off < chunk.length && !settled; off += MESSAGE_BYTES) {
            connection.sendCopyFromChunk(chunk.subarray(off, off + MESSAGE_BYTES));
            if (connection.stream.writableNeedDrain) await drained(connection.stream);
          }
          if (settled) return; // the server already refused the COPY; it drops the rest
          // Let the socket flush so the server parses this chunk while the next one is encoded.
          await new Promise<void>((r) => setImmediate(r));
        }
        connection.endCopyFrom();
      } catch (e) {
        connection.sendCopyFail(`client could not produce the COPY data: ${errorMessage(e)}`);
      }
    };
    const submittable = {
      submit(connection: WireConnection) {
        connection.query(statement);
      },
      handleCopyInResponse(connection: WireConnection) {
        if (started) {
          connection.sendCopyFail('unexpected second CopyInResponse');
          return;
        }
        started = true;
        void pump(connection);
      },
      handleCommandComplete(msg: { text?: string }) {
        const m = /^COPY (\d+)/.exec(msg.text ?? '');
        if (m) rows = Number(m[1]);
      },
      handleReadyForQuery() {
        settle(started ? undefined : new Error(`statement did not start a COPY FROM STDIN: ${statement.slice(0, 80)}`));
      },
      handleError(err: unknown) {
        settle(err);
      },
      handleRowDescription() {
        /* COPY returns no rows */
      },
      handleDataRow() {
        /* COPY returns no rows */
      },
      handleEmptyQuery() {
        /* never sent */
      },
      handlePortalSuspended() {
        /* simple protocol: never */
      },
      handleCopyData() {
        /* COPY TO only */
      },
    };
    client.query(submittable as unknown as pg.Submittable);
  });
}
