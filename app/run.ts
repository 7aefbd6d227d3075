/**
 * Running the pipeline: the embedded default (all five stages in this process over one PGlite);
 * one stage per process (`serve`) is app/serve.ts. A watcher follows the run's control and metrics topics to
 * drive the progress bar and to stop when the controller announces run_done (or run_failed).
 */
import type { Logger } from 'pino';
import { openPipeline, type Pipeline } from '../lib/pipeline/runtime.ts';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  formatResolvedConfig,
  redactSecrets,
  resumeConfigDiff,
  resumeConfigProblem,
  type Config,
} from '../lib/config/index.ts';
import { preflightProblems } from '../lib/config/preflight.ts';
import { startStage, STAGES, type StartedStage } from '../services/index.ts';
import {
  controlId,
  controlEvent,
  parseTopicName,
  type ControlEvent,
  type DeadLetter,
  type MetricsRecord,
} from '../lib/contracts/index.ts';
import { ProgressBar, formatTable } from '../lib/console/progress.ts';
import { StepLines } from '../lib/console/step-lines.ts';
import { ConfigError, errorMessage, isRetriable } from '../lib/errors.ts';
import { isConnectionError } from '../lib/db/errors.ts';
import { LiveTensorBoard, tensorboardDir } from '../lib/analysis/tensorboard-live.ts';
import { checkDevice, type Device } from '../lib/onnx/runtime.ts';
import { checkPythonReward } from '../lib/reward-fns/python-pool.ts';
import { checkStageMemory } from '../lib/checks/stage-memory.ts';
import type { RunRow } from '../lib/store/index.ts';
import { experienceScorerOptions, samplerOptions } from '../lib/pipeline/policy.ts';
import { startHeartbeat, heartbeatOptions, type StageHeartbeat } from '../lib/pipeline/heartbeat.ts';

export interface RunOutcome {
  status: 'completed' | 'failed' | 'stopped';
  message?: string;
  runId: string;
  runDir: string;
  finalVersion?: number;
}

interface Watch {
  outcome: Promise<RunOutcome>;
  stop(): Promise<void>;
}

/**
 * Why an embedded (PGlite) run stops when a stage dead-lettered one of its messages (see
 * watchRun): one it could not decode (a damaged log, or one written by another version), or one
 * its handler failed on (`attempts` > 0: the stage's own error, named as such).
 */
export function deadLetterFailure(
  d: Pick<DeadLetter, 'stage' | 'source_topic' | 'source_partition' | 'source_offset' | 'reason' | 'attempts'>,
  logical: string | null,
  runDir: string,
): string {
  const what = logical ? `a ${logical} message` : 'a message';
  const at = `${d.source_topic}[${d.source_partition}]@${d.source_offset}`;
  const kept = `The message is kept: rlstream sql ${runDir} "select * from v_dead_letters"`;
  const never =
    "Only this process writes the run's embedded log, so the message was the run's own and the step that needs it can never finish; the run stops instead of waiting.";
  if (d.attempts > 0) return `${d.stage} failed on ${what} (${at}) and dead-lettered it: ${d.reason}. ${never} ${kept}`;
  return (
    `${d.stage} could not read ${what} (${at}: ${d.reason}) and dead-lettered it. ${never} ` +
    `Was the run directory written by another rlstream version, or damaged? ${kept}`
  );
}

/**
 * Follows the run's control and metrics topics from their beginning (both have one partition) by
 * reading them without a consumer group, so a restarted or repeated command sees the whole run —
 * including a run_done that was published before it started. It reads only single-writer values
 * from the records (the update stage's step, the advantage stage's reward/mean, the controller's
 * val/accuracy); replicas' partial counters and timings are combined in the store
 * (lib/pipeline/metrics.ts), which the summary table reads. `onSettled` is called when a step's
 * update or a validation round has been recorded (the live TensorBoard logger syncs then).
 *
 * It also follows the dead-letter topic. Over PGlite only this process can write the run's log,
 * so a message a stage could not read was the run's own (a damaged database, or a log written by
 * another rlstream version): the step that needs it can never finish, and the run fails saying so
 * instead of waiting forever. Over PostgreSQL or Kafka anyone may append to the topics (the stage
 * dead-letters foreign or garbled messages and goes on), so there a dead letter is only logged by
 * the stage that wrote it.
 */
