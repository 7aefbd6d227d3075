/**
 * The query code both adapters share: everything but the trajectory bulk path is plain Kysely over
 * the node-postgres pool that lib/db/database.ts opens (PGlite's bridge or a real pool), so it is
 * written once here. Adapters supply `ingestTrajectories` (COPY into a staging table, the fastest
 * path each technology offers).
 */
import { createHash } from 'node:crypto';
import { sql, type Insertable, type Kysely } from 'kysely';
import type { Database } from '../db/database.ts';
import { RlError, isRetriable, errorMessage } from '../errors.ts';
import { isConnectionError } from '../db/errors.ts';
import {
  RUN_STATUSES,
  METRIC_AGGS,
  type MetricAgg,
  type CheckpointRow,
  type DeadLetterFilter,
  type DeadLetterRow,
  type InsertResult,
  type Json,
  type JsonObject,
  type MetricRow,
  type NewRun,
  type RunFilter,
  type RunRow,
  type RunStatus,
  type Store,
  type StoredCheckpoint,
  type StoredDeadLetter,
  type StoredMetric,
  type StoredTrajectory,
  type StoredValGeneration,
  type TrajectoryFilter,
  type TrajectoryRow,
  type Tx,
  type ValGenerationRow,
  type WriteOptions,
  type PromptImageRow,
  type ReadOptions,
  type StoredPromptImage,
  type EpisodeRow,
} from './port.ts';
import { decodeTrajectory, storableText, validateTrajectory } from './trajectory-codec.ts';
import type { PromptImagesTable, StoreTables } from './tables.ts';

/** Turns a driver error into an RlError whose message says what to fix; keeps retriability. */
export function storeError(op: string, err: unknown, where: string): RlError {
  if (err instanceof RlError) return err;
  const e = err as { code?: string; constraint?: string; detail?: string; message?: string };
  if (e?.code === '23503') {
    return new RlError(
      `${op}: the run is not registered in ${where} (${e.detail ?? e.constraint ?? 'foreign key'}); call upsertRun first`,
      {
        retriable: false,
        code: 'ERR_UNKNOWN_RUN',
        cause: err,
      },
    );
  }
  if (e?.code === '23514' || e?.code === '22P02' || e?.code === '22003' || e?.code === '23502' || e?.code === '22P05') {
    return new RlError(
      `${op}: rejected by ${where}: ${errorMessage(err)}${e.constraint ? ` (constraint ${e.constraint})` : ''}`,
      {
        retriable: false,
        code: 'ERR_BAD_ROW',
        cause: err,
      },
    );
  }
  if (e?.code === '42P01') {
    return new RlError(
      `${op}: a store table is missing in ${where} (${errorMessage(err)}); open the database with migrations enabled`,
      {
        retriable: false,
        code: 'ERR_SCHEMA',
        cause: err,
      },
    );
  }
  // retriable SQLSTATEs (40001, 40P01, 53300, 57P0x, 08xxx) and node-postgres' pool and socket
  // errors, which carry no code: transient
  const transient = isRetriable(err) || isConnectionError(err);
  return new RlError(`${op} failed on ${where}: ${errorMessage(err)}`, {
    retriable: transient,
    code: 'ERR_STORE',
    cause: err,
  });
}

function int(v: unknown, what: string, min = 0): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > 2147483647) {
    throw new RlError(`${what} must be an integer ≥ ${min}, got ${String(v)}`, { code: 'ERR_BAD_ROW' });
  }
  return v;
}

function groupBy<T>(xs: readonly T[], key: (x: T) => string): Map<string, T[]> {
  const m = new Map<string, T[]>();
  for (const x of xs) {
    const k = key(x);
    const a = m.get(k);
    if (a) a.push(x);
    else m.set(k, [x]);
  }
  return m;
}

function nonEmpty(v: unknown, what: string): string {
  if (typeof v !== 'string' || v.length === 0)
    throw new RlError(`${what} must be a non-empty string`, { code: 'ERR_BAD_ROW' });
  if (v.includes('\u0000'))
    throw new RlError(`${what} contains a NUL character (U+0000), which PostgreSQL text cannot store`, {
      code: 'ERR_BAD_ROW',
    });
  return v;
}

