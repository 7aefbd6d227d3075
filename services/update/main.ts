/**
 * Update stage: trains the policy. At start it publishes policy version 0 (the seeded initial
 * weights, or actor.model.path) unless the run already has versions; on restart it starts the
 * trainer from the last checkpoint (weights + AdamW state + LR state; else the run's start) and
 * re-trains the steps committed after it from their groups in its input log, which gives the
 * committed version's state again without writing anything. Each training step's update groups are
 * collected durably (stage_pending) until rollout_batch_size kept groups are there; then the
 * batch is assembled in id order, old log-probs are recomputed with the current weights, and
 * ppo_epochs passes over mini-batches of actor.global_batch_size (micro-batch accumulation)
 * train the policy. The new version is written atomically to <run_dir>/policy/vNNNNNN,
 * checkpointed every trainer.save_freq steps (global_step_N, keeping save_limit; see
 * lib/pipeline/checkpoints.ts), recorded in the store with its sha256, dataset position, consumed
 * offsets, RNG, KL-controller and LR state, and published. The version's state, the checkpoint
 * row and the consumed offsets commit together (embedded), or state is saved after the outputs
 * are produced and before the offsets are committed (Kafka); pending groups of a trained step are
 * deleted only after the state that says the step is trained (docs/durability.md).
 */
import { forStage, type Logger } from '../../lib/log.ts';
import { runStage, type Decoded, type Pipeline, type StageContext, type StageRun } from '../../lib/pipeline/runtime.ts';
import { StageMetrics } from '../../lib/pipeline/metrics.ts';
import { loadStageState, saveStageState, PendingBatch } from '../../lib/pipeline/stage-state.ts';
import { crashPoint } from '../../lib/pipeline/crash-points.ts';
import { memMark } from '../../lib/pipeline/mem-trace.ts';
import { policyModels, startLearner } from '../../lib/pipeline/update-start.ts';
import type { UpdateOptions, UpdateState } from '../../lib/pipeline/update-start.ts';
import { catchUpLearner, type Retrainer } from '../../lib/pipeline/update-resume.ts';
import {
  commitStep,
  pruneVersions,
  releaseSampledVersions,
  type UpdateCommitter,
} from '../../lib/pipeline/update-commit.ts';
import { trainUpdateStep, type StepTrainer } from '../../lib/pipeline/update-train.ts';
import { versionFilesOf } from '../../lib/pipeline/version-files.ts';
import { PolicyImages } from '../../lib/pipeline/images.ts';
import { PixelCache } from '../../lib/data/pixel-cache.ts';
import type { UpdateGroup } from '../../lib/contracts/index.ts';
import { totalSteps as planTotalSteps, planFromConfig } from '../../lib/pipeline/plan.ts';
import {
  advancePositions,
  checkBatchArithmetic,
  noteStepStarts,
  rereadFrom,
  packOptions,
  pendingUpdates,
  startRefusal,
  stepBucket,
  stepPacking,
  stepRecord,
  stepThroughput,
  totalOptimizerSteps,
  versionsInUse,
  type ControllerProgress,
} from './logic.ts';

/** What the update stage's steps share once it has started. */
interface UpdateRun {
  p: Pipeline;
  log: Logger;
  metrics: StageMetrics;
  totalSteps: number;
  /** Brings the learner to a committed version by re-training logged steps (lib/pipeline/update-resume.ts). */
  retrain: Retrainer;
  /** Stores, records and checkpoints the learner's versions; prunes those no longer needed. */
  commit: UpdateCommitter;
  /** Trains a step (lib/pipeline/update-train.ts). */
  trainer: StepTrainer;
  /** When this process published its last policy version (throughput is measured between versions). */
  lastVersionMs: number | null;
}

export async function startUpdate(p: Pipeline, opts: UpdateOptions): Promise<StageRun> {
  const cfg = p.cfg;

  const arith = checkBatchArithmetic({
    rolloutBatchSize: cfg.data.rollout_batch_size,
    n: cfg.rollout.n,
    globalBatchSize: cfg.actor.global_batch_size,
    microBatchSize: cfg.actor.micro_batch_size_per_device_for_update,
  });
  const { model, criticModel } = policyModels(cfg);
  const plan = planFromConfig(cfg, p.runId, opts.trainSize, 0);
  const totalSteps = planTotalSteps(plan);
  const log = forStage(p.log, 'update');
  const pixelCache = new PixelCache();
  const { learner, state, settings, versions, checkpoints, perEpoch } = await startLearner(p, {
    model,
    criticModel,
    plan,
    log,
    ...(opts.initialWeightsDir ? { initialWeightsDir: opts.initialWeightsDir } : {}),
    refusal: (start) =>
      startRefusal({
        runId: p.runId,
        where: p.db.where,
        ...start,
        findLastCheckpoint: cfg.trainer.find_last_checkpoint,
      }),
  });
  const totalOptSteps = totalOptimizerSteps(totalSteps, perEpoch ?? arith.miniBatches, cfg.actor.ppo_epochs);
  const run: UpdateRun = {
    p,
    log,
    metrics: new StageMetrics(p, 'update'),
    totalSteps,
    retrain: { p, learner, log, train: async (at, groups) => void (await trainStep(run, at, groups)) },
    commit: {
      cfg,
      runId: p.runId,
      plan,
      learner,
      versions,
      checkpoints,
      versionFiles: versionFilesOf(cfg, opts.rolloutInProcess === true),
      schedule: settings.actor.schedule,
      totalOptimizerSteps: totalOptSteps,
      log,
    },
    trainer: {
      cfg,
      learner,
      packing: stepPacking(cfg, packOptions(cfg, model?.padTokenId ?? 0)),
      images: new PolicyImages(model ?? {}, pixelCache),
      criticImages: criticModel ? new PolicyImages(criticModel, pixelCache) : null,
      ...(opts.behaviourSha ? { behaviourSha: opts.behaviourSha } : {}),
      totalOptimizerSteps: totalOptSteps,
    },
    lastVersionMs: null,
  };
  await catchUpLearner({ ...run.retrain, st: state, db: p.db.db, reset: false });
  // (re)publish the current version: idempotent by id, and covers a crash between save and publish
  // (after the catch-up: a version kept in memory only is there again only once re-trained)
  await p.bus.produce([p.message('policy', await versions.record(state.version, Date.now()))]);
  return runStage(p, 'update', ['updates'], (records, ctx) => updateBatch(run, state, records, ctx));
}

