/**
 * `rlstream sft`: supervised fine-tuning in one process, with `train`'s guarantees. The run
 * directory is locked (the embedded store's lock), the run has a row in the store (so
 * `rlstream runs`, `sql` and the v_* views see it), every step writes its metrics rows
 * (`sft/loss`, `sft/token_acc`, `sft/lr`, `sft/grad_norm`, `sft/tokens`, `sft/skipped_steps`, stage
 * "sft"; a step with a non-finite loss or gradient norm skips its update: app/sft-run.ts runSftSteps), and
 * checkpoints are `train`'s: <run_dir>/checkpoints/global_step_N with actor/ a Hugging Face model
 * directory (weights, AdamW state, config and tokenizer files) — a valid actor.model.path for
 * `rlstream train` — and trainer_state.json (step, dataset position, sha256 of every file).
 *
 * Resuming: the same command continues from the newest checkpoint (trainer.save_freq sets how
 * often there is one): its weights and AdamW state, at its step, so the following batches are the
 * ones an uninterrupted run takes (the order is a pure function of data.seed and the epoch,
 * lib/sft/logic.ts) and the final checkpoint has the same sha256.
 *
 * LoRA (actor.model.lora, as for `train`): the base at actor.model.path is read once and frozen,
 * the adapters (PEFT's init, seeded by data.seed) are the trained parameters with their AdamW
 * state, and every checkpoint's actor/ (and policy v0, B = 0) is a PEFT adapter directory
 * (adapter_config.json naming the base, adapter_model.safetensors, optimizer.safetensors); the
 * checkpoint sha256 is adapter_model.safetensors'. `rlstream export <checkpoint> --merge` writes
 * the merged model, an actor.model.path for `train` (with or without a new LoRA), as PEFT's
 * merge_and_unload before an RL run.
 *
 * An image policy (actor.model.kind = image) learns by flow matching on (prompt, image) rows
 * instead, in the same run, checkpoints and resume: app/sft-image.ts.
 */
import { join, resolve } from 'node:path';
import type { Logger } from 'pino';
import type { Config } from '../lib/config/index.ts';
import { ConfigError } from '../lib/errors.ts';
import {
  createTrainer,
  initLora,
  initWeights,
  loadAdapter,
  loadCheckpoint,
  saveAdapter,
  saveCheckpoint,
  type ModelConfig,
  type OptimizerState,
  type Tokenizer,
  type Weights,
} from '../lib/model/index.ts';
import {
  checkTokenizerFits,
  freshModelConfig,
  modelDirConfig,
  policyDir,
  policyLora,
  tokenizerFor,
  withSamplingMask,
  type PolicyLora,
} from '../lib/pipeline/policy.ts';
import { verifyCheckpointFiles, readCheckpointPath } from '../lib/pipeline/checkpoints.ts';
import { lrAt } from '../lib/optim/lr-schedule.ts';
import { trainerSettings } from '../lib/pipeline/trainer-settings.ts';
import { checkDevice } from '../lib/onnx/runtime.ts';
import type { ProgressBar } from '../lib/console/progress.ts';
import { loadSftExamples } from '../lib/sft/data.ts';
import {
  collate,
  packExamples,
  sftBatchIndices,
  sftStepsPerEpoch,
  sftTotalSteps,
  type SftExample,
  type SftPlan,
} from '../lib/sft/logic.ts';
import { policyKindOf } from '../lib/model/policy-kinds.ts';
import {
  checkResumePosition,
  latestUsableCheckpoint,
  runSftSteps,
  sftSummary,
  withSftRun,
  type SftOutcome,
} from './sft-run.ts';
import { imageSftRun } from './sft-image.ts';

export type { SftOutcome } from './sft-run.ts';