function optText(v: unknown, what: string): string | null {
  if (v === null || v === undefined) return null;
  return nonEmpty(v, what);
}

/** jsonb parameters go as JSON text: node-postgres would turn a JS array into a PostgreSQL array. */
function jsonParam(v: Json | undefined, what: string): string | null {
  if (v === undefined || v === null) return null;
  try {
    return JSON.stringify(v);
  } catch (e) {
    throw new RlError(`${what} is not JSON-serialisable: ${errorMessage(e)}`, { code: 'ERR_BAD_ROW', cause: e });
  }
}

function checkReward(reward: unknown, failure: unknown, what: string): void {
  if (reward === null || reward === undefined) {
    if (typeof failure !== 'string' || failure.length === 0) {
      throw new RlError(
        `${what}: reward is null but rewardFailure does not say why (a failed score is stored as null plus its reason, never as 0)`,
        { code: 'ERR_BAD_ROW' },
      );
    }
  } else {
    if (typeof reward !== 'number' || !Number.isFinite(reward))
      throw new RlError(`${what}: reward must be a finite number or null, got ${String(reward)}`, {
        code: 'ERR_BAD_ROW',
      });
    if (failure !== null && failure !== undefined)
      throw new RlError(`${what}: rewardFailure must be null when a reward is given`, { code: 'ERR_BAD_ROW' });
  }
}

