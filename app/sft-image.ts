/**
 * `rlstream sft` of an image policy (actor.model.kind = image; docs/image-generation.md): a DiT
 * learns by flow matching (lib/image/flow-graph.ts `flow_matching`) on the (prompt, image) rows of
 * data.train_files (lib/sft/image-data.ts), in the run a language SFT has (app/sft-run.ts: the
 * store and its lock, metrics rows, checkpoints, resume to the same sha256).
 *
 * The model: actor.model.path (an image model directory, whose class_names the rows' prompts must
 * be among) or a fresh DiT of actor.model.image's shape whose prompts are the data's. A step is
 * actor.global_batch_size images in the epoch's order (lib/sft/logic.ts sftBatchIndices) with
 * noise, times and the condition dropout of sft.cfg_dropout drawn from the step's stream
 * (imageSftBatch), one AdamW step in one `session.run`. Checkpoints' actor/ are image model
 * directories (config.json, model.safetensors, optimizer.safetensors): actor.model.path for
 * `rlstream train`, and a directory `rlstream generate --image-out` draws from; beside each, a grid
 * of one sample per prompt (<run_dir>/samples/global_step_N.png). Metrics: sft/loss (the
 * flow-matching loss of the step's batch), sft/grad_norm, sft/lr, sft/images, perf/step_time_s.
 */
import { promises as fs } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { Config } from '../lib/config/index.ts';
import { ConfigError, RlError } from '../lib/errors.ts';
import { GraphError } from '../lib/onnx/builder.ts';
import { OPTIMIZER_FILE, writeDirAtomic } from '../lib/model/checkpoint.ts';
import { ditConfig, initDitWeights, type DitConfig, type DitWeights } from '../lib/image/dit.ts';
import { ditFiles, ditOptimizerFile, loadDit, loadDitOptimizer } from '../lib/image/checkpoint.ts';
import { ImageTrainer } from '../lib/image/trainer.ts';
import { gridPng } from '../lib/image/png.ts';
import { guidedVelocity, sampleImages } from '../lib/image/sde.ts';
import { Rng } from '../lib/util/rng.ts';
import { imageOptim } from '../lib/pipeline/image-policy.ts';
import { policyDir } from '../lib/pipeline/policy.ts';
import { readCheckpointPath, verifyCheckpointFiles } from '../lib/pipeline/checkpoints.ts';
import { trainerSettings } from '../lib/pipeline/trainer-settings.ts';
import { crashPoint } from '../lib/pipeline/crash-points.ts';
import { lrAt } from '../lib/optim/lr-schedule.ts';
import type { ProgressBar } from '../lib/console/progress.ts';
import { loadImageSftData } from '../lib/sft/image-data.ts';
import { imageSftBatch, sftBatchIndices, sftStepsPerEpoch, sftTotalSteps, type SftPlan } from '../lib/sft/logic.ts';
import {
  checkResumePosition,
  latestUsableCheckpoint,
  sftSummary,
  withSftRun,
  writeSftCheckpoint,
  type SftOutcome,
} from './sft-run.ts';

const WEIGHTS_FILE = 'model.safetensors';

/** A fresh image policy's shape: actor.model.image with `numClasses` prompts. */
export function freshDitConfig(cfg: Config, numClasses: number): DitConfig {
  const m = cfg.actor.model.image;
  try {
    return ditConfig({
      imageSize: m.image_size,
      channels: m.channels,
      patchSize: m.patch_size,
      hidden: m.hidden_size,
      depth: m.depth,
      heads: m.num_heads,
      mlpRatio: m.mlp_ratio,
      timeFreqs: m.time_freqs,
      numClasses,
    });
  } catch (e) {
    if (e instanceof GraphError) throw new ConfigError(`actor.model.image: ${e.message.replace(/^dit config: /, '')}`);
    throw e;
  }
}

/** An image actor directory: config.json, model.safetensors and optimizer.safetensors; returns the weights' sha256. */
async function writeImageActor(
  dir: string,
  model: { config: DitConfig; classNames: string[] },
  tr: ImageTrainer,
): Promise<string> {
  const files = ditFiles({ ...model, weights: tr.weights });
  files.set(OPTIMIZER_FILE, ditOptimizerFile(model.config, tr.optimizerState()));
  const written = await writeDirAtomic(dir, files, true);
  return written.find((f) => f.name === WEIGHTS_FILE)!.sha256;
}

