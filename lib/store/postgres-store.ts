/**
 * The store on a real PostgreSQL (distributed mode, or one database shared by several runs).
 *
 * Trajectory ingest is the shared ingest (lib/store/trajectory-ingest.ts) with binary
 * `COPY … FROM STDIN` (lib/store/pg-copy.ts):
 *  - without a caller transaction: on a pooled client of our own, in one transaction;
 *  - inside a caller's transaction (`opts.tx`): on the client that transaction runs on. Kysely does
 *    not expose it, so the store remembers pooled clients by backend PID (the pool's public
 *    'acquire' event) and asks the transaction for `pg_backend_pid()`. The caller is awaiting us,
 *    so the client is idle inside its transaction and the COPY commits or rolls back with it.
 *    If the client is unknown (acquired before this store existed) the rows go as
 *    `insert … select … from unnest($1::text[], …) on conflict do nothing` on the transaction:
 *    same result, lower throughput (floats travel as text).
 */
import { CompiledQuery, sql } from 'kysely';
import type pg from 'pg';
import type { Database } from '../db/database.ts';
import { RlError } from '../errors.ts';
import { KyselyStore } from './kysely-store.ts';
import { copyFromStdin } from './pg-copy.ts';
import type { TrajectoryRow, Tx } from './port.ts';
import { UNNEST_ROWS_PER_STATEMENT, copySql, unnestInsert } from './trajectory-codec.ts';
import { ingestByCopy } from './trajectory-ingest.ts';

/** The shared COPY ingest on one client, which must already be inside a transaction. */
export function ingestOnClient(client: pg.ClientBase, rows: readonly TrajectoryRow[]): Promise<number> {
  return ingestByCopy(
    {
      async query(text, values) {
        const r = await client.query(text, values as unknown[] | undefined);
        return { rows: r.rows, rowCount: r.rowCount ?? 0 };
      },
    },
    (target, encode) => copyFromStdin(client, copySql(target, 'stdin'), encode('stream')),
    rows,
  );
}

/** COPY-based ingest on a client of our own, in its own transaction. Returns the rows inserted. */
export async function copyTrajectories(pool: pg.Pool, rows: readonly TrajectoryRow[]): Promise<number> {
  const client = await pool.connect();
  let broken: Error | undefined;
  try {
    await client.query('begin');
    try {
      const n = await ingestOnClient(client, rows);
      await client.query('commit');
      return n;
    } catch (e) {
      await client.query('rollback').catch((re: Error) => {
        broken = re;
      });
      throw e;
    }
  } finally {
    client.release(broken);
  }
}

/** Array-parameter ingest on an open transaction. Returns the rows inserted. */
export async function unnestTrajectories(tx: Tx, rows: readonly TrajectoryRow[]): Promise<number> {
  let inserted = 0;
  for (let i = 0; i < rows.length; i += UNNEST_ROWS_PER_STATEMENT) {
    const q = unnestInsert(rows.slice(i, i + UNNEST_ROWS_PER_STATEMENT));
    const res = await tx.executeQuery(CompiledQuery.raw(q.text, q.values));
    inserted += Number(res.numAffectedRows ?? 0n);
  }
  return inserted;
}

const pidOf = (client: pg.ClientBase): unknown => (client as unknown as { processID?: unknown }).processID;

export class PostgresStore extends KyselyStore {
  readonly kind = 'postgres' as const;
  private readonly clientsByPid = new Map<number, pg.PoolClient>();
  private readonly onAcquire = (client: pg.PoolClient) => {
    const pid = pidOf(client);
    if (typeof pid === 'number') this.clientsByPid.set(pid, client);
  };
  private readonly onRemove = (client: pg.PoolClient) => {
    const pid = pidOf(client);
    if (typeof pid === 'number' && this.clientsByPid.get(pid) === client) this.clientsByPid.delete(pid);
  };

  constructor(database: Database, opts: { ownsDatabase?: boolean } = {}) {
    if (database.kind !== 'postgres') {
      throw new RlError(`PostgresStore needs a PostgreSQL database, got ${database.kind} at ${database.where}`, {
        code: 'ERR_CONFIG',
      });
    }
    super(database, opts.ownsDatabase ?? false);
    database.pool.on('acquire', this.onAcquire);
    database.pool.on('remove', this.onRemove);
  }

  /** The pooled client a transaction runs on, when this store saw it being acquired. */
  async clientOf(tx: Tx): Promise<pg.PoolClient | undefined> {
    const { rows } = await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(tx);
    return this.clientsByPid.get(rows[0]!.pid);
  }

  protected override async ingestTrajectories(rows: readonly TrajectoryRow[], tx: Tx | undefined): Promise<number> {
    if (!tx) return copyTrajectories(this.database.pool, rows);
    const client = await this.clientOf(tx);
    return client ? ingestOnClient(client, rows) : unnestTrajectories(tx, rows);
  }

  override async close(): Promise<void> {
    this.database.pool.off('acquire', this.onAcquire);
    this.database.pool.off('remove', this.onRemove);
    this.clientsByPid.clear();
    await super.close();
  }
}