export function watchRun(
  p: Pipeline,
  bar: ProgressBar | null,
  totalSteps: () => number,
  onSettled?: () => void,
): Watch {
  let resolveOutcome!: (o: RunOutcome) => void;
  let settled = false;
  const outcome = new Promise<RunOutcome>((r) => {
    resolveOutcome = (o) => {
      settled = true;
      r(o);
    };
  });
  let reward: number | undefined,
    valAcc: number | undefined,
    step = 0;
  let stopped = false;
  const stepLines = new StepLines(totalSteps, Date.now());
  const pos = { control: 0, metrics: 0, deadletter: 0 };
  const ownLog = p.db.kind === 'pglite';
  let lost = 0; // consecutive reads that lost the database connection (PostgreSQL restarting, a terminated backend)
  const loop = (async () => {
    while (!stopped && !settled) {
      try {
        await watchOnce();
        lost = 0;
      } catch (e) {
        if (!(isRetriable(e) || isConnectionError(e))) throw e;
        const ms = Math.min(10_000, 100 * 2 ** Math.min(lost++, 7));
        p.log.warn({ err: e, retry_in_ms: ms }, `run watcher: ${errorMessage(e)}; retrying`);
        await new Promise((r) => setTimeout(r, ms));
      }
    }
  })();
  async function watchOnce(): Promise<void> {
    {
      let got = 0,
        settledSteps = 0;
      for (const m of await p.bus.read(p.topic('control'), 0, pos.control, 200)) {
        pos.control = m.offset + 1;
        got++;
        const c = (await p.codecs.control.decode(m.value, m.headers)) as ControlEvent;
        // an extended run has the run_done of its first end too: only the one at the current end counts
        if (c.type === 'run_done' && c.run_done.final_version >= totalSteps())
          resolveOutcome({
            status: 'completed',
            runId: p.runId,
            runDir: p.runDir,
            finalVersion: c.run_done.final_version,
          });
        if (c.type === 'run_failed')
          resolveOutcome({
            status: 'failed',
            message: `${c.run_failed.stage}: ${c.run_failed.message}`,
            runId: p.runId,
            runDir: p.runDir,
          });
      }
      for (const m of await p.bus.read(p.topic('metrics'), 0, pos.metrics, 500)) {
        pos.metrics = m.offset + 1;
        got++;
        const r = (await p.codecs.metrics.decode(m.value, m.headers)) as MetricsRecord;
        if (r.stage === 'update' && r.kind === 'train') {
          step = Math.max(step, r.step);
          settledSteps++;
        }
        if (r.kind === 'val') settledSteps++;
        if (r.values['reward/mean'] !== undefined && r.kind === 'train') reward = r.values['reward/mean'];
        if (r.values['val/accuracy'] !== undefined) valAcc = r.values['val/accuracy'];
        // off a terminal, one line per trained step in place of the bar
        const line = bar ? null : stepLines.add(r, Date.now());
        if (line) p.log.info({ step: line.step, ...line.fields }, line.text);
      }
      if (ownLog) {
        for (const m of await p.bus.read(p.topic('deadletter'), 0, pos.deadletter, 100)) {
          pos.deadletter = m.offset + 1;
          got++;
          const d = (await p.codecs.deadletter.decode(m.value, m.headers)) as DeadLetter;
          const logical = parseTopicName(p.cfg.pipeline.topic_prefix, p.runId, d.source_topic);
          resolveOutcome({
            status: 'failed',
            message: deadLetterFailure(d, logical, p.runDir),
            runId: p.runId,
            runDir: p.runDir,
          });
        }
      }
      if (settledSteps) onSettled?.();
      if (got) bar?.update({ step, totalSteps: totalSteps(), reward, valAccuracy: valAcc });
      else await new Promise((r) => setTimeout(r, 100));
    }
  }
  loop.catch((e) =>
    resolveOutcome({
      status: 'failed',
      message: `run watcher: ${(e as Error).message}`,
      runId: p.runId,
      runDir: p.runDir,
    }),
  );
  return {
    outcome,
    stop: async () => {
      stopped = true;
      await loop.catch(() => undefined);
    },
  };
}

/**
 * `trainer.logger` includes `tensorboard`: event files under `<run_dir>/tensorboard`, appended as
 * steps settle (lib/analysis/tensorboard-live.ts). Needs the run's row (upsertRun first).
 */
export async function openTensorBoard(
  cfg: Config,
  p: Pipeline,
  log: Logger,
  poll: boolean,
): Promise<LiveTensorBoard | null> {
  if (!cfg.trainer.logger.includes('tensorboard')) return null;
  return LiveTensorBoard.open(p.db.db, p.runId, tensorboardDir(p.runDir), {
    onError: (e) => log.warn({ err: e }, `tensorboard logger: ${errorMessage(e)}; retrying`),
    // rlstream train syncs it as its watcher sees steps settle; a served controller polls
    intervalMs: poll ? undefined : null,
  });
}

