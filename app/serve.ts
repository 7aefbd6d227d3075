/**
 * `rlstream serve <stage>`: one pipeline stage as a long-lived cluster workload (a Kubernetes
 * Deployment per stage). Around the stage itself it provides:
 *
 *  - HTTP on --http-port (lib/http/health-server.ts): /healthz, /readyz (ready only when connected
 *    to bus and store, the migrations applied and the consumer joined to its group), /metrics
 *    (lib/metrics/prometheus.ts, fed with the values the stage writes to the store).
 *  - Migrations: over PostgreSQL the stage does not migrate; it waits (log line, /readyz 503) until
 *    `rlstream migrate` has applied every migration it needs (pipeline.migrate_on_start = true
 *    applies them itself, under the advisory lock).
 *  - SIGTERM (gracefulStop): stop fetching, abandon the batch in hand uncommitted (it is
 *    redelivered; processing is idempotent), leave the consumer group, close bus and store, exit 0 —
 *    within pipeline.grace_seconds; a second signal or the deadline exits at once (143). Every
 *    batch is committed as it finishes, so nothing done is lost and nothing half-done is kept.
 *  - The run's end (pipeline.on_run_end): `idle` (default) keeps the process up after the run
 *    completed or failed — also when it starts after that — releasing bus and store, saying so in
 *    the log, /readyz (503 "run completed") and `rlstream_run_finished{status}` = 1, so a Deployment
 *    does not restart it in a loop; `exit` returns (exit 0, or 1 when the run failed).
 */
import type { Logger } from 'pino';
import { openPipeline, type Pipeline } from '../lib/pipeline/runtime.ts';
import { redactSecrets, resolveRunId, type Config } from '../lib/config/index.ts';
import { startStage, type StartedStage } from '../services/index.ts';
import { RlError, errorMessage, isRetriable } from '../lib/errors.ts';
import { isConnectionError } from '../lib/db/errors.ts';
import { PrometheusTelemetry } from '../lib/metrics/prometheus.ts';
import { startHealthServer, type HealthServer } from '../lib/http/health-server.ts';
import { checkPythonReward } from '../lib/reward-fns/python-pool.ts';
import { checkStageMemory } from '../lib/checks/stage-memory.ts';
import { startHeartbeat, heartbeatOptions } from '../lib/pipeline/heartbeat.ts';
import { watchRun, checkDevices, openTensorBoard, refuseChangedConfig, type RunOutcome } from './run.ts';
import type { LiveTensorBoard } from '../lib/analysis/tensorboard-live.ts';

export interface ServeOptions {
  replica?: number;
  /** HTTP port of /healthz, /readyz, /metrics (0: any free port; null: no server). Default 9464. */
  httpPort?: number | null;
  /** Aborted on the first SIGTERM/SIGINT: stop gracefully (see gracefulStop). */
  signal?: AbortSignal;
  /** Told the HTTP server's port once it listens. */
  onListening?: (port: number) => void;
}

export const DEFAULT_HTTP_PORT = 9464;

/** Why the stage is not ready (null: ready); shown by /readyz. */
class ReadyState {
  reason: string | null = 'starting';
  joined: (() => boolean) | null = null;
  notReadyReason(): string | null {
    if (this.reason !== null) return this.reason;
    if (this.joined && !this.joined())
      return 'consumer not joined to its group (no partition assigned yet; a replica beyond pipeline.partitions never gets one)';
    return null;
  }
}

/**
 * The first SIGTERM/SIGINT aborts the returned signal (the stage stops gracefully); the deadline
 * `graceMs` later, or a second signal, exits the process at once with 143. The exit code of a
 * graceful stop is the caller's (0).
 */
