/**
 * Running the pipeline: the embedded default (all five stages in this process over one PGlite);
 * one stage per process (`serve`) is lib/app/serve.ts. A watcher follows the run's control and metrics topics to
 * drive the progress bar and to stop when the controller announces run_done (or run_failed).
 */
import type { Logger } from 'pino';
import { openPipeline, type Pipeline } from '../pipeline/runtime.ts';
import { redactSecrets, type Config } from '../config/index.ts';
import { startStage, STAGES, type StartedStage } from '../../services/index.ts';
import { parseTopicName, type ControlEvent, type DeadLetter, type MetricsRecord } from '../contracts/index.ts';
import { ProgressBar, formatTable } from '../cli/progress.ts';
import { errorMessage } from '../errors.ts';
import { LiveTensorBoard, tensorboardDir } from '../analysis/tensorboard-live.ts';
import { checkDevice, type Device } from '../onnx/runtime.ts';
import { experienceScorerOptions, samplerOptions } from '../pipeline/policy.ts';

export interface RunOutcome { status: 'completed' | 'failed' | 'stopped'; message?: string; runId: string; runDir: string; finalVersion?: number }

interface Watch { outcome: Promise<RunOutcome>; stop(): Promise<void> }

/** Why an embedded (PGlite) run stops when a stage dead-lettered one of its messages (see watchRun). */
export function deadLetterFailure(d: Pick<DeadLetter, 'stage' | 'source_topic' | 'source_partition' | 'source_offset' | 'reason'>, logical: string | null, runDir: string): string {
  return `${d.stage} could not read ${logical ? `a ${logical} message` : 'a message'} (${d.source_topic}[${d.source_partition}]@${d.source_offset}: ${d.reason}) and dead-lettered it. ` +
    'Only this process writes the run\'s embedded log, so the message was the run\'s own and the step that needs it can never finish; the run stops instead of waiting. ' +
    `Was the run directory written by another rlstream version, or damaged? The message is kept: rlstream sql ${runDir} "select * from v_dead_letters"`;
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
export function watchRun(p: Pipeline, bar: ProgressBar | null, totalSteps: () => number, onSettled?: () => void): Watch {
  let resolveOutcome!: (o: RunOutcome) => void;
  let settled = false;
  const outcome = new Promise<RunOutcome>((r) => { resolveOutcome = (o) => { settled = true; r(o); }; });
  let reward: number | undefined, valAcc: number | undefined, step = 0;
  let stopped = false;
  const pos = { control: 0, metrics: 0, deadletter: 0 };
  const ownLog = p.db.kind === 'pglite';
  const loop = (async () => {
    while (!stopped && !settled) {
      let got = 0, settledSteps = 0;
      for (const m of await p.bus.read(p.topic('control'), 0, pos.control, 200)) {
        pos.control = m.offset + 1; got++;
        const c = (await p.codecs.control.decode(m.value, m.headers)) as ControlEvent;
        if (c.type === 'run_done') resolveOutcome({ status: 'completed', runId: p.runId, runDir: p.runDir, finalVersion: c.run_done.final_version });
        if (c.type === 'run_failed') resolveOutcome({ status: 'failed', message: `${c.run_failed.stage}: ${c.run_failed.message}`, runId: p.runId, runDir: p.runDir });
      }
      for (const m of await p.bus.read(p.topic('metrics'), 0, pos.metrics, 500)) {
        pos.metrics = m.offset + 1; got++;
        const r = (await p.codecs.metrics.decode(m.value, m.headers)) as MetricsRecord;
        if (r.stage === 'update' && r.kind === 'train') { step = Math.max(step, r.step); settledSteps++; }
        if (r.kind === 'val') settledSteps++;
        if (r.values['reward/mean'] !== undefined && r.kind === 'train') reward = r.values['reward/mean'];
        if (r.values['val/accuracy'] !== undefined) valAcc = r.values['val/accuracy'];
      }
      if (ownLog) {
        for (const m of await p.bus.read(p.topic('deadletter'), 0, pos.deadletter, 100)) {
          pos.deadletter = m.offset + 1; got++;
          const d = (await p.codecs.deadletter.decode(m.value, m.headers)) as DeadLetter;
          const logical = parseTopicName(p.cfg.pipeline.topic_prefix, p.runId, d.source_topic);
          resolveOutcome({ status: 'failed', message: deadLetterFailure(d, logical, p.runDir), runId: p.runId, runDir: p.runDir });
        }
      }
      if (settledSteps) onSettled?.();
      if (got) bar?.update({ step, totalSteps: totalSteps(), reward, valAccuracy: valAcc });
      else await new Promise((r) => setTimeout(r, 100));
    }
  })();
  loop.catch((e) => resolveOutcome({ status: 'failed', message: `run watcher: ${(e as Error).message}`, runId: p.runId, runDir: p.runDir }));
  return { outcome, stop: async () => { stopped = true; await loop.catch(() => undefined); } };
}

/**
 * `trainer.logger` includes `tensorboard`: event files under `<run_dir>/tensorboard`, appended as
 * steps settle (lib/analysis/tensorboard-live.ts). Needs the run's row (upsertRun first).
 */
export async function openTensorBoard(cfg: Config, p: Pipeline, log: Logger, poll: boolean): Promise<LiveTensorBoard | null> {
  if (!cfg.trainer.logger.includes('tensorboard')) return null;
  return LiveTensorBoard.open(p.db.db, p.runId, tensorboardDir(p.runDir), {
    onError: (e) => log.warn({ err: e }, `tensorboard logger: ${errorMessage(e)}; retrying`),
    // rlstream train syncs it as its watcher sees steps settle; a served controller polls
    intervalMs: poll ? undefined : null,
  });
}

export async function summaryTable(p: Pipeline): Promise<string> {
  const ms = await p.store.getMetrics(p.runId, ['reward/mean', 'val/accuracy', 'val/reward_score', 'actor/pg_loss', 'actor/ppo_kl', 'actor/entropy', 'response_length/mean']);
  const by = (name: string) => ms.filter((m) => m.name === name).sort((a, b) => a.step - b.step);
  const rows: Array<Array<string | number>> = [['metric', 'first', 'last', 'best', 'steps']];
  for (const name of ['reward/mean', 'val/accuracy', 'val/reward_score', 'actor/pg_loss', 'actor/ppo_kl', 'actor/entropy', 'response_length/mean']) {
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

/** Trains in one process (all stages); resolves when the run is done or failed. */
export async function trainEmbedded(cfg: Config, log: Logger, opts: { progress?: boolean; signal?: AbortSignal } = {}): Promise<RunOutcome & { summary: string }> {
  await checkDevices(cfg, ['rollout', 'advantage', 'update']); // before opening anything
  const p = await openPipeline(cfg, { log });
  const stages: StartedStage[] = [];
  let tb: LiveTensorBoard | null = null;
  try {
    await p.store.upsertRun({ runId: p.runId, project: cfg.trainer.project_name, experiment: cfg.trainer.experiment_name, config: redactSecrets(cfg) as never });
    tb = await openTensorBoard(cfg, p, log, false);
    const bar = opts.progress ? new ProgressBar() : null;
    let total = 0;
    const watch = watchRun(p, bar, () => total, () => {
      void tb?.sync().catch((e: unknown) => log.warn({ err: e }, `tensorboard logger: ${errorMessage(e)}; retrying`));
    });
    // update first: it publishes policy version 0 the controller waits for
    for (const name of ['update', ...STAGES.filter((s) => s !== 'update')]) stages.push(await startStage(p, name));
    const { planFromConfig, totalSteps } = await import('../pipeline/plan.ts');
    const { loadRunData } = await import('../pipeline/data.ts');
    const { tokenizerFor } = await import('../pipeline/policy.ts');
    const data = await loadRunData(cfg, tokenizerFor(cfg));
    total = totalSteps(planFromConfig(cfg, p.runId, data.train.length, data.val.length));
    const failures = stages.map((s) => s.run.done.then(() => null, (e: unknown) => ({ status: 'failed' as const, message: `${s.name}: ${(e as Error).message}`, runId: p.runId, runDir: p.runDir })));
    const aborted = new Promise<RunOutcome>((r) => {
      const stop = () => r({ status: 'stopped', message: 'interrupted', runId: p.runId, runDir: p.runDir });
      if (opts.signal?.aborted) stop(); else opts.signal?.addEventListener('abort', stop, { once: true });
    });
    const outcome = await Promise.race([watch.outcome, aborted, ...failures.map((f) => f.then((x) => x ?? new Promise<RunOutcome>(() => undefined)))]);
    bar?.finish();
    await watch.stop();
    // stop every stage at once: on PGlite a stage in the middle of a batch holds the only connection
    await Promise.all(stages.map((s) => s.run.consumer.stop().catch(() => undefined)));
    await Promise.all(stages.map((s) => s.run.done.catch(() => undefined)));
    for (const s of stages) await s.close().catch(() => undefined);
    if (outcome.status !== 'stopped') await p.store.setRunStatus(p.runId, outcome.status, outcome.status === 'failed' ? { error: outcome.message ?? '' } : undefined).catch(() => undefined);
    await tb?.finish(outcome.status === 'completed').catch((e: unknown) => log.warn({ err: e }, `tensorboard logger: ${errorMessage(e)}`));
    const summary = await summaryTable(p);
    return { ...outcome, summary };
  } finally {
    await tb?.finish(false).catch(() => undefined);
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
  if (stages.includes('advantage') || stages.includes('update')) wanted.set(experienceScorerOptions(cfg).device, 'actor.device');
  const sampling = samplerOptions(cfg).device;
  if (stages.includes('rollout') && !wanted.has(sampling)) wanted.set(sampling, cfg.rollout.device ? 'rollout.device' : 'actor.device');
  for (const [device, setting] of wanted) await checkDevice(device, setting);
}