export async function summaryTable(p: Pipeline): Promise<string> {
  const ms = await p.store.getMetrics(p.runId, [
    'reward/mean',
    'val/accuracy',
    'val/reward_score',
    'actor/pg_loss',
    'actor/ppo_kl',
    'actor/entropy',
    'response_length/mean',
  ]);
  const by = (name: string) => ms.filter((m) => m.name === name).sort((a, b) => a.step - b.step);
  const rows: Array<Array<string | number>> = [['metric', 'first', 'last', 'best', 'steps']];
  for (const name of [
    'reward/mean',
    'val/accuracy',
    'val/reward_score',
    'actor/pg_loss',
    'actor/ppo_kl',
    'actor/entropy',
    'response_length/mean',
  ]) {
    const s = by(name);
    if (!s.length) continue;
    const best = name.startsWith('actor/') || name.startsWith('response') ? NaN : Math.max(...s.map((x) => x.value));
    rows.push([name, s[0].value, s[s.length - 1].value, Number.isNaN(best) ? '-' : best, s.length]);
  }
  const ck = await p.store.latestCheckpoint(p.runId);
  const n = await p.store.countTrajectories(p.runId);
  const lines = [formatTable(rows), '', `run ${p.runId}: ${n} trajectories in ${p.db.where}`];
  if (ck) lines.push(`final checkpoint: ${ck.path} (step ${ck.step}, sha256 ${ck.sha256})`);
  return lines.join('\n');
}

/**
 * Before a run that already has a row starts again: refuses a config whose changes give its stored
 * state another meaning (lib/config/checks.ts resumeConfigDiff), and answers "already complete"
 * for a finished run that the config does not extend.
 */
async function resumeCheck(
  cfg: Config,
  p: Pipeline,
  prev: RunRow | undefined,
): Promise<{ total: number; done?: RunOutcome; extendFrom?: number }> {
  const { planFromConfig, totalSteps } = await import('../lib/pipeline/plan.ts');
  const { loadRunData } = await import('../lib/pipeline/data.ts');
  const { tokenizerFor } = await import('../lib/pipeline/policy.ts');
  const data = await loadRunData(cfg, tokenizerFor(cfg));
  const total = totalSteps(planFromConfig(cfg, p.runId, data.train.length, data.val.length));
  // find_last_checkpoint=false or another load_checkpoint_path: the update stage refuses the existing state itself
  const storedLoad =
    (prev?.config as { trainer?: { load_checkpoint_path?: string | null } } | undefined)?.trainer
      ?.load_checkpoint_path ?? null;
  if (
    prev?.status !== 'completed' ||
    !cfg.trainer.find_last_checkpoint ||
    storedLoad !== cfg.trainer.load_checkpoint_path
  )
    return { total };
  const last = (await p.store.latestCheckpoint(p.runId))?.step ?? 0;
  if (total > last) return { total, extendFrom: last };
  return {
    total,
    done: {
      status: 'completed',
      message: `run ${p.runId} already complete (step ${last}); nothing to do — raise trainer.total_epochs or trainer.max_steps to train further`,
      runId: p.runId,
      runDir: p.runDir,
      finalVersion: last,
    },
  };
}

/** Refuses a run started again with a config that changes what its stored state means; returns its row. */
export async function refuseChangedConfig(cfg: Config, p: Pipeline): Promise<RunRow | undefined> {
  const prev = await p.store.getRun(p.runId);
  // a start that failed before its first step stored nothing the new config could misread
  if (prev && (await madeProgress(p))) {
    const problem = resumeConfigProblem(
      p.runId,
      resumeConfigDiff(prev.config, cfg),
      cfg.trainer.resume_with_changed_config,
    );
    if (problem) throw new ConfigError(problem);
  }
  return prev;
}

/** `p`'s value, or 'timeout' after `ms` (the timer never keeps the process alive). */
async function settlesWithin<T>(p: Promise<T>, ms: number): Promise<T | 'timeout'> {
  let t: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<'timeout'>((r) => {
        t = setTimeout(() => r('timeout'), ms);
      }),
    ]);
  } finally {
    clearTimeout(t);
  }
}

/** Whether a run has stored anything its config gives a meaning to: a trajectory or a checkpoint. */
async function madeProgress(p: Pipeline): Promise<boolean> {
  return (await p.store.countTrajectories(p.runId)) > 0 || (await p.store.latestCheckpoint(p.runId)) !== undefined;
}

