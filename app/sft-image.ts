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
 * flow-matching loss of the step's batch), sft/grad_norm, sft/lr, sft/images, sft/skipped_steps,
 * perf/step_time_s.
 *
 * LoRA (actor.model.lora; lib/image/lora.ts): the DiT at actor.model.path is the frozen base, the
 * adapters (PEFT's init seeded by data.seed) and their AdamW state are trained; actor/ holds the
 * merged weights (model.safetensors: what sampling, `generate` and `rlstream train` read), the
 * adapter (adapter.safetensors) and its AdamW state. EMA (algorithm.ema.enable, algorithm.ema.decay):
 * an average of the weights after every step, in actor/ema.safetensors (restored on resume), drawn
 * by the sample grids.
 */
import { promises as fs } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { Config } from '../lib/config/index.ts';
import { ConfigError } from '../lib/errors.ts';
import { GraphError } from '../lib/onnx/builder.ts';
import { OPTIMIZER_FILE, writeDirAtomic } from '../lib/model/checkpoint.ts';
import { encodeSafetensors } from '../lib/model/safetensors.ts';
import { ditConfig, ditParamSpecs, initDitWeights, type DitConfig, type DitWeights } from '../lib/image/dit.ts';
import { ditFiles, loadDit, readDitTensors } from '../lib/image/checkpoint.ts';
import type { ImageTrainer } from '../lib/image/trainer.ts';
import { gridPng } from '../lib/image/png.ts';
import { guidedVelocity, sampleImages } from '../lib/image/sde.ts';
import { Rng } from '../lib/util/rng.ts';
import { imageLora, imageTrainer } from '../lib/pipeline/image-policy.ts';
import { policyDir } from '../lib/pipeline/policy.ts';
import { readCheckpointPath, verifyCheckpointFiles } from '../lib/pipeline/checkpoints.ts';
import { trainerSettings } from '../lib/pipeline/trainer-settings.ts';
import { lrAt } from '../lib/optim/lr-schedule.ts';
import type { ProgressBar } from '../lib/console/progress.ts';
import { loadImageSftData } from '../lib/sft/image-data.ts';
import { imageSftBatch, sftBatchIndices, sftStepsPerEpoch, sftTotalSteps, type SftPlan } from '../lib/sft/logic.ts';
import {
  checkResumePosition,
  latestUsableCheckpoint,
  runSftSteps,
  sftSummary,
  withSftRun,
  type SftOutcome,
} from './sft-run.ts';

const WEIGHTS_FILE = 'model.safetensors';
/** An image SFT checkpoint's EMA weights (algorithm.ema.enable), beside model.safetensors in actor/. */
export const EMA_FILE = 'ema.safetensors';

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

/**
 * An image actor directory: config.json, model.safetensors, optimizer.safetensors, with LoRA
 * adapter.safetensors, with EMA ema.safetensors; returns the weights' sha256.
 */
async function writeImageActor(
  dir: string,
  model: { config: DitConfig; classNames: string[] },
  tr: ImageTrainer,
): Promise<string> {
  const files = tr.files(model);
  files.set(OPTIMIZER_FILE, tr.optimizerFile());
  if (tr.ema)
    files.set(
      EMA_FILE,
      encodeSafetensors(
        ditParamSpecs(model.config).map((s) => [
          s.name,
          { dtype: 'F32' as const, shape: s.shape, data: tr.ema!.get(s.name)! },
        ]),
      ),
    );
  const written = await writeDirAtomic(dir, files, true);
  return written.find((f) => f.name === WEIGHTS_FILE)!.sha256;
}

/** At most this many prompts in a checkpoint's sample grid. */
const GRID_PROMPTS = 64;

/** The EMA weights of an image actor directory's ema.safetensors. */
function loadEma(dir: string, config: DitConfig): DitWeights {
  const file = join(dir, EMA_FILE);
  return readDitTensors(
    file,
    ditParamSpecs(config),
    `${file} is missing: the run was checkpointed without algorithm.ema.enable; resume with the same setting or start a new run`,
  ).weights;
}

/**
 * <run_dir>/samples/global_step_N.png: one image of each prompt (the first 64, in class order, 8
 * a row) drawn by the checkpoint's weights (its EMA with algorithm.ema.enable) with the ODE of algorithm.image.eval_steps steps,
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
  const w = tr.ema ?? tr.weights;
  const velocity = guidedVelocity((x, t, c) => tr.velocity(x, t, c, w), cfg.algorithm.image.cfg_scale, numClasses);
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
  const ema = cfg.algorithm.ema.enable ? { emaDecay: cfg.algorithm.ema.decay } : {};
  if (imageLora(cfg) && !base)
    throw new ConfigError(
      'actor.model.lora needs actor.model.path: the image model directory the adapters are trained on (LoRA on a randomly initialised DiT has nothing to adapt)',
    );
  return withSftRun(cfg, log, opts, async (run) => {
    const { runId, runDir, store, prev } = run;
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
      // with LoRA the base is actor.model.path's and the adapter the checkpoint's; else its weights
      tr = imageTrainer(cfg, { ...model, weights: base?.weights ?? ck.weights }, src.actorDir, ema);
      tr.loadOptimizer(join(src.actorDir, OPTIMIZER_FILE));
      if (tr.ema) tr.ema = loadEma(src.actorDir, config);
      start = state.step;
      log.info(
        { step: start, checkpoint: last.path },
        `resumed at step ${start} (epoch ${now.epoch}, image ${now.index} of ${now.train_size}) from ${last.path} (sha256 ${last.sha256})`,
      );
    } else {
      tr = imageTrainer(
        cfg,
        { ...model, weights: base?.weights ?? initDitWeights(config, cfg.actor.model.image.init_seed) },
        null,
        ema,
      );
      // policy v0: the initial model (with LoRA: B = 0, the base), a checkpoint's reference/
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
    return runSftSteps(
      cfg,
      log,
      run,
      { start, total, plan, last, signal: opts.signal, bar: opts.bar },
      {
        lora: false,
        step: async (step) => {
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
          return {
            values: { 'sft/loss': r.loss, 'sft/grad_norm': r.grad_norm, 'sft/lr': lr, 'sft/images': batch.cls.length },
            skipped: tr.lastSkipped,
            line: `flow-matching loss ${r.loss.toFixed(4)}`,
          };
        },
        optimizerSteps: () => tr.stepCount,
        writeActor: (dir) => writeImageActor(dir, model, tr),
        afterCheckpoint: (step) => writeSampleGrid(cfg, runDir, step, model, tr),
      },
    );
  });
}
