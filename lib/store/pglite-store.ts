/**
 * The store on PGlite (PostgreSQL in WASM) in a run directory: the embedded default.
 *
 * Trajectory ingest (lib/store/trajectory-ingest.ts) COPYs binary data from PGlite's `/dev/blob`
 * device: `pglite.exec("copy … from '/dev/blob' with (format binary)", { blob })`. The node-postgres
 * bridge cannot carry it (`pg-copy-streams` crashes PGlite).
 *
 * Transactions: PGlite is one backend session and the bridge's pool has one connection. A Kysely
 * transaction holds that connection, and a statement sent straight to `pglite` runs in the same
 * session — inside that transaction. So the ingest always runs while a Kysely transaction (the
 * caller's `tx`, or one of our own) holds the connection: the COPY commits or rolls back with it,
 * and no other user of the pool can interleave. (Code that called `pglite` directly without
 * holding the pool connection would join whatever transaction is open; only this adapter does
 * so, and only while it holds the connection.)
 */
import { CompiledQuery } from 'kysely';
import type { PGlite } from '@electric-sql/pglite';
import type { Database } from '../db/database.ts';
import { RlError } from '../errors.ts';
import { KyselyStore } from './kysely-store.ts';
import type { TrajectoryRow, Tx } from './port.ts';
import { copySql } from './trajectory-codec.ts';
import { ingestByCopy, type CopyRunner, type SqlRunner } from './trajectory-ingest.ts';

/** Statements on a Kysely transaction, for the shared ingest. */
export function txRunner(tx: Tx): SqlRunner {
  return {
    async query(text, values = []) {
      const res = await tx.executeQuery(CompiledQuery.raw(text, [...values]));
      return { rows: res.rows as Record<string, any>[], rowCount: Number(res.numAffectedRows ?? 0n) };
    },
  };
}

export class PgliteStore extends KyselyStore {
  readonly kind = 'pglite' as const;
  private readonly pglite: PGlite;

  constructor(database: Database, opts: { ownsDatabase?: boolean } = {}) {
    if (database.kind !== 'pglite' || !database.pglite) {
      throw new RlError(`PgliteStore needs an embedded (PGlite) database, got ${database.kind} at ${database.where}`, {
        code: 'ERR_CONFIG',
      });
    }
    super(database, opts.ownsDatabase ?? false);
    this.pglite = database.pglite;
  }

  protected override async ingestTrajectories(rows: readonly TrajectoryRow[], tx: Tx | undefined): Promise<number> {
    // Kysely has run BEGIN on the held connection before the callback, so the COPYs below land
    // in this transaction.
    return this.inTx(tx, (t) => ingestByCopy(txRunner(t), this.copyFromBlob, rows));
  }

  private readonly copyFromBlob: CopyRunner = async (target, encode) => {
    const statement = copySql(target, 'blob');
    let n = 0;
    for (const chunk of encode('per-chunk')) {
      const [res] = await this.pglite.exec(statement, { blob: new Blob([chunk]) });
      n += res?.affectedRows ?? 0;
    }
    return n;
  };
}