/** The control event that tells the controller a finished run goes on to `total` steps. */
function extendEvent(runId: string, from: number, total: number, seed: number): ControlEvent {
  return controlEvent(
    'run_started',
    { config_json: '{}', config_sha256: '', seed, total_steps: total, steps_per_epoch: 0, resumed_from: null },
    {
      run_id: runId,
      id: controlId(runId, 'run_started', `extend-${total}`),
      step: from,
      policy_version: from,
      time_ms: Date.now(),
    },
  );
}

/** Trains in one process (all stages); resolves when the run is done or failed. */
export async function trainEmbedded(
  cfg: Config,
  log: Logger,
  opts: { progress?: boolean | ProgressBar; signal?: AbortSignal; breakLock?: boolean } = {},
): Promise<RunOutcome & { summary: string }> {
  await checkDevices(cfg, ['rollout', 'advantage', 'update']); // before opening anything
  // missing or partial inputs, an unwritable run directory: refused before anything is created
  const problems = await preflightProblems(cfg);
  if (problems.length) throw new ConfigError(problems.join('\n'), { problems });
  await checkStageMemory(cfg, 'embedded'); // a cgroup memory limit below what the model needs
  await checkPythonReward(cfg.reward);
  // start-up says what it is doing: a log line each, and on a terminal the bar's text until step 1
  const phase = (what: string) => {
    log.info({ phase: what }, what);
    if (opts.progress instanceof ProgressBar) opts.progress.update({ phase: what });
  };
  phase(`opening the store (${cfg.pipeline.store === 'postgres' ? 'PostgreSQL' : `embedded, ${cfg.trainer.run_dir}`})`);
  const p = await openPipeline(cfg, { log, breakLock: opts.breakLock });
  const stages: StartedStage[] = [];
  let tb: LiveTensorBoard | null = null;
  let started = false;
  let heartbeat: StageHeartbeat | null = null;
  // how this process leaves its stages' leases: stopped (SIGTERM, Ctrl-C) or done (the run ended, or failed here)
  let leftAs: 'stopped' | 'done' = 'done';
  const upsertRun = () =>
    p.store.upsertRun({
      runId: p.runId,
      project: cfg.trainer.project_name,
      experiment: cfg.trainer.experiment_name,
      config: redactSecrets(cfg) as never,
    });
  // a resume whose config changed the meaning of the stored state is refused before anything is written
  let prev: RunRow | undefined;
  try {
    prev = await refuseChangedConfig(cfg, p);
  } catch (e) {
    await p.close();
    throw e;
  }
  try {
    let resume: Awaited<ReturnType<typeof resumeCheck>>;
    try {
      resume = await resumeCheck(cfg, p, prev);
    } catch (e) {
      // the data or the model directory cannot be read (bad weights, a missing model path): the run is failed with its reason
      if (prev?.status !== 'completed') {
        await upsertRun().catch(() => undefined);
        started = true;
      }
      throw e;
    }
    if (resume.done) return { ...resume.done, summary: await summaryTable(p) };
    await upsertRun();
    started = true;
    // over PostgreSQL this process holds the five stages' leases (an embedded run directory: its lock file)
    heartbeat = startHeartbeat(p.db, heartbeatOptions(cfg, p.runId, STAGES, 0, log));
    // the resolved config of this run, secrets redacted (rlstream train --print-config also prints it)
    writeFileSync(join(p.runDir, 'config.yaml'), formatResolvedConfig(cfg));
    tb = await openTensorBoard(cfg, p, log, false);
    // the CLI passes its bar (the logger prints above it); true: a bar on stderr
    const bar = opts.progress instanceof ProgressBar ? opts.progress : opts.progress ? new ProgressBar() : null;
    const total = resume.total;
    const watch = watchRun(
      p,
      bar,
      () => total,
      () => {
        void tb?.sync().catch((e: unknown) => log.warn({ err: e }, `tensorboard logger: ${errorMessage(e)}; retrying`));
      },
    );
    // update first: it publishes policy version 0 the controller waits for
    bar?.update({ step: 0, totalSteps: total });
    for (const name of ['update', ...STAGES.filter((s) => s !== 'update')]) {
      phase(
        name === 'update'
          ? `loading the model${cfg.actor.model.path ? ` from ${cfg.actor.model.path}` : ''} and opening the trainer`
          : `starting the ${name} stage`,
      );
      // one process runs every stage: the rollout takes new versions from memory (policy.version_files)
      stages.push(await startStage(p, name, { rolloutInProcess: true }));
    }
    phase('sampling step 1 (the first batch builds the ONNX sessions)');
    if (resume.extendFrom !== undefined) {
      // a finished run given more steps: the controller goes on from its last policy version
      log.info(
        { from_step: resume.extendFrom, total_steps: total },
        `run ${p.runId} was complete at step ${resume.extendFrom}; extending it to step ${total}`,
      );
      await p.bus.produce([p.message('control', extendEvent(p.runId, resume.extendFrom, total, cfg.data.seed))]);
    }
    const failures = stages.map((s) =>
      s.run.done.then(
        () => null,
        (e: unknown) => ({
          status: 'failed' as const,
          message: `${s.name}: ${(e as Error).message}`,
          runId: p.runId,
          runDir: p.runDir,
        }),
      ),
    );
    const aborted = new Promise<RunOutcome>((r) => {
      const stop = () => r({ status: 'stopped', message: 'interrupted', runId: p.runId, runDir: p.runDir });
      if (opts.signal?.aborted) stop();
      else opts.signal?.addEventListener('abort', stop, { once: true });
    });
    const outcome = await Promise.race([
      watch.outcome,
      aborted,
      ...failures.map((f) => f.then((x) => x ?? new Promise<RunOutcome>(() => undefined))),
    ]);
    // its last round draws the bar's final state; on PGlite that round waits for the only
    // connection, which a stage in the middle of a batch holds: interrupted, the stages are
    // stopped alongside
    const watchStopped = watch.stop();
    if (outcome.status !== 'stopped') await watchStopped;
    // stop every stage at once: on PGlite a stage in the middle of a batch holds the only connection
    const stopped = Promise.all(stages.map((s) => s.run.consumer.stop().catch(() => undefined))).then(() =>
      Promise.all(stages.map((s) => s.run.done.catch(() => undefined))),
    );
    // interrupted: a stage still busy after half the grace period (a reward batch retrying against
    // failing servers) has its backend closed under it, which abandons the batch uncommitted (it is
    // redelivered on resume), so the run is marked stopped and closed within pipeline.grace_seconds
    const graceMs = cfg.pipeline.grace_seconds * 1000;
    if (outcome.status === 'stopped' && (await settlesWithin(stopped, graceMs / 2)) === 'timeout') {
      log.warn(
        { grace_s: cfg.pipeline.grace_seconds },
        `stopping: a stage is still in the middle of a batch after ${graceMs / 2000} s; abandoning it uncommitted (the same command redoes it)`,
      );
      for (const s of stages) await s.close().catch(() => undefined);
      await settlesWithin(stopped, graceMs / 4);
    } else {
      await stopped;
      for (const s of stages) await s.close().catch(() => undefined);
    }
    if (outcome.status === 'stopped') await settlesWithin(watchStopped, graceMs / 8);
    bar?.finish();
    if (outcome.status === 'stopped') leftAs = 'stopped';
    // stopped (SIGTERM, Ctrl-C): the same command resumes it; the row says so instead of "running"
    await p.store
      .setRunStatus(p.runId, outcome.status, outcome.status === 'failed' ? { error: outcome.message ?? '' } : undefined)
      .catch(() => undefined);
    await tb
      ?.finish(outcome.status === 'completed')
      .catch((e: unknown) => log.warn({ err: e }, `tensorboard logger: ${errorMessage(e)}`));
    const summary = await summaryTable(p);
    return { ...outcome, summary };
  } catch (e) {
    // a run that fails at start (bad weights, a missing model path) is marked failed with its reason
    for (const s of stages) {
      await s.run.consumer.stop().catch(() => undefined);
      await s.close().catch(() => undefined);
    }
    if (started) await p.store.setRunStatus(p.runId, 'failed', { error: errorMessage(e) }).catch(() => undefined);
    throw e;
  } finally {
    await tb?.finish(false).catch(() => undefined);
    await heartbeat?.end(leftAs);
    await p.close();
  }
}

/**
 * Stops before a run opens anything when a stage's onnxruntime device cannot start here: the
 * experience and training sessions (advantage, update) run on actor.device, the rollout's sampler
 * on rollout.device ?? actor.device. Each device is checked once, named by the setting that chose it.
 */
export async function checkDevices(cfg: Config, stages: readonly string[]): Promise<void> {
  const wanted = new Map<Device, string>();
  if (stages.includes('advantage') || stages.includes('update'))
    wanted.set(experienceScorerOptions(cfg).device, 'actor.device');
  const sampling = samplerOptions(cfg).device;
  if (stages.includes('rollout') && !wanted.has(sampling))
    wanted.set(sampling, cfg.rollout.device ? 'rollout.device' : 'actor.device');
  for (const [device, setting] of wanted) await checkDevice(device, setting);
}