/** The SFT model: actor.model.path's config.json, or a fresh model from actor.model's keys; checked against sft.max_length. */
export function sftModelConfig(cfg: Config, tok: Tokenizer): ModelConfig {
  const m = cfg.actor.model;
  let c: ModelConfig;
  if (m.path) {
    c = modelDirConfig('actor.model.path', m.path);
    checkTokenizerFits('actor.model.path', c, tok);
    if (cfg.sft.max_length > c.maxPositionEmbeddings)
      throw new ConfigError(
        `sft.max_length = ${cfg.sft.max_length} exceeds the model's max_position_embeddings ${c.maxPositionEmbeddings} (${m.path}/config.json); lower sft.max_length`,
      );
  } else c = freshModelConfig(m, tok, { head: 'lm', tieWordEmbeddings: m.tie_embeddings, vocabSize: tok.vocabSize });
  return withSamplingMask(c, tok);
}

const METRICS: Array<[string, string]> = [
  ['sft/loss', 'sft_loss'],
  ['sft/token_acc', 'token_acc'],
  ['sft/grad_norm', 'grad_norm'],
  ['sft/lr', 'lr'],
];

/** Runs (or resumes) the SFT run of `cfg` until its last step, or until `signal` aborts between steps. */
export async function sftRun(
  cfg: Config,
  log: Logger,
  opts: { bar?: ProgressBar | null; signal?: AbortSignal; breakLock?: boolean } = {},
): Promise<SftOutcome> {
  if (cfg.trainer.load_checkpoint_path)
    throw new ConfigError(
      "trainer.load_checkpoint_path is not read by rlstream sft; start from a model directory with actor.model.path (a checkpoint's actor/ is one), or run the same command again to resume a run",
    );
  await checkDevice(cfg.actor.device, 'actor.device');
  if (policyKindOf(cfg.actor.model) === 'image') return imageSftRun(cfg, log, opts);
  const tok = tokenizerFor(cfg);
  const model = sftModelConfig(cfg, tok);
  const lora = policyLora(cfg);
  const data = await loadSftExamples(cfg, tok);
  for (const s of data.skipped.slice(0, 3))
    log.warn({ row: s.where }, `bad row skipped (data.on_bad_row = skip): ${s.where}: ${s.reason}`);
  if (data.skipped.length > 3) log.warn(`${data.skipped.length - 3} more bad rows skipped`);
  const units: SftExample[] = cfg.sft.packing ? packExamples(data.examples, cfg.sft.max_length) : data.examples;
  const plan: SftPlan = {
    units: units.length,
    batchSize: cfg.actor.global_batch_size,
    epochs: cfg.sft.epochs,
    maxSteps: cfg.trainer.max_steps,
    shuffle: cfg.data.shuffle,
    seed: cfg.data.seed,
  };
  if (sftStepsPerEpoch(plan) === 0)
    throw new ConfigError(
      `${units.length} ${cfg.sft.packing ? 'packed training rows' : 'training examples'} are fewer than actor.global_batch_size = ${plan.batchSize}; lower actor.global_batch_size or add rows`,
    );
  const total = sftTotalSteps(plan);
  return withSftRun(cfg, log, opts, async (run) => {
    const { runId, runDir, store, prev } = run;
    // where to start: the newest checkpoint of this run, else the initial model (written once as policy v0, the reference)
    const assetsFrom = cfg.actor.model.path;
    let weights: Weights,
      optimizerState: OptimizerState | undefined,
      start = 0;
    // LoRA: `weights` is the frozen base, `adapter` the trained parameters
    let adapter: Weights | undefined;
    const baseWeights = async () => (await loadCheckpoint(lora!.baseDir, { optimizer: false })).weights;
    const last = await latestUsableCheckpoint(store, runId);
    if (last) {
      const state = readCheckpointPath(last.path).state!;
      await verifyCheckpointFiles(last.path, state);
      const now = checkResumePosition(runId, plan, state);
      if (lora) {
        // an adapter of another base model or LoRA shape is one line naming the tensor (or the key to set)
        const ad = await loadAdapter(join(last.path, 'actor'), model, { optimizer: true, expect: lora.config });
        weights = await baseWeights();
        adapter = ad.adapter;
        optimizerState = ad.optimizer;
      } else {
        const ck = await loadCheckpoint(join(last.path, 'actor'), { optimizer: true });
        weights = ck.weights;
        optimizerState = ck.optimizer;
      }
      start = state.step;
      log.info(
        { step: start, checkpoint: last.path },
        `resumed at step ${start} (epoch ${now.epoch}, example ${now.index} of ${now.train_size}) from ${last.path} (sha256 ${last.sha256})`,
      );
    } else if (lora) {
      weights = await baseWeights();
      adapter = initLora(model, lora.config, cfg.data.seed);
      await saveAdapter(policyDir(runDir, 0), model, lora.config, adapter, {
        overwrite: true,
        basePath: resolve(lora.baseDir),
        metadata: { policy_version: '0' },
      });
    } else {
      weights = assetsFrom
        ? (await loadCheckpoint(assetsFrom, { optimizer: false })).weights
        : initWeights(model, cfg.actor.model.init_seed, { visionStd: cfg.actor.model.vision.init_std });
      await saveCheckpoint(policyDir(runDir, 0), model, weights, {
        overwrite: true,
        assetsFrom,
        metadata: { policy_version: '0' },
      });
    }
    if (start >= total && prev?.status === 'completed') {
      await store.setRunStatus(runId, 'completed');
      return {
        status: 'completed',
        runId,
        runDir,
        checkpoint: last,
        summary: await sftSummary(store, runId, last, !!lora),
        message: `run ${runId} already complete (step ${start}); nothing to do — raise sft.epochs or trainer.max_steps to train further`,
      };
    }
    const settings = trainerSettings(cfg).actor;
    const trainer = createTrainer({
      ...settings.trainer,
      model,
      weights,
      optimizerState,
      ...(lora ? { lora: lora.config, adapter } : {}),
      loss: { type: 'sft', lossAggMode: cfg.actor.loss_agg_mode },
    });
    log.info(
      { examples: data.examples.length, units: units.length, steps: total, from_step: start },
      `sft: ${data.examples.length} examples${cfg.sft.packing ? ` packed into ${units.length} rows` : ''}, ${sftStepsPerEpoch(plan)} steps per epoch, steps ${start + 1}–${total}`,
    );
    opts.bar?.update({ step: start, totalSteps: total });
    return runSftSteps(
      cfg,
      log,
      run,
      { start, total, plan, last, signal: opts.signal, bar: opts.bar },
      {
        lora: !!lora,
        step: async (step) => {
          const batch = collate(
            sftBatchIndices(plan, step).map((i) => units[i]),
            tok.pad,
          );
          let tokens = 0;
          for (let i = 0; i < batch.batchSize * batch.seqLen; i++)
            if (batch.responseMask[i] && i % batch.seqLen > 0) tokens++;
          const r = await trainer.step(batch, lrAt(settings.schedule, step, total));
          const values: Record<string, number> = { 'sft/tokens': tokens };
          for (const [name, key] of METRICS) if (r.metrics[key] !== undefined) values[name] = r.metrics[key];
          return {
            values,
            skipped: r.skipped || !Number.isFinite(values['sft/loss']),
            line: `loss ${values['sft/loss']?.toFixed(4)}, token accuracy ${values['sft/token_acc']?.toFixed(3)}`,
          };
        },
        optimizerSteps: () => trainer.getOptimizerState().step,
        writeActor: (dir, metadata) =>
          writeActorDir(dir, metadata, {
            model,
            weights: trainer.weightsView() as Weights,
            optimizer: trainer.getOptimizerState(),
            assetsFrom,
            lora,
          }),
      },
    );
  });
}

/** A language policy's actor directory: a Hugging Face model directory, or with LoRA a PEFT adapter directory. */
async function writeActorDir(
  dir: string,
  metadata: Record<string, string>,
  a: {
    model: ModelConfig;
    /** The trained parameters: every weight, or (LoRA) the adapters. */
    weights: Weights;
    optimizer: OptimizerState;
    assetsFrom: string | null;
    lora: PolicyLora | null;
  },
): Promise<string> {
  const { weightsSha256 } = a.lora
    ? await saveAdapter(dir, a.model, a.lora.config, a.weights, {
        optimizer: a.optimizer,
        overwrite: true,
        basePath: resolve(a.lora.baseDir),
        metadata,
      })
    : await saveCheckpoint(dir, a.model, a.weights, {
        optimizer: a.optimizer,
        overwrite: true,
        assetsFrom: a.assetsFrom,
        metadata,
      });
  return weightsSha256;
}
