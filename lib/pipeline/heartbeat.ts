/**
 * A process's stage leases over PostgreSQL (table stage_heartbeats): one row per stage it runs,
 * renewed every pipeline.heartbeat_seconds by a timer, stamped with the database's clock (so pods'
 * clocks never matter), each with pipeline.lease_seconds as its lease. `rlstream runs` reads them
 * (lib/analysis/run-state.ts): a run whose every lease has run out is "stale".
 *
 * The stage's work never waits on it: a beat is one small upsert sent from the timer, skipped while
 * the previous one is still in flight, and a failed beat is logged (once until one succeeds) and
 * never thrown. `end` stops the timer, waits for a beat in flight and records how the stage left
 * (stopped on SIGTERM, done after its run ended, crashed with the error).
 */
import { hostname } from 'node:os';
import type { Logger } from 'pino';
import type { Database } from '../db/database.ts';
import { errorMessage } from '../errors.ts';
import type { LeaseState } from '../analysis/run-state.ts';
import type { Config } from '../config/index.ts';

export interface HeartbeatOptions {
  runId: string;
  /** The stages this process runs (one for `rlstream serve`, all five for `rlstream train`). */
  stages: readonly string[];
  replica: number;
  intervalMs: number;
  leaseMs: number;
  log: Logger;
  /** host:pid by default. */
  holder?: string;
}

export interface StageHeartbeat {
  /** Stops renewing and records how the stages left. */
  end(state: Exclude<LeaseState, 'running'>, error?: string): Promise<void>;
}

/** The heartbeat settings of `cfg` (pipeline.heartbeat_seconds, pipeline.lease_seconds). */
export function heartbeatOptions(
  cfg: Config,
  runId: string,
  stages: readonly string[],
  replica: number,
  log: Logger,
): HeartbeatOptions {
  return {
    runId,
    stages,
    replica,
    intervalMs: cfg.pipeline.heartbeat_seconds * 1000,
    leaseMs: cfg.pipeline.lease_seconds * 1000,
    log,
  };
}

/**
 * Starts renewing the leases of `opts.stages` on `database` (PostgreSQL; an embedded run directory
 * is held by its lock file instead, lib/db/lock-file.ts, and gets no rows).
 */
export function startHeartbeat(database: Database, opts: HeartbeatOptions): StageHeartbeat {
  if (database.kind !== 'postgres') return { end: async () => undefined };
  const holder = opts.holder ?? `${hostname()}:${process.pid}`;
  const rows = opts.stages.map((_, i) => `($1, $${i + 5}, $2, $3, 'running', now(), now(), $4, null)`).join(', ');
  const params = [opts.runId, opts.replica, holder, Math.round(opts.leaseMs), ...opts.stages];
  const upsert = `insert into stage_heartbeats (run_id, stage, replica, holder, state, started_at, heartbeat_at, lease_ms, error)
    values ${rows}
    on conflict (run_id, stage, replica) do update set
      started_at = case when stage_heartbeats.holder = excluded.holder and stage_heartbeats.state = 'running'
                        then stage_heartbeats.started_at else now() end,
      holder = excluded.holder, state = 'running', heartbeat_at = now(), lease_ms = excluded.lease_ms, error = null`;
  let inFlight: Promise<void> | null = null;
  let failing = false;
  let ended = false;
  const beat = () => {
    if (inFlight || ended) return;
    inFlight = database.pool
      .query(upsert, params)
      .then(
        () => {
          if (failing) opts.log.info('stage heartbeat renewed again');
          failing = false;
        },
        (e: unknown) => {
          if (!failing)
            opts.log.warn(
              { err: e },
              `stage heartbeat not written (${errorMessage(e)}); retrying every ${opts.intervalMs / 1000} s — \`rlstream runs\` shows the run stale if no stage renews its lease within ${opts.leaseMs / 1000} s`,
            );
          failing = true;
        },
      )
      .finally(() => {
        inFlight = null;
      });
  };
  beat();
  const timer = setInterval(beat, opts.intervalMs);
  timer.unref();
  return {
    async end(state, error) {
      if (ended) return;
      ended = true;
      clearInterval(timer);
      await inFlight;
      await database.pool
        .query(
          `update stage_heartbeats set state = $4, error = $5, heartbeat_at = now()
            where run_id = $1 and replica = $2 and holder = $3 and stage = any($6::text[])`,
          [opts.runId, opts.replica, holder, state, error?.slice(0, 2000) ?? null, [...opts.stages]],
        )
        .catch((e: unknown) =>
          opts.log.warn({ err: e }, `stage heartbeat: could not record "${state}": ${errorMessage(e)}`),
        );
    },
  };
}
