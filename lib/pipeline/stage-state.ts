/**
 * Durable per-stage state and pending items (migrations/20261121_0004_stage_state.sql). Every call
 * takes the executor to write through: the embedded bus's batch transaction (`ctx.tx`) when there
 * is one, so state, outputs and offsets commit together; otherwise the database handle.
 */
import { sql } from 'kysely';
import type { Db, Tx } from '../db/database.ts';

export type Executor = Db | Tx;

export async function loadStageState<S>(db: Executor, runId: string, stage: string): Promise<S | undefined> {
  const r = await sql<{ state: S }>`select state from stage_state where run_id = ${runId} and stage = ${stage}`.execute(db);
  return r.rows[0]?.state;
}

export async function saveStageState<S>(db: Executor, runId: string, stage: string, state: S): Promise<void> {
  await sql`insert into stage_state (run_id, stage, state) values (${runId}, ${stage}, ${JSON.stringify(state)}::jsonb)
            on conflict (run_id, stage) do update set state = excluded.state, updated_at = now()`.execute(db);
}

export interface PendingItem { bucket: string; id: string; payload: Buffer; headers: Record<string, string> }

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
    const values = sql.join(chunk.map((it) => sql`(${runId}, ${stage}, ${it.bucket}, ${it.id}, ${it.payload}, ${JSON.stringify(it.headers)}::jsonb)`));
    await sql`insert into stage_pending (run_id, stage, bucket, id, payload, headers) values ${values} on conflict do nothing`.execute(db);
  }
}

/** Pending items of a bucket, ordered by id. */
export async function listPending(db: Executor, runId: string, stage: string, bucket: string): Promise<PendingItem[]> {
  const r = await sql<{ bucket: string; id: string; payload: Buffer; headers: Record<string, string> }>`
    select bucket, id, payload, headers from stage_pending where run_id = ${runId} and stage = ${stage} and bucket = ${bucket} order by id`.execute(db);
  return r.rows.map((x) => ({ ...x, payload: Buffer.from(x.payload) }));
}

export async function pendingBuckets(db: Executor, runId: string, stage: string): Promise<string[]> {
  const r = await sql<{ bucket: string }>`select distinct bucket from stage_pending where run_id = ${runId} and stage = ${stage} order by bucket`.execute(db);
  return r.rows.map((x) => x.bucket);
}

export async function deletePending(db: Executor, runId: string, stage: string, bucket: string): Promise<void> {
  await sql`delete from stage_pending where run_id = ${runId} and stage = ${stage} and bucket = ${bucket}`.execute(db);
}

/** The stages that have saved state for the run (empty for a run that never started). */
export async function stagesWithState(db: Executor, runId: string): Promise<string[]> {
  const r = await sql<{ stage: string }>`select stage from stage_state where run_id = ${runId} order by stage`.execute(db);
  return r.rows.map((x) => x.stage);
}