export function gracefulStop(
  graceMs: number,
  log: Logger,
  exit: (code: number) => void = (c) => process.exit(c),
): AbortSignal {
  const ac = new AbortController();
  const onSignal = (sig: NodeJS.Signals) => {
    if (ac.signal.aborted) {
      log.warn(
        { signal: sig },
        `second ${sig}: exiting now (the batch in hand is not committed and will be redelivered)`,
      );
      exit(143);
      return;
    }
    log.info(
      { signal: sig, grace_s: graceMs / 1000 },
      `${sig}: stopping (stop fetching, abandon the batch in hand uncommitted, leave the consumer group, close bus and store); exiting at once after ${graceMs / 1000} s or on a second signal`,
    );
    ac.abort();
    setTimeout(() => {
      log.warn(
        { grace_s: graceMs / 1000 },
        `still stopping after ${graceMs / 1000} s: exiting now (nothing committed is lost; the batch in hand is redelivered)`,
      );
      exit(143);
    }, graceMs).unref();
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  return ac.signal;
}

/** Runs one stage until the run ends (then idles or returns, pipeline.on_run_end) or `signal` aborts. */
export async function serve(cfg: Config, stage: string, log: Logger, opts: ServeOptions = {}): Promise<RunOutcome> {
  const telemetry = new PrometheusTelemetry(resolveRunId(cfg), stage);
  const ready = new ReadyState();
  let server: HealthServer | null = null;
  const port = opts.httpPort === undefined ? DEFAULT_HTTP_PORT : opts.httpPort;
  if (port !== null) {
    try {
      server = await startHealthServer({ port, readiness: ready, metrics: telemetry });
    } catch (e) {
      throw new RlError(`cannot serve HTTP on port ${port} (${errorMessage(e)}); give another with --http-port`, {
        code: 'ERR_HTTP_PORT',
      });
    }
    log.info({ http_port: server.port }, `serving /healthz, /readyz and /metrics on port ${server.port}`);
    opts.onListening?.(server.port);
  }
  try {
    const outcome = await serveWithRetries(cfg, stage, log, opts, telemetry, ready);
    if (outcome.status === 'stopped' || cfg.pipeline.on_run_end === 'exit') return outcome;
    // the run is over: stay up, idle, saying so, until stopped (a Deployment restarts exited pods)
    telemetry.setFinished(outcome.status);
    telemetry.setReady(false);
    ready.reason = `run ${outcome.runId} ${outcome.status}${outcome.message ? `: ${outcome.message}` : ''}; this stage is idle (pipeline.on_run_end = idle)`;
    log.info(
      { status: outcome.status },
      `run ${outcome.runId} has ${outcome.status === 'completed' ? 'finished' : 'failed'}; ${stage} stays up idle until stopped (pipeline.on_run_end = idle; delete the Deployment, or start a new run)`,
    );
    if (!opts.signal?.aborted)
      await new Promise<void>((r) => opts.signal?.addEventListener('abort', () => r(), { once: true }));
    // stopped while idle: a graceful stop (exit 0) whatever the run's outcome, which the log, /readyz and the metric told
    return { ...outcome, status: 'stopped', message: `stopped while idle after the run ${outcome.status}` };
  } finally {
    await server?.close();
  }
}

/**
 * A stage that cannot start because the database or broker is unreachable (a PostgreSQL
 * restart) backs off and tries again, for about five minutes, instead of exiting.
 */
async function serveWithRetries(
  cfg: Config,
  stage: string,
  log: Logger,
  opts: ServeOptions,
  telemetry: PrometheusTelemetry,
  ready: ReadyState,
): Promise<RunOutcome> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await serveOnce(cfg, stage, log, opts, telemetry, ready);
    } catch (e) {
      if (opts.signal?.aborted && e instanceof StartError)
        return { status: 'stopped', message: 'interrupted', runId: resolveRunId(cfg), runDir: '' };
      if (e instanceof StartError && (isRetriable(e.cause) || isConnectionError(e.cause)) && attempt < 40) {
        const ms = Math.min(10_000, 250 * 2 ** attempt);
        ready.reason = `cannot start yet: ${errorMessage(e.cause)}`;
        log.warn(
          { stage, attempt, retry_in_ms: ms, err: e.cause },
          `${stage} cannot start yet (${errorMessage(e.cause)}); retrying`,
        );
        await new Promise<void>((r) => {
          const t = setTimeout(r, ms);
          opts.signal?.addEventListener(
            'abort',
            () => {
              clearTimeout(t);
              r();
            },
            { once: true },
          );
        });
        continue;
      }
      throw e instanceof StartError ? e.cause : e;
    }
  }
}

/** A failure before the stage consumed anything (opening the bus and store, starting the stage). */
class StartError extends Error {
  constructor(override readonly cause: unknown) {
    super(errorMessage(cause));
  }
}