/** At most this many prompts in a checkpoint's sample grid. */
const GRID_PROMPTS = 64;

/**
 * <run_dir>/samples/global_step_N.png: one image of each prompt (the first 64, in class order, 8
 * a row) drawn by the checkpoint's weights with the ODE of algorithm.image.eval_steps steps,
 * guided by algorithm.image.cfg_scale, from the noise stream `<data.seed>/sft-grid/<class>` (the
 * same noise at every checkpoint, so the grids compare).
 */
async function writeSampleGrid(
  cfg: Config,
  runDir: string,
  step: number,
  model: { config: DitConfig; classNames: string[] },
  tr: ImageTrainer,
): Promise<void> {
  const { channels, imageSize, numClasses } = model.config;
  const cls = Array.from({ length: Math.min(numClasses, GRID_PROMPTS) }, (_, k) => k);
  const velocity = guidedVelocity((x, t, c) => tr.velocity(x, t, c), cfg.algorithm.image.cfg_scale, numClasses);
  const { x0 } = await sampleImages(velocity, {
    cls,
    pixels: channels * imageSize * imageSize,
    steps: cfg.algorithm.image.eval_steps,
    rng: cls.map((k) => Rng.fromSeed(`${cfg.data.seed}/sft-grid/${k}`)),
  });
  await fs.mkdir(join(runDir, 'samples'), { recursive: true });
  await fs.writeFile(
    join(runDir, 'samples', `global_step_${step}.png`),
    await gridPng(x0, channels, imageSize, Math.min(8, cls.length)),
  );
}

