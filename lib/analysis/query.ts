/**
 * Running a user's SQL safely: one statement, inside `BEGIN TRANSACTION READ ONLY`, always rolled
 * back. The statement is sent with the extended query protocol, which accepts exactly one
 * statement, so `…; commit; insert …` cannot end the read-only transaction early. PostgreSQL and
 * PGlite both refuse writes in a read-only transaction (INSERT/UPDATE/DELETE, DDL, nextval, …).
 *
 * The statement runs as `rlstream_reader` (`SET LOCAL ROLE`, when the role exists and the session
 * may take it; migration 20261127_0012_reader_role): a role that reads every table and can do nothing else,
 * so what the syntax check misses (an escaped function name, a query string handed to ts_stat)
 * still cannot signal a session, touch a server file or reset statistics. A superuser session can
 * switch back (`set_config('role', …)`), so `rlstream sql` refuses superuser connections to
 * PostgreSQL (app/cli/commands/sql.ts); PGlite is one in-process session of its own run.
 *
 * Dates and times come back as the server's text (no time-zone shifts in printing); int8 comes
 * back as a number when it is a safe integer, otherwise as its exact text.
 */
import pg from 'pg';
import type { Database } from '../db/database.ts';
import { RlError, errorMessage } from '../errors.ts';
import type { QueryResult } from './format.ts';
import { assertPlainRead } from './sql-guard.ts';

export type { QueryResult, ResultColumn } from './format.ts';

// date, time, timestamp, timestamptz, interval, timetz and their arrays: keep the text.
const RAW_TEXT_TYPES = new Set([1082, 1083, 1114, 1184, 1186, 1266, 1182, 1183, 1115, 1185, 1187, 1270]);
const INT8 = 20;

function getTypeParser(oid: number, format?: 'text' | 'binary') {
  if (RAW_TEXT_TYPES.has(oid)) return (v: string) => v;
  if (oid === INT8)
    return (v: string) => {
      const n = Number(v);
      return Number.isSafeInteger(n) ? n : v;
    };
  return (pg.types.getTypeParser as (oid: number, format?: 'text' | 'binary') => unknown)(oid, format ?? 'text');
}

// node-postgres reads the row parsers from `types.getTypeParser`, while PGlite's node-postgres
// bridge also hands `types` to its Parse message as the list of parameter type oids (calling
// forEach on it). An empty array carrying getTypeParser satisfies both: no declared parameter
// types, our parsers for the rows.
const queryTypes = Object.assign([] as number[], { getTypeParser });

/** The role analysts' queries run as (created by migrate). */
export const READER_ROLE = 'rlstream_reader';

export interface ReadOnlyOptions {
  /** Cancel the statement after this many seconds (statement_timeout); 0 or undefined = no limit. */
  timeoutS?: number;
  /** Give up waiting for a lock after this many seconds (lock_timeout; default 5): a query never queues behind a writer. */
  lockTimeoutS?: number;
  /** Bind parameters ($1, $2, …), for programmatic use. */
  params?: readonly unknown[];
}

/** Turns a server error on a user query into a message that says what to change. */
export function queryError(err: unknown, where: string): RlError {
  const e = err as { code?: string; message?: string; position?: string; hint?: string };
  const msg = errorMessage(err);
  const hint = e?.hint ? ` (hint: ${e.hint})` : '';
  const at = e?.position ? ` at character ${e.position}` : '';
  switch (e?.code) {
    case '25006':
      return new RlError(
        `the query must only read: ${msg} — rlstream sql runs every query in a read-only transaction and rolls it back`,
        { code: 'ERR_READ_ONLY', cause: err },
      );
    case '42601':
      if (/multiple commands/.test(msg))
        return new RlError(
          'give one SQL statement per call (several statements separated by ";" are refused, so the read-only transaction cannot be ended early)',
          { code: 'ERR_SQL', cause: err },
        );
      return new RlError(`syntax error${at}: ${msg}${hint}`, { code: 'ERR_SQL', cause: err });
    case '42P01':
      return new RlError(
        `${msg}${at} in ${where}; the analysis views are v_step_metrics_wide, v_step_times, v_reward_by_prompt, v_response_length, v_kl_entropy, v_filtered_groups, v_reward_failures, v_staleness, v_checkpoint_lineage, v_dead_letters, v_runs (list them with --views; on a PostgreSQL they exist once a stage of this version has migrated it)`,
        { code: 'ERR_SQL', cause: err },
      );
    case '57014':
      return new RlError(
        `the query was cancelled: ${msg} (raise --timeout-s, or narrow the query with where run_id = … and a step range)`,
        { code: 'ERR_SQL', retriable: false, cause: err },
      );
    default:
      if (typeof e?.code === 'string' && /^[0-9A-Z]{5}$/.test(e.code))
        return new RlError(`${msg}${at}${hint} [SQLSTATE ${e.code}]`, { code: 'ERR_SQL', cause: err });
      return new RlError(`query failed on ${where}: ${msg}`, { code: 'ERR_SQL', cause: err });
  }
}