async function serveOnce(
  cfg: Config,
  stage: string,
  log: Logger,
  opts: ServeOptions,
  telemetry: PrometheusTelemetry,
  ready: ReadyState,
): Promise<RunOutcome> {
  await checkDevices(cfg, [stage]);
  await checkStageMemory(cfg, stage); // the pod's memory limit against what the stage's model needs
  if (stage === 'reward') await checkPythonReward(cfg.reward);
  let p: Pipeline;
  ready.reason = 'connecting to bus and store';
  try {
    p = await openPipeline(cfg, {
      log,
      telemetry,
      clientId: `rlstream-${stage}-${opts.replica ?? 0}`,
      waitForMigrations: cfg.pipeline.migrate_on_start
        ? undefined
        : {
            signal: opts.signal,
            onWait: (pending) => {
              ready.reason = `waiting for migrations ${pending.join(', ')} (run \`rlstream migrate\`)`;
              log.info(
                { pending },
                `waiting for the database schema: ${pending.length} migration(s) not applied (${pending.join(', ')}); run \`rlstream migrate <config>\` (a Job or init container)`,
              );
            },
          },
    });
  } catch (e) {
    throw new StartError(e);
  }
  let tb: LiveTensorBoard | null = null;
  let s: StartedStage | null = null;
  // over PostgreSQL the stage holds a lease `rlstream runs` judges the run by (lib/pipeline/heartbeat.ts)
  const heartbeat = startHeartbeat(p.db, heartbeatOptions(cfg, p.runId, [stage], opts.replica ?? 0, log));
  let leftAs: { state: 'stopped' | 'done' | 'crashed'; error?: string } = { state: 'crashed' };
  try {
    try {
      if (stage === 'controller') await refuseChangedConfig(cfg, p);
      if (stage === 'controller')
        await p.store.upsertRun({
          runId: p.runId,
          project: cfg.trainer.project_name,
          experiment: cfg.trainer.experiment_name,
          config: redactSecrets(cfg) as never,
        });
      ready.reason = `starting the ${stage} stage`;
      s = await startStage(p, stage, { replica: opts.replica });
    } catch (e) {
      // a stage that cannot start for a reason no retry mends (bad weights, a missing model path, a
      // refused config) fails its run, with the reason, so `rlstream runs` and the report say so
      if (!(isRetriable(e) || isConnectionError(e)))
        await p.store.setRunStatus(p.runId, 'failed', { error: `${stage}: ${errorMessage(e)}` }).catch(() => undefined);
      throw new StartError(e);
    }
    const started = s;
    const topics = started.run.topics ?? [];
    telemetry.setLagSource({
      async lag() {
        const committed = new Map(
          (await started.run.consumer.committed()).map((c) => [`${c.topic}/${c.partition}`, c.offset]),
        );
        const out: Array<{ topic: string; partition: number; lag: number }> = [];
        for (const t of topics)
          (await p.bus.endOffsets(t)).forEach((end, partition) =>
            out.push({ topic: t, partition, lag: Math.max(0, end - (committed.get(`${t}/${partition}`) ?? 0)) }),
          );
        return out;
      },
    });
    ready.joined = () => started.run.consumer.assignment().length > 0;
    ready.reason = null;
    telemetry.setReady(true);
    log.info(
      { replica: opts.replica ?? 0 },
      `${stage} started: connected to bus and store, schema up to date; /readyz answers 200 once the consumer has joined its group`,
    );
    // distributed mode: the controller process (one per run) writes the TensorBoard files
    tb =
      stage === 'controller'
        ? await openTensorBoard(cfg, p, log, true).catch((e: unknown) => {
            log.warn({ err: e }, `tensorboard logger not started: ${errorMessage(e)}`);
            return null;
          })
        : null;
    const watch = watchRun(p, null, () => 0);
    const aborted = new Promise<RunOutcome>((r) => {
      const stop = () => r({ status: 'stopped', message: 'interrupted', runId: p.runId, runDir: p.runDir });
      if (opts.signal?.aborted) stop();
      else opts.signal?.addEventListener('abort', stop, { once: true });
    });
    const failed = started.run.done.then(
      () => new Promise<RunOutcome>(() => undefined),
      (e: unknown) => {
        throw new RlError(`${stage}: ${(e as Error).message}`, { cause: e });
      },
    );
    const outcome = await Promise.race([watch.outcome, aborted, failed]);
    leftAs = { state: outcome.status === 'stopped' ? 'stopped' : 'done' };
    // the controller registers the run (status running, also when it starts after the run's end):
    // the end its watcher saw is written back, so the row never says running for a run that ended
    if (stage === 'controller' && outcome.status !== 'stopped')
      await p.store
        .setRunStatus(
          p.runId,
          outcome.status,
          outcome.status === 'failed' ? { error: outcome.message ?? '' } : undefined,
        )
        .catch((e: unknown) => log.warn({ err: e }, `could not record the run's end: ${errorMessage(e)}`));
    ready.reason = outcome.status === 'stopped' ? 'stopping' : `run ${outcome.status}`;
    ready.joined = null;
    telemetry.setReady(false);
    await watch.stop();
    // stop fetching and leave the group; a batch in hand is abandoned uncommitted (redelivered)
    await started.run.consumer.stop().catch(() => undefined);
    await started.run.done.catch(() => undefined);
    await started.close();
    await tb
      ?.finish(outcome.status === 'completed')
      .catch((e: unknown) => log.warn({ err: e }, `tensorboard logger: ${errorMessage(e)}`));
    if (outcome.status === 'stopped') log.info(`${stage} stopped: consumer left its group, closing bus and store`);
    return outcome;
  } catch (e) {
    if (leftAs.state === 'crashed')
      leftAs = opts.signal?.aborted ? { state: 'stopped' } : { state: 'crashed', error: errorMessage(e) };
    throw e;
  } finally {
    telemetry.setLagSource(null);
    await tb?.finish(false).catch(() => undefined);
    await heartbeat.end(leftAs.state, leftAs.error);
    await p.close();
  }
}