/**
 * One batch of `updates` records: their groups wait (durably) per step until a step has
 * rollout_batch_size kept groups; each complete step is trained and committed in order.
 */
async function updateBatch(run: UpdateRun, initial: UpdateState, records: Decoded[], ctx: StageContext): Promise<void> {
  const { p } = run;
  const cfg = p.cfg;
  run.metrics.beginBatch(ctx.waitedMs);
  const st = (await loadStageState<UpdateState>(ctx.db, p.runId, 'update')) ?? initial;
  await catchUpLearner({ ...run.retrain, st, db: ctx.db, reset: true });
  st.stepStarts = noteStepStarts(st.stepStarts ?? {}, records, st.version);
  st.positions = advancePositions(
    st.positions ?? {},
    records.map((r) => r.message),
  );
  const pending = new PendingBatch(ctx.db, p.runId, 'update');
  pending.add(pendingUpdates(records, st.version));
  // validation rounds the controller published and has not seen finish still sample with their version
  // (read once: a round that finishes during the batch is only kept a batch longer)
  const progress = await loadStageState<ControllerProgress>(ctx.db, p.runId, 'controller');
  const inUse = () => versionsInUse(progress, st.version);
  while (st.version < run.totalSteps) {
    // stopping (SIGTERM): the steps trained so far are kept, the rest of the batch's groups wait in stage_pending
    if (ctx.signal.aborted) break;
    const step = st.version + 1;
    const groups: UpdateGroup[] = [];
    for (const it of await pending.items(stepBucket(step)))
      groups.push(await p.codecs.updates.decode(it.payload, it.headers));
    if (groups.filter((g) => !g.filtered).length < cfg.data.rollout_batch_size) break;
    releaseSampledVersions(run.commit, step, inUse());
    run.lastVersionMs = await trainAndCommit(run, st, step, groups, ctx);
    pending.settle(stepBucket(step));
  }
  await run.metrics.flush(ctx);
  await ctx.flush();
  await saveStageState(ctx.db, p.runId, 'update', st);
  // only now (Kafka: after the state that says they are trained) may a trained step's groups go
  await pending.persist();
  await pruneVersions(run.commit, st, inUse(), ctx.db);
}

/** Trains step `step` on its groups and commits it: versions, policy record, checkpoint when due, metrics. Returns the time it was published. */
async function trainAndCommit(
  run: UpdateRun,
  st: UpdateState,
  step: number,
  groups: UpdateGroup[],
  ctx: StageContext,
): Promise<number> {
  const { p, log } = run;
  crashPoint('update:start');
  const t0 = performance.now();
  memMark('update:start', { step });
  const m = await trainStep(run, st, groups);
  const tTrain = performance.now();
  memMark('update:trained', { step });
  crashPoint('update:trained');
  const rec = await commitStep(
    run.commit,
    st,
    step,
    stepRecord(groups, m['perf/update_tokens'] ?? 0, st.positions ?? {}),
    rereadFrom(st.positions ?? {}, st.stepStarts ?? {}, step),
    ctx,
  );
  // throughput of the whole pipeline over this step: its samples (and their prompt + response
  // tokens) ÷ the wall time since the previous version (none for the first step of a process)
  memMark('update:committed', { step });
  const nowMs = Date.now();
  const last = run.lastVersionMs;
  if (last !== null && nowMs > last) Object.assign(m, stepThroughput(groups, (nowMs - last) / 1000));
  run.metrics.set(step, m);
  run.metrics.add(step, {}, { compute: tTrain - t0, checkpoint: performance.now() - tTrain });
  ctx.emit('policy', rec);
  p.telemetry?.policyVersion('update', step);
  log.info(
    { step, reward: undefined, pg_loss: m['actor/pg_loss'], ms: Math.round(tTrain - t0) },
    `step ${step} trained`,
  );
  return nowMs;
}

/** One step's training (lib/pipeline/update-train.ts); moves the state's optimizer steps on. */
async function trainStep(run: UpdateRun, st: UpdateState, groups: UpdateGroup[]): Promise<Record<string, number>> {
  const r = await trainUpdateStep(run.trainer, st.version, st.optimizerSteps, groups);
  st.optimizerSteps = r.optimizerSteps;
  return r.metrics;
}