function decodeRun(r: Record<string, any>): RunRow {
  return {
    runId: r.run_id,
    project: r.project,
    experiment: r.experiment,
    config: r.config,
    status: r.status,
    parentRunId: r.parent_run_id,
    summary: r.summary,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

function decodeCheckpoint(r: Record<string, any>): StoredCheckpoint {
  return {
    runId: r.run_id,
    step: r.step,
    path: r.path,
    sha256: r.sha256,
    policyVersion: r.policy_version,
    consumedOffsets: r.consumed_offsets,
    datasetPosition: r.dataset_position,
    rngState: r.rng_state,
    klCtlState: r.kl_ctl_state,
    lrState: r.lr_state,
    createdAt: r.created_at,
  };
}

export abstract class KyselyStore implements Store {
  abstract readonly kind: 'pglite' | 'postgres';
  readonly where: string;
  protected readonly db: Kysely<StoreTables>;
  private closed = false;

  protected constructor(
    protected readonly database: Database,
    private readonly ownsDatabase: boolean,
  ) {
    this.db = database.db as Kysely<StoreTables>;
    this.where = database.where;
  }

  /**
   * Writes validated trajectory rows (idempotently: on conflict do nothing) and returns how many
   * were new. `tx`, when given, is the caller's open transaction; otherwise the adapter uses its own.
   */
  protected abstract ingestTrajectories(rows: readonly TrajectoryRow[], tx: Tx | undefined): Promise<number>;

  protected live(): void {
    if (this.closed) throw new RlError(`the store on ${this.where} is closed`, { code: 'ERR_CLOSED' });
  }

  /** The caller's transaction (typed over our tables) or the database handle. */
  protected on(tx: Tx | undefined): Kysely<StoreTables> {
    return (tx ?? this.db) as Kysely<StoreTables>;
  }

  /** Runs `fn` in the caller's transaction or in a fresh one. */
  protected async inTx<T>(tx: Tx | undefined, fn: (tx: Tx) => Promise<T>): Promise<T> {
    if (tx) return fn(tx);
    return this.db.transaction().execute(fn);
  }

  protected async guard<T>(op: string, fn: () => Promise<T>): Promise<T> {
    this.live();
    try {
      return await fn();
    } catch (e) {
      throw storeError(op, e, this.where);
    }
  }

  // ---- runs -------------------------------------------------------------------------------------

  async upsertRun(run: NewRun, opts: WriteOptions = {}): Promise<RunRow> {
    nonEmpty(run.runId, 'runId');
    nonEmpty(run.project, 'project');
    nonEmpty(run.experiment, 'experiment');
    const status = run.status ?? 'running';
    if (!RUN_STATUSES.includes(status))
      throw new RlError(`run status must be one of ${RUN_STATUSES.join(', ')}, got ${JSON.stringify(status)}`, {
        code: 'ERR_BAD_ROW',
      });
    if (run.config === null || typeof run.config !== 'object' || Array.isArray(run.config))
      throw new RlError('run config must be a JSON object', { code: 'ERR_BAD_ROW' });
    const values = {
      run_id: run.runId,
      project: run.project,
      experiment: run.experiment,
      config: jsonParam(run.config, 'run config')!,
      status,
      parent_run_id: optText(run.parentRunId, 'parentRunId'),
    };
    return this.guard(`upsertRun(${run.runId})`, async () => {
      const row = await this.on(opts.tx)
        .insertInto('runs')
        .values(values)
        .onConflict((oc) =>
          oc.column('run_id').doUpdateSet({
            project: (eb) => eb.ref('excluded.project'),
            experiment: (eb) => eb.ref('excluded.experiment'),
            config: (eb) => eb.ref('excluded.config'),
            status: (eb) => eb.ref('excluded.status'),
            parent_run_id: (eb) => eb.ref('excluded.parent_run_id'),
            updated_at: sql<Date>`now()`,
          }),
        )
        .returningAll()
        .executeTakeFirstOrThrow();
      return decodeRun(row);
    });
  }

  async getRun(runId: string): Promise<RunRow | undefined> {
    return this.guard(`getRun(${runId})`, async () => {
      const row = await this.db.selectFrom('runs').selectAll().where('run_id', '=', runId).executeTakeFirst();
      return row ? decodeRun(row) : undefined;
    });
  }

  async listRuns(filter: RunFilter = {}): Promise<RunRow[]> {
    return this.guard('listRuns', async () => {
      let q = this.db.selectFrom('runs').selectAll();
      if (filter.project !== undefined) q = q.where('project', '=', filter.project);
      if (filter.experiment !== undefined) q = q.where('experiment', '=', filter.experiment);
      if (filter.status !== undefined) q = q.where('status', '=', filter.status);
      const rows = await q.orderBy('created_at', 'desc').orderBy('run_id').execute();
      return rows.map(decodeRun);
    });
  }

  async setRunStatus(runId: string, status: RunStatus, summary?: JsonObject, opts: WriteOptions = {}): Promise<RunRow> {
    if (!RUN_STATUSES.includes(status))
      throw new RlError(`run status must be one of ${RUN_STATUSES.join(', ')}, got ${JSON.stringify(status)}`, {
        code: 'ERR_BAD_ROW',
      });
    const set: Record<string, unknown> = { status, updated_at: sql<Date>`now()` };
    if (summary !== undefined) set.summary = jsonParam(summary, 'run summary');
    return this.guard(`setRunStatus(${runId})`, async () => {
      const row = await this.on(opts.tx)
        .updateTable('runs')
        .set(set)
        .where('run_id', '=', runId)
        .returningAll()
        .executeTakeFirst();
      if (!row)
        throw new RlError(
          `run ${JSON.stringify(runId)} does not exist in ${this.where}; cannot set its status to ${status}`,
          { code: 'ERR_UNKNOWN_RUN' },
        );
      return decodeRun(row);
    });
  }

  // ---- trajectories -----------------------------------------------------------------------------

  async insertTrajectories(rows: readonly TrajectoryRow[], opts: WriteOptions = {}): Promise<InsertResult> {
    this.live();
    for (const row of rows) validateTrajectory(row);
    if (rows.length === 0) return { inserted: 0, duplicates: 0 };
    const inserted = await this.guard(`insertTrajectories(${rows.length} rows, run ${rows[0]!.runId})`, () =>
      this.ingestTrajectories(rows, opts.tx),
    );
    return { inserted, duplicates: rows.length - inserted };
  }

  async getTrajectories(runId: string, filter: TrajectoryFilter = {}): Promise<StoredTrajectory[]> {
    return this.guard(`getTrajectories(${runId})`, async () => {
      let q = this.db.selectFrom('trajectories').selectAll().where('run_id', '=', runId);
      if (filter.step !== undefined) q = q.where('step', '=', filter.step);
      if (filter.kind !== undefined) q = q.where('kind', '=', filter.kind);
      if (filter.filtered !== undefined) q = q.where('filtered', '=', filter.filtered);
      if (filter.ids !== undefined) {
        if (filter.ids.length === 0) return [];
        q = q.where('id', '=', sql<any>`any(${[...filter.ids]}::text[])`);
      }
      const rows = await q.orderBy('step').orderBy('prompt_index').orderBy('sample_index').orderBy('id').execute();
      return rows.map(decodeTrajectory);
    });
  }

  async countTrajectories(runId: string, filter: Omit<TrajectoryFilter, 'ids'> = {}): Promise<number> {
    return this.guard(`countTrajectories(${runId})`, async () => {
      let q = this.db
        .selectFrom('trajectories')
        .select(sql<number>`count(*)::int`.as('n'))
        .where('run_id', '=', runId);
      if (filter.step !== undefined) q = q.where('step', '=', filter.step);
      if (filter.kind !== undefined) q = q.where('kind', '=', filter.kind);
      if (filter.filtered !== undefined) q = q.where('filtered', '=', filter.filtered);
      const row = await q.executeTakeFirstOrThrow();
      return Number(row.n);
    });
  }

  // ---- metrics ----------------------------------------------------------------------------------

  async insertMetrics(rows: readonly MetricRow[], opts: WriteOptions = {}): Promise<void> {
    this.live();
    if (rows.length === 0) return;
    // One row per key per statement: ON CONFLICT DO UPDATE cannot touch a row twice. Replacing
    // and incrementing rows go in separate statements (their conflict actions differ).
    type PartRow = {
      run_id: string;
      step: number;
      name: string;
      stage: string;
      replica: string;
      value: number;
      agg: MetricAgg;
      weight: number;
    };
    const set = new Map<string, PartRow>();
    const inc = new Map<string, PartRow>();
    for (const m of rows) {
      nonEmpty(m.runId, 'metric runId');
      nonEmpty(m.name, 'metric name');
      int(m.step, `metric ${m.name} step`);
      if (typeof m.value !== 'number')
        throw new RlError(`metric ${m.name} at step ${m.step}: value must be a number, got ${typeof m.value}`, {
          code: 'ERR_BAD_ROW',
        });
      const agg = m.agg ?? 'last';
      if (!METRIC_AGGS.includes(agg))
        throw new RlError(
          `metric ${m.name} at step ${m.step}: agg must be one of ${METRIC_AGGS.join(', ')}, got ${String(agg)}`,
          { code: 'ERR_BAD_ROW' },
        );
      const weight = m.weight ?? 1;
      if (!(weight >= 0) || !Number.isFinite(weight))
        throw new RlError(`metric ${m.name} at step ${m.step}: weight must be a finite number ≥ 0, got ${weight}`, {
          code: 'ERR_BAD_ROW',
        });
      const stage = optText(m.stage, 'metric stage') ?? '';
      const replica = m.replica === undefined || m.replica === '' ? '' : optText(m.replica, 'metric replica')!; // '': the stage's only writer
      const key = `${m.runId}\u0000${m.step}\u0000${m.name}\u0000${stage}\u0000${replica}`;
      const row: PartRow = { run_id: m.runId, step: m.step, name: m.name, stage, replica, value: m.value, agg, weight };
      if (m.increment) {
        const prev = inc.get(key);
        inc.set(key, prev ? { ...row, value: prev.value + row.value } : row);
      } else set.set(key, row);
    }
    await this.guard(`insertMetrics(${set.size + inc.size} rows)`, async () => {
      for (const [values, increment] of [
        [[...set.values()], false],
        [[...inc.values()], true],
      ] as const) {
        for (let i = 0; i < values.length; i += 5000) {
          await this.on(opts.tx)
            .insertInto('step_metric_parts')
            .values(values.slice(i, i + 5000))
            .onConflict((oc) =>
              oc.columns(['run_id', 'step', 'name', 'stage', 'replica']).doUpdateSet({
                value: increment
                  ? sql<number>`step_metric_parts.value + excluded.value`
                  : (eb) => eb.ref('excluded.value'),
                agg: (eb) => eb.ref('excluded.agg'),
                weight: (eb) => eb.ref('excluded.weight'),
                updated_at: sql<Date>`now()`,
              }),
            )
            .execute();
        }
      }
    });
  }

  async getMetrics(runId: string, names?: readonly string[]): Promise<StoredMetric[]> {
    return this.guard(`getMetrics(${runId})`, async () => {
      let q = this.db.selectFrom('step_metrics').selectAll().where('run_id', '=', runId);
      if (names !== undefined) {
        if (names.length === 0) return [];
        q = q.where('name', '=', sql<any>`any(${[...names]}::text[])`);
      }
      const rows = await q.orderBy('name').orderBy('step').execute();
      return rows.map((r) => ({
        runId: r.run_id,
        step: r.step,
        name: r.name,
        value: r.value,
        stage: r.stage,
        parts: Number(r.parts),
        createdAt: r.created_at,
      }));
    });
  }

  // ---- checkpoints ------------------------------------------------------------------------------

  async recordCheckpoint(row: CheckpointRow, opts: WriteOptions = {}): Promise<void> {
    this.live();
    nonEmpty(row.runId, 'checkpoint runId');
    int(row.step, 'checkpoint step');
    nonEmpty(row.path, 'checkpoint path');
    int(row.policyVersion, 'checkpoint policyVersion');
    if (typeof row.sha256 !== 'string' || !/^[0-9a-f]{64}$/.test(row.sha256)) {
      throw new RlError(`checkpoint sha256 must be 64 lower-case hex digits, got ${JSON.stringify(row.sha256)}`, {
        code: 'ERR_BAD_ROW',
      });
    }
    if (row.consumedOffsets === null || typeof row.consumedOffsets !== 'object' || Array.isArray(row.consumedOffsets)) {
      throw new RlError('checkpoint consumedOffsets must be a JSON object (topic/partition → next offset)', {
        code: 'ERR_BAD_ROW',
      });
    }
    const values = {
      run_id: row.runId,
      step: row.step,
      path: row.path,
      sha256: row.sha256,
      policy_version: row.policyVersion,
      consumed_offsets: jsonParam(row.consumedOffsets, 'checkpoint consumedOffsets')!,
      dataset_position: jsonParam(row.datasetPosition, 'checkpoint datasetPosition'),
      rng_state: jsonParam(row.rngState, 'checkpoint rngState'),
      kl_ctl_state: jsonParam(row.klCtlState, 'checkpoint klCtlState'),
      lr_state: jsonParam(row.lrState, 'checkpoint lrState'),
    };
    await this.guard(`recordCheckpoint(${row.runId} step ${row.step})`, async () => {
      await this.on(opts.tx)
        .insertInto('checkpoints')
        .values(values)
        .onConflict((oc) =>
          oc.columns(['run_id', 'step']).doUpdateSet({
            path: (eb) => eb.ref('excluded.path'),
            sha256: (eb) => eb.ref('excluded.sha256'),
            policy_version: (eb) => eb.ref('excluded.policy_version'),
            consumed_offsets: (eb) => eb.ref('excluded.consumed_offsets'),
            dataset_position: (eb) => eb.ref('excluded.dataset_position'),
            rng_state: (eb) => eb.ref('excluded.rng_state'),
            kl_ctl_state: (eb) => eb.ref('excluded.kl_ctl_state'),
            lr_state: (eb) => eb.ref('excluded.lr_state'),
            created_at: sql<Date>`now()`,
          }),
        )
        .execute();
    });
  }

  async latestCheckpoint(runId: string): Promise<StoredCheckpoint | undefined> {
    return this.guard(`latestCheckpoint(${runId})`, async () => {
      const row = await this.db
        .selectFrom('checkpoints')
        .selectAll()
        .where('run_id', '=', runId)
        .orderBy('step', 'desc')
        .limit(1)
        .executeTakeFirst();
      return row ? decodeCheckpoint(row) : undefined;
    });
  }

  async listCheckpoints(runId: string, opts: ReadOptions = {}): Promise<StoredCheckpoint[]> {
    return this.guard(`listCheckpoints(${runId})`, async () => {
      const rows = await this.on(opts.tx)
        .selectFrom('checkpoints')
        .selectAll()
        .where('run_id', '=', runId)
        .orderBy('step')
        .execute();
      return rows.map(decodeCheckpoint);
    });
  }

  // ---- validation generations ---------------------------------------------------------------------

  async recordValGenerations(rows: readonly ValGenerationRow[], opts: WriteOptions = {}): Promise<void> {
    this.live();
    if (rows.length === 0) return;
    const values = rows.map((g) => {
      const what = `val generation ${g.runId}/${g.step}/${g.idx}`;
      nonEmpty(g.runId, 'val generation runId');
      int(g.step, `${what} step`);
      int(g.idx, `${what} idx`);
      if (typeof g.prompt !== 'string' || typeof g.response !== 'string')
        throw new RlError(`${what}: prompt and response must be strings`, { code: 'ERR_BAD_ROW' });
      checkReward(g.reward, g.rewardFailure, what);
      return {
        // decoded text: a NUL is stored as ␀ (see storableText)
        run_id: g.runId,
        step: g.step,
        idx: g.idx,
        prompt: storableText(g.prompt),
        response: storableText(g.response),
        ground_truth: g.groundTruth == null ? null : storableText(g.groundTruth),
        reward: g.reward ?? null,
        reward_failure: g.rewardFailure == null ? null : storableText(g.rewardFailure),
      };
    });
    await this.guard(`recordValGenerations(${rows.length} rows)`, async () => {
      for (let i = 0; i < values.length; i += 5000) {
        await this.on(opts.tx)
          .insertInto('val_generations')
          .values(values.slice(i, i + 5000))
          .onConflict((oc) => oc.columns(['run_id', 'step', 'idx']).doNothing())
          .execute();
      }
    });
  }

  async getValGenerations(runId: string, step?: number): Promise<StoredValGeneration[]> {
    return this.guard(`getValGenerations(${runId})`, async () => {
      let q = this.db.selectFrom('val_generations').selectAll().where('run_id', '=', runId);
      if (step !== undefined) q = q.where('step', '=', step);
      const rows = await q.orderBy('step').orderBy('idx').execute();
      return rows.map((r) => ({
        runId: r.run_id,
        step: r.step,
        idx: r.idx,
        prompt: r.prompt,
        response: r.response,
        groundTruth: r.ground_truth,
        reward: r.reward,
        rewardFailure: r.reward_failure,
        createdAt: r.created_at,
      }));
    });
  }

  // ---- multi-turn episodes -----------------------------------------------------------------------

  async insertEpisodes(rows: readonly EpisodeRow[], opts: WriteOptions = {}): Promise<void> {
    this.live();
    if (rows.length === 0) return;
    const episodes = rows.map((r) => {
      const e = r.episode;
      const what = `episode ${r.trajectoryId}`;
      nonEmpty(r.runId, `${what} runId`);
      int(r.step, `${what} step`);
      if (!Number.isFinite(e.reward))
        throw new RlError(`${what}: reward ${e.reward} is not finite`, { code: 'ERR_BAD_ROW' });
      return {
        run_id: r.runId,
        trajectory_id: r.trajectoryId,
        step: r.step,
        kind: r.kind,
        policy_version: r.policyVersion,
        assistant_turns: e.assistant_turns,
        reward: e.reward,
        done: e.done,
        failure: e.failure == null ? null : storableText(e.failure),
        timed_out: e.timed_out,
        tool_calls: e.tool_calls,
        tool_errors: e.tool_errors,
        response_tokens: r.responseTokens,
      };
    });
    const turns = rows.flatMap((r) =>
      r.episode.turns.map((t, i) => ({
        run_id: r.runId,
        trajectory_id: r.trajectoryId,
        turn_index: i,
        role: t.role,
        token_start: t.start,
        token_end: t.end,
        text: storableText(t.text),
        tool_name: t.tool_name,
        arguments: t.arguments == null ? null : storableText(t.arguments),
        result_chars: t.role === 'assistant' ? 0 : t.text.length,
        latency_ms: t.latency_ms,
        error: t.error == null ? null : storableText(t.error),
        reward: t.reward,
      })),
    );
    await this.guard(`insertEpisodes(${rows.length} episodes, run ${rows[0]!.runId})`, async () => {
      const db = this.on(opts.tx);
      for (let i = 0; i < episodes.length; i += 2000)
        await db
          .insertInto('episodes')
          .values(episodes.slice(i, i + 2000))
          .onConflict((oc) => oc.columns(['run_id', 'trajectory_id']).doNothing())
          .execute();
      for (let i = 0; i < turns.length; i += 2000)
        await db
          .insertInto('episode_turns')
          .values(turns.slice(i, i + 2000))
          .onConflict((oc) => oc.columns(['run_id', 'trajectory_id', 'turn_index']).doNothing())
          .execute();
    });
  }

  async getEpisodes(runId: string, step?: number): Promise<EpisodeRow[]> {
    return this.guard(`getEpisodes(${runId})`, async () => {
      let q = this.db.selectFrom('episodes').selectAll().where('run_id', '=', runId);
      if (step !== undefined) q = q.where('step', '=', step);
      const eps = await q.orderBy('step').orderBy('trajectory_id').execute();
      if (eps.length === 0) return [];
      let tq = this.db.selectFrom('episode_turns').selectAll().where('run_id', '=', runId);
      if (step !== undefined)
        tq = tq.where('trajectory_id', '=', sql<any>`any(${eps.map((e) => e.trajectory_id)}::text[])`);
      const turns = await tq.orderBy('trajectory_id').orderBy('turn_index').execute();
      const byId = new Map<string, typeof turns>();
      for (const t of turns) {
        const l = byId.get(t.trajectory_id) ?? [];
        l.push(t);
        byId.set(t.trajectory_id, l);
      }
      return eps.map((e) => ({
        runId: e.run_id,
        trajectoryId: e.trajectory_id,
        step: e.step,
        kind: e.kind as 'train' | 'val',
        policyVersion: e.policy_version,
        responseTokens: e.response_tokens,
        episode: {
          turns: (byId.get(e.trajectory_id) ?? []).map((t) => ({
            role: t.role,
            start: t.token_start,
            end: t.token_end,
            text: t.text,
            tool_name: t.tool_name,
            arguments: t.arguments,
            latency_ms: Number(t.latency_ms),
            error: t.error,
            reward: Number(t.reward),
          })),
          assistant_turns: e.assistant_turns,
          reward: Number(e.reward),
          done: e.done,
          failure: e.failure,
          timed_out: e.timed_out,
          tool_calls: e.tool_calls,
          tool_errors: e.tool_errors,
          metrics: {},
        },
      }));
    });
  }

  // ---- prompt images -----------------------------------------------------------------------------

  async insertPromptImages(rows: readonly PromptImageRow[], opts: WriteOptions = {}): Promise<number> {
    this.live();
    const values = new Map<string, Insertable<PromptImagesTable>>();
    for (const r of rows) {
      nonEmpty(r.runId, 'prompt image runId');
      if (typeof r.hash !== 'string' || !/^[0-9a-f]{64}$/.test(r.hash))
        throw new RlError(`prompt image hash must be a lower-case hex sha256, got ${JSON.stringify(r.hash)}`, {
          code: 'ERR_BAD_ROW',
        });
      int(r.width, 'prompt image width', 1);
      int(r.height, 'prompt image height', 1);
      if (!(r.png instanceof Uint8Array) || r.png.length === 0)
        throw new RlError(`prompt image ${r.hash}: png must be non-empty bytes`, { code: 'ERR_BAD_ROW' });
      const png = Buffer.from(r.png.buffer, r.png.byteOffset, r.png.byteLength);
      const actual = createHash('sha256').update(png).digest('hex');
      if (actual !== r.hash)
        throw new RlError(`prompt image ${r.hash}: its png bytes hash to ${actual}`, { code: 'ERR_BAD_ROW' });
      values.set(`${r.runId}\u0000${r.hash}`, { run_id: r.runId, hash: r.hash, width: r.width, height: r.height, png });
    }
    if (values.size === 0) return 0;
    return this.guard(`insertPromptImages(${values.size})`, async () => {
      const db = this.on(opts.tx);
      // images already stored are not sent again (the controller offers a prompt's image every
      // time it emits the prompt); the conflict clause covers a concurrent writer
      const have = new Set<string>();
      for (const [runId, hashes] of groupBy([...values.values()], (v) => v.run_id)) {
        const rows = await db
          .selectFrom('prompt_images')
          .select('hash')
          .where('run_id', '=', runId)
          .where(
            'hash',
            'in',
            hashes.map((v) => v.hash),
          )
          .execute();
        for (const r of rows) have.add(`${runId}\u0000${r.hash}`);
      }
      const fresh = [...values.entries()].filter(([k]) => !have.has(k)).map(([, v]) => v);
      if (fresh.length === 0) return 0;
      const res = await db
        .insertInto('prompt_images')
        .values(fresh)
        .onConflict((oc) => oc.columns(['run_id', 'hash']).doNothing())
        .executeTakeFirst();
      return Number(res.numInsertedOrUpdatedRows ?? 0n);
    });
  }

  async getPromptImages(runId: string, hashes?: readonly string[]): Promise<StoredPromptImage[]> {
    return this.guard('getPromptImages', async () => {
      if (hashes !== undefined && hashes.length === 0) return [];
      let q = this.db.selectFrom('prompt_images').selectAll().where('run_id', '=', runId);
      if (hashes !== undefined) q = q.where('hash', 'in', [...hashes]);
      const rows = await q.orderBy('hash').execute();
      return rows.map((r) => ({
        runId: r.run_id,
        hash: r.hash,
        width: r.width,
        height: r.height,
        png: Buffer.from(r.png),
        createdAt: r.created_at,
      }));
    });
  }

  // ---- dead letters -------------------------------------------------------------------------------

  async recordDeadLetter(row: DeadLetterRow, opts: WriteOptions = {}): Promise<void> {
    this.live();
    nonEmpty(row.stage, 'dead letter stage');
    nonEmpty(row.topic, 'dead letter topic');
    int(row.partition, 'dead letter partition');
    if (typeof row.offset !== 'number' || !Number.isSafeInteger(row.offset) || row.offset < 0) {
      throw new RlError(`dead letter offset must be a non-negative integer, got ${String(row.offset)}`, {
        code: 'ERR_BAD_ROW',
      });
    }
    if (typeof row.reason !== 'string' || row.reason.length === 0)
      throw new RlError('dead letter reason must be a non-empty string', { code: 'ERR_BAD_ROW' });
    const values = {
      stage: row.stage,
      topic: row.topic,
      partition: row.partition,
      msg_offset: row.offset,
      run_id: optText(row.runId, 'dead letter runId'),
      reason: row.reason.replaceAll('\u0000', '\\u0000'),
      error_code: optText(row.errorCode, 'dead letter errorCode'),
      payload:
        row.payload == null ? null : Buffer.from(row.payload.buffer, row.payload.byteOffset, row.payload.byteLength),
    };
    await this.guard(`recordDeadLetter(${row.stage} ${row.topic}/${row.partition}@${row.offset})`, async () => {
      await this.on(opts.tx)
        .insertInto('dead_letters')
        .values(values)
        .onConflict((oc) => oc.columns(['stage', 'topic', 'partition', 'msg_offset']).doNothing())
        .execute();
    });
  }

  async listDeadLetters(filter: DeadLetterFilter = {}): Promise<StoredDeadLetter[]> {
    return this.guard('listDeadLetters', async () => {
      let q = this.db.selectFrom('dead_letters').selectAll();
      if (filter.runId !== undefined) q = q.where('run_id', '=', filter.runId);
      if (filter.stage !== undefined) q = q.where('stage', '=', filter.stage);
      if (filter.topic !== undefined) q = q.where('topic', '=', filter.topic);
      const rows = await q.orderBy('created_at').orderBy('topic').orderBy('partition').orderBy('msg_offset').execute();
      return rows.map((r) => ({
        stage: r.stage,
        topic: r.topic,
        partition: r.partition,
        offset: Number(r.msg_offset),
        runId: r.run_id,
        reason: r.reason,
        errorCode: r.error_code,
        payload: r.payload,
        createdAt: r.created_at,
      }));
    });
  }

  // ---- lifecycle ----------------------------------------------------------------------------------

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.ownsDatabase) await this.database.close();
  }
}