/** Runs (or resumes) the image SFT run of `cfg` until its last step, or until `signal` aborts between steps. */
export async function imageSftRun(
  cfg: Config,
  log: Logger,
  opts: { bar?: ProgressBar | null; signal?: AbortSignal; breakLock?: boolean } = {},
): Promise<SftOutcome> {
  const base = cfg.actor.model.path ? loadDit(cfg.actor.model.path) : null;
  const shape = base?.config ?? freshDitConfig(cfg, 1);
  const data = await loadImageSftData(
    cfg,
    { channels: shape.channels as 1 | 3, imageSize: shape.imageSize },
    base?.classNames ?? null,
  );
  for (const s of data.skipped.slice(0, 3))
    log.warn({ row: s.where }, `bad row skipped (data.on_bad_row = skip): ${s.where}: ${s.reason}`);
  if (data.skipped.length > 3) log.warn(`${data.skipped.length - 3} more bad rows skipped`);
  const config = base?.config ?? freshDitConfig(cfg, data.classNames.length);
  const model = { config, classNames: data.classNames };
  const plan: SftPlan = {
    units: data.cls.length,
    batchSize: cfg.actor.global_batch_size,
    epochs: cfg.sft.epochs,
    maxSteps: cfg.trainer.max_steps,
    shuffle: cfg.data.shuffle,
    seed: cfg.data.seed,
  };
  if (sftStepsPerEpoch(plan) === 0)
    throw new ConfigError(
      `${plan.units} training images are fewer than actor.global_batch_size = ${plan.batchSize}; lower actor.global_batch_size or add rows`,
    );
  const total = sftTotalSteps(plan);
  const pixels = config.channels * config.imageSize * config.imageSize;
  const schedule = trainerSettings(cfg).actor.schedule;
  const trainerOf = (w: DitWeights) =>
    new ImageTrainer(config, w, imageOptim(cfg), {
      threads: cfg.actor.threads,
      gradientCheckpointing: cfg.actor.model.enable_gradient_checkpointing,
    });
  return withSftRun(cfg, log, opts, async ({ runId, runDir, store, prev, syncLogger, finishLogger }) => {
    let tr: ImageTrainer,
      start = 0;
    const last = await latestUsableCheckpoint(store, runId);
    if (last) {
      const src = readCheckpointPath(last.path);
      const state = src.state!;
      await verifyCheckpointFiles(last.path, state);
      const now = checkResumePosition(runId, plan, state);
      const ck = loadDit(src.actorDir);
      if (JSON.stringify(ck.classNames) !== JSON.stringify(data.classNames))
        throw new ConfigError(
          `run ${runId}: its checkpoint at step ${state.step} draws the prompts ${ck.classNames.join(', ')}, but the data now give ${data.classNames.join(', ')}; resume with the same data files, or start a new run (another trainer.experiment_name or trainer.run_dir)`,
        );
      tr = trainerOf(ck.weights);
      tr.setOptimizerState(loadDitOptimizer(join(src.actorDir, OPTIMIZER_FILE), config));
      start = state.step;
      log.info(
        { step: start, checkpoint: last.path },
        `resumed at step ${start} (epoch ${now.epoch}, image ${now.index} of ${now.train_size}) from ${last.path} (sha256 ${last.sha256})`,
      );
    } else {
      tr = trainerOf(base?.weights ?? initDitWeights(config, cfg.actor.model.image.init_seed));
      // policy v0: the initial model, a checkpoint's reference/
      await writeDirAtomic(policyDir(runDir, 0), ditFiles({ ...model, weights: tr.weights }), true);
    }
    if (start >= total && prev?.status === 'completed') {
      await store.setRunStatus(runId, 'completed');
      return {
        status: 'completed',
        runId,
        runDir,
        checkpoint: last,
        summary: await sftSummary(store, runId, last, false),
        message: `run ${runId} already complete (step ${start}); nothing to do — raise sft.epochs or trainer.max_steps to train further`,
      };
    }
    log.info(
      { images: plan.units, prompts: data.classNames.length, steps: total, from_step: start },
      `sft (image policy, flow matching): ${plan.units} images of ${data.classNames.length} prompts, ${sftStepsPerEpoch(plan)} steps per epoch, steps ${start + 1}–${total}`,
    );
    opts.bar?.update({ step: start, totalSteps: total });
    let ck = last;
    for (let step = start + 1; step <= total; step++) {
      if (opts.signal?.aborted)
        return {
          status: 'stopped',
          runId,
          runDir,
          checkpoint: ck,
          summary: await sftSummary(store, runId, ck, false),
          message: 'interrupted',
        };
      const t0 = performance.now();
      const batch = imageSftBatch({
        images: data.images,
        cls: data.cls,
        pixels,
        indices: sftBatchIndices(plan, step),
        seed: cfg.data.seed,
        step,
        cfgDropout: cfg.sft.cfg_dropout,
        nullClass: config.numClasses,
      });
      const lr = lrAt(schedule, step, total);
      const r = await tr.step({ name: 'flow_matching' }, batch, lr);
      const values: Record<string, number> = {
        'sft/loss': r.loss,
        'sft/grad_norm': r.grad_norm,
        'sft/lr': lr,
        'sft/images': batch.cls.length,
        'perf/step_time_s': (performance.now() - t0) / 1000,
      };
      await store.insertMetrics(
        Object.entries(values).map(([name, value]) => ({ runId, step, name, value, stage: 'sft' })),
      );
      if (!Number.isFinite(r.loss) || !Number.isFinite(r.grad_norm))
        throw new RlError(
          `step ${step}: the flow-matching loss or gradient norm is not finite (loss ${r.loss}, grad_norm ${r.grad_norm}); lower actor.optim.lr or set actor.optim.max_grad_norm; the run resumes from its newest checkpoint`,
          { retriable: false },
        );
      log.info({ step, ...values }, `step ${step}/${total}: flow-matching loss ${r.loss.toFixed(4)}`);
      opts.bar?.update({ step, totalSteps: total, loss: r.loss, stepTimeS: values['perf/step_time_s'] });
      syncLogger();
      crashPoint('sft:trained');
      if (step === total || (cfg.trainer.save_freq > 0 && step % cfg.trainer.save_freq === 0))
        ck = await writeSftCheckpoint(cfg, store, {
          runId,
          runDir,
          step,
          total,
          plan,
          optimizerSteps: tr.stepCount,
          writeActor: (dir) => writeImageActor(dir, model, tr),
        });
      if (ck?.step === step) await writeSampleGrid(cfg, runDir, step, model, tr);
    }
    await store.setRunStatus(runId, 'completed');
    await finishLogger();
    return { status: 'completed', runId, runDir, checkpoint: ck, summary: await sftSummary(store, runId, ck, false) };
  });
}
