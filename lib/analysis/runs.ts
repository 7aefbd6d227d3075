/**
 * Listing runs (`rlstream runs`): every subdirectory of a runs directory that holds an embedded
 * store (`<dir>/db/pgdata`), or every row of `runs` in a PostgreSQL. Each row comes from the v_runs
 * view. A run directory held by a live process (its lock file names a running PID) is read from the
 * holder's snapshot (or listed as "in use (PID n)" instead of failing the whole listing); a row
 * still "running" in a directory no live process holds (a SIGKILLed or crashed run) is "stale"; a
 * run stored as "completed" is shown as "finished". A run over PostgreSQL is judged by its stages'
 * heartbeats (stage_heartbeats; the rule is lib/analysis/run-state.ts): still "running" with every
 * stage's lease run out is "stale", with every stage stopped on SIGTERM "stopped".
 */
import { existsSync, lstatSync, readdirSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { Database } from '../db/database.ts';
import { openDatabaseOrSnapshot } from './target.ts';
import { RlError, errorMessage } from '../errors.ts';
import { lockHolder } from '../db/lock-file.ts';
import { runReadOnlyQuery } from './query.ts';
import { runState, shownStatus, stagesText, LEASE_STATES, type StageLease, type StageView } from './run-state.ts';

export { shownStatus };

export interface RunSummary {
  /** Run directory (embedded) or null (PostgreSQL). */
  dir: string | null;
  runId: string | null;
  project: string | null;
  experiment: string | null;
  status: string;
  parentRunId: string | null;
  steps: number | null;
  lastStep: number | null;
  finalRewardMean: number | null;
  bestValAccuracy: number | null;
  bestValStep: number | null;
  checkpoints: number | null;
  lastCheckpointStep: number | null;
  trajectories: number | null;
  deadLetters: number | null;
  createdAt: string | null;
  updatedAt: string | null;
  /** Bytes of the policy, critic and EMA versions the run's policy store holds now (its manifest). */
  versionsBytes: number | null;
  /** Bytes under the run directory (embedded listing; a hard-linked file counted once), else null. */
  dirBytes: number | null;
  /** A failed run's stored reason (runs.summary.error), else null. */
  error: string | null;
  /** Over PostgreSQL: each stage's (and replica's) lease, from stage_heartbeats; empty without rows. */
  stages: StageView[];
  /** Why the run could not be read (locked, corrupt), when status says so. */
  note?: string;
}

const RUN_COLUMNS = `v.run_id, v.project, v.experiment, v.status, v.parent_run_id, v.steps, v.last_step, v.final_reward_mean,
  v.best_val_accuracy, v.best_val_step, v.checkpoints, v.last_checkpoint_step, v.trajectories, v.dead_letters,
  to_char(v.created_at at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS') as created_at,
  to_char(v.updated_at at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS') as updated_at,
  case when v.status = 'failed' then r.summary->>'error' end as error,
  (select sum(f.size_bytes) from policy_files f where f.run_id = v.run_id) as versions_bytes`;

function toSummary(dir: string | null, cols: string[], row: unknown[]): RunSummary {
  const r = Object.fromEntries(cols.map((c, i) => [c, row[i]])) as Record<string, any>;
  const num = (v: unknown) => (v === null || v === undefined ? null : Number(v));
  return {
    dir,
    runId: r.run_id,
    project: r.project,
    experiment: r.experiment,
    status: shownStatus(r.status),
    parentRunId: r.parent_run_id,
    steps: num(r.steps),
    lastStep: num(r.last_step),
    finalRewardMean: num(r.final_reward_mean),
    bestValAccuracy: num(r.best_val_accuracy),
    bestValStep: num(r.best_val_step),
    checkpoints: num(r.checkpoints),
    lastCheckpointStep: num(r.last_checkpoint_step),
    trajectories: num(r.trajectories),
    deadLetters: num(r.dead_letters),
    createdAt: r.created_at,
    updatedAt: r.updated_at,
    versionsBytes: num(r.versions_bytes),
    dirBytes: null,
    error: r.error ?? null,
    stages: [],
  };
}

/** Runs of an open database, newest first (optionally only `runId`). */
export async function listRunsInDatabase(
  database: Database,
  dir: string | null = null,
  runId?: string,
): Promise<RunSummary[]> {
  const res = await runReadOnlyQuery(
    database,
    `select ${RUN_COLUMNS} from v_runs v join runs r on r.run_id = v.run_id ${runId !== undefined ? 'where v.run_id = $1' : ''} order by v.created_at desc, v.run_id`,
    { params: runId !== undefined ? [runId] : [] },
  );
  const runs = res.rows.map((row) =>
    toSummary(
      dir,
      res.columns.map((c) => c.name),
      row,
    ),
  );
  await applyLeases(database, runs, runId);
  return runs;
}

/**
 * Judges each run by its stages' heartbeats (run-state.ts), with the database's clock. A database
 * migrated before stage_heartbeats existed has no leases to judge by: its rows stay as stored.
 */
async function applyLeases(database: Database, runs: RunSummary[], runId?: string): Promise<void> {
  if (runs.length === 0) return;
  const res = await runReadOnlyQuery(
    database,
    `select (extract(epoch from now()) * 1000)::float8 as now_ms, to_regclass('stage_heartbeats') is not null as has_table`,
  );
  const [nowMs, hasTable] = res.rows[0] as [number, boolean];
  if (!hasTable) return;
  const leases = await runReadOnlyQuery(
    database,
    `select run_id, stage, replica, holder, state, (extract(epoch from heartbeat_at) * 1000)::float8 as heartbeat_ms, lease_ms, error
       from stage_heartbeats ${runId !== undefined ? 'where run_id = $1' : ''}`,
    { params: runId !== undefined ? [runId] : [] },
  );
  const byRun = new Map<string, StageLease[]>();
  for (const [rid, stage, replica, holder, state, hb, leaseMs, error] of leases.rows as Array<
    [string, string, number, string, string, number, number, string | null]
  >) {
    if (!(LEASE_STATES as readonly string[]).includes(state)) continue;
    const l: StageLease = {
      stage,
      replica: Number(replica),
      holder,
      state: state as StageLease['state'],
      heartbeatAtMs: Number(hb),
      leaseMs: Number(leaseMs),
      error,
    };
    byRun.set(rid, [...(byRun.get(rid) ?? []), l]);
  }
  for (const r of runs) {
    const leased = byRun.get(r.runId ?? '');
    if (!leased) continue;
    // the stored status, before display (finished is stored as completed)
    const v = runState(r.status === 'finished' ? 'completed' : r.status, leased, Number(nowMs));
    r.status = v.status;
    r.stages = v.stages;
    if (v.note) r.note = v.note;
  }
}

/** The stages column of `rlstream runs --db`: each stage's liveness (null without heartbeat rows). */
export { stagesText };

function emptySummary(dir: string, status: string, note: string): RunSummary {
  return {
    dir,
    runId: null,
    project: null,
    experiment: null,
    status,
    parentRunId: null,
    steps: null,
    lastStep: null,
    finalRewardMean: null,
    bestValAccuracy: null,
    bestValStep: null,
    checkpoints: null,
    lastCheckpointStep: null,
    trajectories: null,
    deadLetters: null,
    createdAt: null,
    updatedAt: null,
    versionsBytes: null,
    dirBytes: null,
    error: null,
    stages: [],
    note,
  };
}

/** Run directories under `runsDir` (subdirectories with a db/pgdata/), sorted by name. */
export function findRunDirs(runsDir: string): string[] {
  const abs = resolve(runsDir);
  if (!existsSync(abs) || !statSync(abs).isDirectory()) {
    throw new RlError(
      `no runs directory at ${abs}; pass --runs-dir DIR (the parent of the run directories) or --db postgres://…`,
      { code: 'ERR_NO_RUN' },
    );
  }
  return readdirSync(abs)
    .sort()
    .map((name) => join(abs, name))
    .filter(
      (d) =>
        statSync(d).isDirectory() &&
        (existsSync(join(d, 'db', 'pgdata', 'PG_VERSION')) || existsSync(join(d, 'pgdata', 'PG_VERSION'))),
    );
}

/**
 * Opens each run directory in turn (one PGlite at a time) and summarises its runs. A directory
 * that cannot be opened is listed with its reason instead of failing the listing.
 */
export async function listRunsInDir(runsDir: string): Promise<RunSummary[]> {
  const out: RunSummary[] = [];
  for (const dir of findRunDirs(runsDir)) {
    let database: Database | undefined;
    try {
      const dbDir = existsSync(join(dir, 'db', 'pgdata', 'PG_VERSION')) ? join(dir, 'db') : dir;
      const holder = lockHolder(dbDir);
      let live = false;
      database = await openDatabaseOrSnapshot({ kind: 'pglite', dir: dbDir }, { onSnapshot: () => (live = true) });
      const runs = await listRunsInDatabase(database, dir);
      const bytes = directoryBytes(dir);
      for (const r of runs) r.dirBytes = bytes;
      // opened directly: no process holds the directory, so a row still "running" lost its process
      if (!live)
        for (const r of runs)
          if (r.status === 'running') {
            r.status = 'stale';
            r.note = `still marked running, but ${holder ? `its process (PID ${holder.pid}${holder.since ? `, since ${holder.since}` : ''}) is gone` : 'no process holds its run directory'} (killed?); run the same command again to resume it`;
          }
      out.push(...(runs.length ? runs : [emptySummary(dir, 'empty', 'the store has no run row yet')]));
    } catch (e) {
      const err = e as RlError;
      if (err?.code === 'ERR_LOCKED') {
        const pid = (err.details as { pid?: number } | undefined)?.pid;
        out.push(emptySummary(dir, pid ? `in use (PID ${pid})` : 'in use', errorMessage(e)));
      } else {
        out.push(emptySummary(dir, 'unreadable', errorMessage(e)));
      }
    } finally {
      await database?.close();
    }
  }
  return out;
}

/** Bytes of the regular files under `dir`, each inode once (checkpoints hard-link their versions' files). */
export function directoryBytes(dir: string): number {
  const seen = new Set<string>();
  let total = 0;
  const walk = (d: string): void => {
    let names: string[];
    try {
      names = readdirSync(d);
    } catch {
      return; // removed while listing (a pruned version)
    }
    for (const n of names) {
      const p = join(d, n);
      let st;
      try {
        st = lstatSync(p);
      } catch {
        continue;
      }
      if (st.isDirectory()) walk(p);
      else if (st.isFile() && !seen.has(`${st.dev}:${st.ino}`)) {
        seen.add(`${st.dev}:${st.ino}`);
        total += st.size;
      }
    }
  };
  walk(dir);
  return total;
}
