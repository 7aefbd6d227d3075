/**
 * Durable per-stage state and pending items (migrations/20261121_0004_stage_state.sql). Every call
 * takes the executor to write through: the embedded bus's batch transaction (`ctx.tx`) when there
 * is one, so state, outputs and offsets commit together; otherwise the database handle.
 */
import { sql } from 'kysely';
import type { Executor, Tx } from '../db/database.ts';

export type { Executor };

/** The transaction an executor is, if it is one (for the store port's `{ tx }` options). */
export function txOf(db: Executor): Tx | undefined {
  return db.isTransaction ? (db as Tx) : undefined;
}

export async function loadStageState<S>(db: Executor, runId: string, stage: string): Promise<S | undefined> {
  const r = await sql<{ state: S }>`select state from stage_state where run_id = ${runId} and stage = ${stage}`.execute(
    db,
  );
  return r.rows[0]?.state;
}

export async function saveStageState<S>(db: Executor, runId: string, stage: string, state: S): Promise<void> {
  await sql`insert into stage_state (run_id, stage, state) values (${runId}, ${stage}, ${JSON.stringify(state)}::jsonb)
            on conflict (run_id, stage) do update set state = excluded.state, updated_at = now()`.execute(db);
}

export interface PendingItem {
  bucket: string;
  id: string;
  payload: Buffer;
  headers: Record<string, string>;
}

/** Rows per insert statement (6 parameters each; PostgreSQL allows 65535 parameters). */
const PENDING_ROWS_PER_INSERT = 500;

/**
 * Adds items; an (bucket, id) already pending is ignored (redelivery), as is an id repeated
 * within `items` (the first one is kept). Multi-row inserts: one statement per row made this the
 * embedded pipeline's costliest query (a round trip into PGlite per group).
 */
export async function addPending(db: Executor, runId: string, stage: string, items: PendingItem[]): Promise<void> {
  const seen = new Set<string>();
  const rows = items.filter((it) => {
    const key = `${it.bucket}\u0000${it.id}`;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
  for (let i = 0; i < rows.length; i += PENDING_ROWS_PER_INSERT) {
    const chunk = rows.slice(i, i + PENDING_ROWS_PER_INSERT);
    const values = sql.join(
      chunk.map(
        (it) => sql`(${runId}, ${stage}, ${it.bucket}, ${it.id}, ${it.payload}, ${JSON.stringify(it.headers)}::jsonb)`,
      ),
    );
    await sql`insert into stage_pending (run_id, stage, bucket, id, payload, headers) values ${values} on conflict do nothing`.execute(
      db,
    );
  }
}

/** Pending items of a bucket, ordered by id. */
export async function listPending(db: Executor, runId: string, stage: string, bucket: string): Promise<PendingItem[]> {
  const r = await sql<{ bucket: string; id: string; payload: Buffer; headers: Record<string, string> }>`
    select bucket, id, payload, headers from stage_pending where run_id = ${runId} and stage = ${stage} and bucket = ${bucket} order by id`.execute(
    db,
  );
  return r.rows.map((x) => ({ ...x, payload: Buffer.from(x.payload) }));
}

export async function pendingBuckets(db: Executor, runId: string, stage: string): Promise<string[]> {
  const r = await sql<{
    bucket: string;
  }>`select distinct bucket from stage_pending where run_id = ${runId} and stage = ${stage} order by bucket`.execute(
    db,
  );
  return r.rows.map((x) => x.bucket);
}

export async function deletePending(db: Executor, runId: string, stage: string, bucket: string): Promise<void> {
  await sql`delete from stage_pending where run_id = ${runId} and stage = ${stage} and bucket = ${bucket}`.execute(db);
}

/** The stages that have saved state for the run (empty for a run that never started). */
export async function stagesWithState(db: Executor, runId: string): Promise<string[]> {
  const r = await sql<{ stage: string }>`select stage from stage_state where run_id = ${runId} order by stage`.execute(
    db,
  );
  return r.rows.map((x) => x.stage);
}

/**
 * The pending items of one batch of a stage that gathers each step's groups across batches
 * (advantage, update). The batch's own items stay in memory; `items(bucket)` is what earlier
 * batches stored plus these. At `persist()` — after the state that says which buckets are settled
 * — the stored rows of settled buckets are deleted and only the batch's items of UNSETTLED buckets
 * are written. A step whose groups all arrive in one batch (the embedded pipeline's usual case)
 * so never writes its payloads twice. Crash safety is unchanged: the batch's offsets commit after
 * `persist()` (embedded: in the same transaction), so an item is either in stage_pending or will
 * be redelivered.
 */
export class PendingBatch {
  private readonly fresh = new Map<string, PendingItem[]>();
  private readonly freshIds = new Set<string>();
  private readonly stored = new Set<string>();
  private readonly settled = new Set<string>();

  constructor(
    private readonly db: Executor,
    private readonly runId: string,
    private readonly stage: string,
  ) {}

  /** This batch's items; an (bucket, id) repeated within the batch keeps its first occurrence. */
  add(items: PendingItem[]): void {
    for (const it of items) {
      const key = `${it.bucket}\u0000${it.id}`;
      if (this.freshIds.has(key)) continue;
      this.freshIds.add(key);
      const list = this.fresh.get(it.bucket);
      if (list) list.push(it);
      else this.fresh.set(it.bucket, [it]);
    }
  }

  /** Stored items of `bucket` and this batch's (a stored id wins over a redelivered copy), ordered by id. */
  async items(bucket: string): Promise<PendingItem[]> {
    const stored = await listPending(this.db, this.runId, this.stage, bucket);
    if (stored.length) this.stored.add(bucket);
    const ids = new Set(stored.map((s) => s.id));
    const out = [...stored, ...(this.fresh.get(bucket) ?? []).filter((it) => !ids.has(it.id))];
    return out.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  /** The bucket is done: its items are never needed again. */
  settle(bucket: string): void {
    this.settled.add(bucket);
  }

  /** Deletes settled buckets' stored rows and stores this batch's items of the others. */
  async persist(): Promise<void> {
    for (const b of this.settled) if (this.stored.has(b)) await deletePending(this.db, this.runId, this.stage, b);
    const keep = [...this.fresh].filter(([b]) => !this.settled.has(b)).flatMap(([, items]) => items);
    await addPending(this.db, this.runId, this.stage, keep);
  }
}