/** Runs one statement read-only and returns its columns and rows; the transaction is rolled back. */
export async function runReadOnlyQuery(
  database: Database,
  text: string,
  opts: ReadOnlyOptions = {},
): Promise<QueryResult> {
  if (text.trim().length === 0) throw new RlError('the query is empty', { code: 'ERR_SQL' });
  assertPlainRead(text); // a read-only transaction does not stop copy … to program, pg_read_file, lock in do $$ … $$
  const client = await database.pool.connect();
  let broken: Error | undefined;
  try {
    await client.query('begin transaction read only');
    try {
      const reader = await client.query<{ ok: boolean }>(
        `select to_regrole('${READER_ROLE}') is not null and pg_has_role(session_user, '${READER_ROLE}', 'MEMBER') as ok`,
      );
      if (reader.rows[0]?.ok) await client.query(`set local role ${READER_ROLE}`);
      await client.query(`set local lock_timeout = ${Math.max(1, Math.round((opts.lockTimeoutS ?? 5) * 1000))}`);
      if (opts.timeoutS && opts.timeoutS > 0) {
        await client.query(`set local statement_timeout = ${Math.max(1, Math.round(opts.timeoutS * 1000))}`);
      }
      const res = await client.query({
        text,
        values: opts.params ? [...opts.params] : [],
        rowMode: 'array',
        types: queryTypes,
        queryMode: 'extended',
      } as pg.QueryArrayConfig & { queryMode: 'extended' });
      return {
        columns: (res.fields ?? []).map((f) => ({ name: f.name, typeId: f.dataTypeID })),
        rows: (res.rows ?? []) as unknown[][],
        command: res.command ?? '',
      };
    } catch (e) {
      throw queryError(e, database.where);
    } finally {
      await client.query('rollback').catch((re: Error) => {
        broken = re;
      });
    }
  } finally {
    client.release(broken);
  }
}

/** The session's role when the connection is a PostgreSQL superuser (rlstream sql refuses it), else null. */
export async function superuserRole(database: Database): Promise<string | null> {
  if (database.kind !== 'postgres') return null;
  const r = await database.pool.query<{ u: string; s: boolean }>(
    'select session_user as u, (select rolsuper from pg_roles where rolname = session_user) as s',
  );
  return r.rows[0]?.s ? r.rows[0].u : null;
}

/** The views and tables a user can query, with their columns (for `rlstream sql --views`). */
export async function describeRelations(database: Database): Promise<QueryResult> {
  return runReadOnlyQuery(
    database,
    `
    select c.table_name as relation,
           case when t.table_type = 'VIEW' then 'view' else 'table' end as kind,
           string_agg(c.column_name, ', ' order by c.ordinal_position) as columns
    from information_schema.columns c
    join information_schema.tables t on t.table_schema = c.table_schema and t.table_name = c.table_name
    where c.table_schema = current_schema()
      and (c.table_name like 'v\\_%' or c.table_name in ('runs', 'trajectories', 'step_metrics', 'step_metric_parts', 'checkpoints', 'val_generations', 'dead_letters'))
    group by c.table_name, t.table_type
    order by (t.table_type <> 'VIEW'), c.table_name`,
  );
}

/** A read-only query's rows as objects keyed by column name (for programmatic readers). */
export async function queryObjects<T extends Record<string, unknown> = Record<string, any>>(
  database: Database,
  text: string,
  params: readonly unknown[] = [],
): Promise<T[]> {
  const res = await runReadOnlyQuery(database, text, { params });
  return res.rows.map((r) => Object.fromEntries(res.columns.map((c, i) => [c.name, r[i]])) as T);
}

/**
 * The run to analyse in a database: `requested` when given (it must exist), else the only run.
 * Several runs without `requested` is an error that lists them.
 */
export async function resolveRunId(database: Database, requested?: string): Promise<string> {
  const runs = await queryObjects<{ run_id: string; status: string }>(
    database,
    'select run_id, status from runs order by created_at desc, run_id',
  );
  if (requested !== undefined) {
    if (runs.some((r) => r.run_id === requested)) return requested;
    throw new RlError(
      `run ${JSON.stringify(requested)} is not in ${database.where}${
        runs.length
          ? `; runs there: ${runs
              .slice(0, 20)
              .map((r) => r.run_id)
              .join(', ')}${runs.length > 20 ? ', …' : ''}`
          : ' (it has no runs)'
      }`,
      { code: 'ERR_UNKNOWN_RUN' },
    );
  }
  if (runs.length === 1) return runs[0].run_id;
  if (runs.length === 0)
    throw new RlError(`${database.where} has no runs yet (the runs table is empty)`, { code: 'ERR_UNKNOWN_RUN' });
  throw new RlError(
    `${database.where} holds ${runs.length} runs; choose one with --run <run_id>: ${runs
      .slice(0, 20)
      .map((r) => r.run_id)
      .join(', ')}${runs.length > 20 ? ', …' : ''}`,
    { code: 'ERR_UNKNOWN_RUN' },
  );
}
