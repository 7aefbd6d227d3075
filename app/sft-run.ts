/**
 * The run around `rlstream sft`'s training loop, the same for a language and an image policy
 * (app/sft.ts, app/sft-image.ts): the run's store and lock, its row, the step loop (runSftSteps:
 * stop between steps, per-step timing, metrics rows, checkpoints), checkpoints
 * (<run_dir>/checkpoints/global_step_N with trainer_state.json, the store's row, trainer.save_limit)
 * and the summary.
 */
import { existsSync, promises as fs, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { Logger } from 'pino';
import {
  formatResolvedConfig,
  redactSecrets,
  resolveRunDir,
  resolveRunId,
  resumeConfigDiff,
  resumeConfigProblem,
  type Config,
} from '../lib/config/index.ts';
import { openDatabase, type Database } from '../lib/db/database.ts';
import { createStore } from '../lib/store/index.ts';
import type { Store } from '../lib/store/port.ts';
import { ConfigError, errorMessage } from '../lib/errors.ts';
import { policyDir } from '../lib/pipeline/policy.ts';
import {
  checkpointDir,
  listCheckpointSteps,
  removeCheckpointDir,
  removeTempCheckpoints,
  writeCheckpointDir,
  TRAINER_STATE_FORMAT,
  type TrainerState,
} from '../lib/pipeline/checkpoints.ts';
import { crashPoint } from '../lib/pipeline/crash-points.ts';
import { LiveTensorBoard, tensorboardDir } from '../lib/analysis/tensorboard-live.ts';
import { formatTable, type ProgressBar } from '../lib/console/progress.ts';
import { sftPosition, type SftPlan } from '../lib/sft/logic.ts';

export interface SftOutcome {
  status: 'completed' | 'stopped';
  runId: string;
  runDir: string;
  /** The final (or, when stopped, the newest) checkpoint. */
  checkpoint: { path: string; step: number; sha256: string } | null;
  summary: string;
  message?: string;
}

/** An open SFT run: its id and directory, its store and the row it had before this command, if any. */
export interface SftRunContext {
  runId: string;
  runDir: string;
  store: Store;
  prev: Awaited<ReturnType<Store['getRun']>>;
  /** Logs a step's metrics to tensorboard (trainer.logger), when it is on. */
  syncLogger: () => void;
  /** Flushes and closes the tensorboard logger of a completed run. */
  finishLogger: () => Promise<void>;
}

/**
 * Opens the run of `cfg` for `rlstream sft` (the store's lock on the run directory, the run's row
 * checked against the config a previous command ran with, config.yaml, half-written checkpoints
 * removed, the tensorboard logger), runs `body`, and marks the run failed when it throws.
 */
export async function withSftRun(
  cfg: Config,
  log: Logger,
  opts: { breakLock?: boolean },
  body: (run: SftRunContext) => Promise<SftOutcome>,
): Promise<SftOutcome> {
  const runId = resolveRunId(cfg);
  const runDir = resolve(resolveRunDir(cfg));
  await fs.mkdir(runDir, { recursive: true });
  const db: Database =
    cfg.pipeline.store === 'postgres'
      ? await openDatabase({ kind: 'postgres', url: cfg.pipeline.database_url! })
      : await openDatabase({ kind: 'pglite', dir: join(runDir, 'db'), breakLock: opts.breakLock });
  const store = createStore(db);
  let tb: LiveTensorBoard | null = null;
  try {
    const prev = await store.getRun(runId);
    if (prev) {
      const problem = resumeConfigProblem(
        runId,
        resumeConfigDiff(prev.config, cfg),
        cfg.trainer.resume_with_changed_config,
      );
      if (problem) throw new ConfigError(problem);
    }
    await store.upsertRun({
      runId,
      project: cfg.trainer.project_name,
      experiment: cfg.trainer.experiment_name,
      config: redactSecrets(cfg) as never,
      status: 'running',
    });
    writeFileSync(join(runDir, 'config.yaml'), formatResolvedConfig(cfg));
    const leftovers = await removeTempCheckpoints(runDir);
    if (leftovers.length)
      log.warn(
        { removed: leftovers },
        `removed ${leftovers.length} half-written checkpoint(s) left by an interrupted write`,
      );
    if (cfg.trainer.logger.includes('tensorboard')) {
      tb = await LiveTensorBoard.open(db.db, runId, tensorboardDir(runDir), {
        intervalMs: null,
        onError: (e) => log.warn({ err: e }, `tensorboard logger: ${errorMessage(e)}`),
      });
    }
    return await body({
      runId,
      runDir,
      store,
      prev,
      syncLogger: () =>
        void tb?.sync().catch((e: unknown) => log.warn({ err: e }, `tensorboard logger: ${errorMessage(e)}`)),
      finishLogger: async () => {
        await tb?.finish(true);
        tb = null;
      },
    });
  } catch (e) {
    await store.setRunStatus(runId, 'failed', { error: errorMessage(e) }).catch(() => undefined);
    throw e;
  } finally {
    await tb?.finish(false).catch(() => undefined);
    await db.close();
  }
}

/** What one SFT step of a policy kind did. */
export interface SftStepResult {
  /** The step's metrics (name → value; sft/loss among them), written as rows of stage sft. */
  values: Record<string, number>;
  /** Whether the update was skipped: its loss or gradient norm was not finite (weights and AdamW state unchanged). */
  skipped: boolean;
  /** The log line's text after `step N/total: `. */
  line: string;
}

/** A policy kind's side of the step loop. */
export interface SftSteps {
  /** Trains step `step` (1-based) at learning rate schedule position `step` of `total`. */
  step: (step: number) => Promise<SftStepResult>;
  /** AdamW steps taken (trainer_state.json lr_state.optimizer_steps). */
  optimizerSteps: () => number;
  /** Writes the actor into `dir` (CheckpointArgs.writeActor). */
  writeActor: CheckpointArgs['writeActor'];
  /** After checkpoint step `step` is written (an image policy's sample grid). */
  afterCheckpoint?: (step: number) => Promise<void>;
  /** LoRA: the summary says how to merge the adapter. */
  lora: boolean;
}

/**
 * Steps start + 1 … total of an SFT run: stops between steps when `signal` aborts (status
 * stopped, the newest checkpoint), times each step (perf/step_time_s), writes its metrics rows,
 * and checkpoints at trainer.save_freq and the last step. A step whose loss or gradient norm is
 * not finite skips its update (as verl's SFT trainer does), logs a warning naming the step, and
 * counts in sft/skipped_steps (1 on that step, 0 on the others); the run goes on.
 */
export async function runSftSteps(
  cfg: Config,
  log: Logger,
  run: SftRunContext,
  a: {
    start: number;
    total: number;
    plan: SftPlan;
    last: { path: string; step: number; sha256: string } | null;
    signal?: AbortSignal;
    bar?: ProgressBar | null;
  },
  k: SftSteps,
): Promise<SftOutcome> {
  const { runId, runDir, store } = run;
  let ck = a.last;
  for (let step = a.start + 1; step <= a.total; step++) {
    if (a.signal?.aborted)
      return {
        status: 'stopped',
        runId,
        runDir,
        checkpoint: ck,
        summary: await sftSummary(store, runId, ck, k.lora),
        message: 'interrupted',
      };
    const t0 = performance.now();
    const r = await k.step(step);
    const values: Record<string, number> = {
      ...r.values,
      'sft/skipped_steps': r.skipped ? 1 : 0,
      'perf/step_time_s': (performance.now() - t0) / 1000,
    };
    await store.insertMetrics(
      Object.entries(values).map(([name, value]) => ({ runId, step, name, value, stage: 'sft' })),
    );
    if (r.skipped)
      log.warn(
        { step, loss: values['sft/loss'], grad_norm: values['sft/grad_norm'] },
        `step ${step}: the loss or gradient norm is not finite (loss ${values['sft/loss']}, grad_norm ${values['sft/grad_norm']}); the update was skipped (sft/skipped_steps) — if this repeats, lower actor.optim.lr or set actor.optim.max_grad_norm`,
      );
    log.info({ step, ...values }, `step ${step}/${a.total}: ${r.line}`);
    a.bar?.update({ step, totalSteps: a.total, loss: values['sft/loss'], stepTimeS: values['perf/step_time_s'] });
    run.syncLogger();
    crashPoint('sft:trained');
    if (step === a.total || (cfg.trainer.save_freq > 0 && step % cfg.trainer.save_freq === 0)) {
      ck = await writeSftCheckpoint(cfg, store, {
        runId,
        runDir,
        step,
        total: a.total,
        plan: a.plan,
        optimizerSteps: k.optimizerSteps(),
        writeActor: k.writeActor,
      });
      await k.afterCheckpoint?.(step);
    }
  }
  await store.setRunStatus(runId, 'completed');
  await run.finishLogger();
  return { status: 'completed', runId, runDir, checkpoint: ck, summary: await sftSummary(store, runId, ck, k.lora) };
}

/** The newest checkpoint of the run whose directory is still there. */
export async function latestUsableCheckpoint(
  store: Store,
  runId: string,
): Promise<{ path: string; step: number; sha256: string } | null> {
  // a checkpoint renamed into place whose row was not yet written (killed in between) is not used: its step is redone and rewrites it
  const rows = (await store.listCheckpoints(runId)).sort((a, b) => b.step - a.step);
  for (const r of rows)
    if (existsSync(join(r.path, 'trainer_state.json'))) return { path: r.path, step: r.step, sha256: r.sha256 };
  return null;
}

export interface CheckpointArgs {
  runId: string;
  runDir: string;
  step: number;
  total: number;
  plan: SftPlan;
  /** AdamW steps taken (trainer_state.json lr_state.optimizer_steps). */
  optimizerSteps: number;
  /** Writes the actor (weights, AdamW state, config) into `dir` with `metadata`; returns its weights' sha256. */
  writeActor: (dir: string, metadata: Record<string, string>) => Promise<string>;
}

/**
 * checkpoints/global_step_N: the actor as a model directory (written as policy/vN, linked into the
 * checkpoint, then removed; with LoRA a PEFT adapter directory), reference/ = policy v0 (the initial
 * model; with LoRA the B = 0 adapter, i.e. the base), trainer_state.json; then
 * the store row, then checkpoints beyond trainer.save_limit are removed (oldest first).
 */
export async function writeSftCheckpoint(
  cfg: Config,
  store: Store,
  a: CheckpointArgs,
): Promise<{ path: string; step: number; sha256: string }> {
  const actorDir = policyDir(a.runDir, a.step);
  const weightsSha256 = await a.writeActor(actorDir, { policy_version: String(a.step) });
  const lrState = { optimizer_steps: a.optimizerSteps, total_steps: a.total };
  const state: TrainerState = {
    format: TRAINER_STATE_FORMAT,
    run_id: a.runId,
    step: a.step,
    policy_version: a.step,
    sha256: weightsSha256,
    dataset_position: sftPosition(a.plan, a.step),
    consumed_offsets: {},
    rng_state: {},
    kl_ctl_state: {},
    lr_state: lrState,
  };
  const path = await writeCheckpointDir(a.runDir, state, actorDir, policyDir(a.runDir, 0));
  await store.recordCheckpoint({
    runId: a.runId,
    step: a.step,
    path,
    sha256: weightsSha256,
    policyVersion: a.step,
    consumedOffsets: {},
    datasetPosition: { ...state.dataset_position },
    rngState: {},
    klCtlState: {},
    lrState,
  });
  crashPoint('checkpoint:recorded');
  await fs.rm(actorDir, { recursive: true, force: true });
  if (cfg.trainer.save_limit > 0) {
    const steps = await listCheckpointSteps(a.runDir);
    for (const s of steps.slice(0, Math.max(0, steps.length - cfg.trainer.save_limit)))
      await removeCheckpointDir(a.runDir, s);
  }
  return { path: checkpointDir(a.runDir, a.step), step: a.step, sha256: weightsSha256 };
}

/** First / last / best of the SFT metrics and the final checkpoint. */
export async function sftSummary(
  store: Store,
  runId: string,
  ck: { path: string; step: number; sha256: string } | null,
  lora: boolean,
): Promise<string> {
  const names = ['sft/loss', 'sft/token_acc', 'sft/grad_norm'];
  const ms = await store.getMetrics(runId, [...names, 'sft/skipped_steps']);
  const rows: Array<Array<string | number>> = [['metric', 'first', 'last', 'best', 'steps']];
  for (const name of names) {
    const s = ms.filter((m) => m.name === name).sort((a, b) => a.step - b.step);
    if (!s.length) continue;
    const best =
      name === 'sft/loss'
        ? Math.min(...s.map((x) => x.value))
        : name === 'sft/token_acc'
          ? Math.max(...s.map((x) => x.value))
          : NaN;
    rows.push([name, s[0].value, s[s.length - 1].value, Number.isNaN(best) ? '-' : best, s.length]);
  }
  const skipped = ms.filter((m) => m.name === 'sft/skipped_steps').reduce((n, m) => n + m.value, 0);
  const lines = [formatTable(rows), ''];
  if (skipped > 0)
    lines.push(`${skipped} step(s) skipped: their loss or gradient norm was not finite (sft/skipped_steps)`);
  if (ck) {
    lines.push(
      lora
        ? `final checkpoint: ${ck.path} (step ${ck.step}, sha256 ${ck.sha256}); its actor/ is a LoRA adapter (PEFT layout): \`rlstream export ${ck.path} --merge --out DIR\` writes the merged model, an actor.model.path for rlstream train`
        : `final checkpoint: ${ck.path} (step ${ck.step}, sha256 ${ck.sha256}); its actor/ is a model directory for actor.model.path`,
    );
  }
  return lines.join('\n');
}

/** The dataset position at a resumed checkpoint's step, after checking that the data and settings are those it was taken with. */
export function checkResumePosition(runId: string, plan: SftPlan, state: TrainerState): ReturnType<typeof sftPosition> {
  const was = state.dataset_position,
    now = sftPosition(plan, state.step);
  const diff = (['train_size', 'rollout_batch_size', 'shuffle', 'seed'] as const).filter((k) => was[k] !== now[k]);
  if (diff.length)
    throw new ConfigError(
      `run ${runId}: its checkpoint at step ${state.step} was taken with ${diff.map((k) => `${k} = ${String(was[k])}`).join(', ')}, but the data now give ${diff.map((k) => `${k} = ${String(now[k])}`).join(', ')}; resume with the same data files and settings, or start a new run (another trainer.experiment_name or trainer.run_dir)`,
    );
  return now;
}
