/**
 * `rlstream sft`: supervised fine-tuning in one process, with `train`'s guarantees. The run
 * directory is locked (the embedded store's lock), the run has a row in the store (so
 * `rlstream runs`, `sql` and the v_* views see it), every step writes its metrics rows
 * (`sft/loss`, `sft/token_acc`, `sft/lr`, `sft/grad_norm`, `sft/tokens`, stage "sft"), and
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
import {
  checkpointDir,
  listCheckpointSteps,
  removeCheckpointDir,
  removeTempCheckpoints,
  verifyCheckpointFiles,
  writeCheckpointDir,
  readCheckpointPath,
  TRAINER_STATE_FORMAT,
  type TrainerState,
} from '../lib/pipeline/checkpoints.ts';
import { lrAt } from '../lib/optim/lr-schedule.ts';
import { trainerSettings } from '../lib/pipeline/trainer-settings.ts';
import { crashPoint } from '../lib/pipeline/crash-points.ts';
import { LiveTensorBoard, tensorboardDir } from '../lib/analysis/tensorboard-live.ts';
import { checkDevice } from '../lib/onnx/runtime.ts';
import type { ProgressBar } from '../lib/console/progress.ts';
import { formatTable } from '../lib/console/progress.ts';
import { loadSftExamples } from '../lib/sft/data.ts';
import {
  collate,
  packExamples,
  sftBatchIndices,
  sftPosition,
  sftStepsPerEpoch,
  sftTotalSteps,
  type SftExample,
  type SftPlan,
} from '../lib/sft/logic.ts';

export interface SftOutcome {
  status: 'completed' | 'stopped';
  runId: string;
  runDir: string;
  /** The final (or, when stopped, the newest) checkpoint. */
  checkpoint: { path: string; step: number; sha256: string } | null;
  summary: string;
  message?: string;
}

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
      const was = state.dataset_position,
        now = sftPosition(plan, state.step);
      const diff = (['train_size', 'rollout_batch_size', 'shuffle', 'seed'] as const).filter((k) => was[k] !== now[k]);
      if (diff.length)
        throw new ConfigError(
          `run ${runId}: its checkpoint at step ${state.step} was taken with ${diff.map((k) => `${k} = ${String(was[k])}`).join(', ')}, but the data now give ${diff.map((k) => `${k} = ${String(now[k])}`).join(', ')}; resume with the same data files and settings, or start a new run (another trainer.experiment_name or trainer.run_dir)`,
        );
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
    let ck = last;
    for (let step = start + 1; step <= total; step++) {
      if (opts.signal?.aborted)
        return {
          status: 'stopped',
          runId,
          runDir,
          checkpoint: ck,
          summary: await sftSummary(store, runId, ck, !!lora),
          message: 'interrupted',
        };
      const t0 = performance.now();
      const batch = collate(
        sftBatchIndices(plan, step).map((i) => units[i]),
        tok.pad,
      );
      let tokens = 0;
      for (let i = 0; i < batch.batchSize * batch.seqLen; i++)
        if (batch.responseMask[i] && i % batch.seqLen > 0) tokens++;
      const r = await trainer.step(batch, lrAt(settings.schedule, step, total));
      const values: Record<string, number> = {
        'sft/tokens': tokens,
        'perf/step_time_s': (performance.now() - t0) / 1000,
      };
      for (const [name, key] of METRICS) if (r.metrics[key] !== undefined) values[name] = r.metrics[key];
      await store.insertMetrics(
        Object.entries(values).map(([name, value]) => ({ runId, step, name, value, stage: 'sft' })),
      );
      if (r.skipped)
        log.warn(
          { step, grad_norm: r.metrics.grad_norm },
          `step ${step}: the gradient norm is not finite; the update was skipped`,
        );
      log.info(
        { step, ...values },
        `step ${step}/${total}: loss ${values['sft/loss']?.toFixed(4)}, token accuracy ${values['sft/token_acc']?.toFixed(3)}`,
      );
      opts.bar?.update({ step, totalSteps: total, loss: values['sft/loss'], stepTimeS: values['perf/step_time_s'] });
      void tb?.sync().catch((e: unknown) => log.warn({ err: e }, `tensorboard logger: ${errorMessage(e)}`));
      crashPoint('sft:trained');
      const save = step === total || (cfg.trainer.save_freq > 0 && step % cfg.trainer.save_freq === 0);
      if (save)
        ck = await writeSftCheckpoint(cfg, store, {
          runId,
          runDir,
          step,
          total,
          plan,
          model,
          weights: trainer.weightsView() as Weights,
          optimizer: trainer.getOptimizerState(),
          assetsFrom,
          lora,
        });
    }
    await store.setRunStatus(runId, 'completed');
    await tb?.finish(true);
    tb = null;
    return { status: 'completed', runId, runDir, checkpoint: ck, summary: await sftSummary(store, runId, ck, !!lora) };
  } catch (e) {
    await store.setRunStatus(runId, 'failed', { error: errorMessage(e) }).catch(() => undefined);
    throw e;
  } finally {
    await tb?.finish(false).catch(() => undefined);
    await db.close();
  }
}

/** The newest checkpoint of the run whose directory is still there. */
async function latestUsableCheckpoint(
  store: Store,
  runId: string,
): Promise<{ path: string; step: number; sha256: string } | null> {
  // a checkpoint renamed into place whose row was not yet written (killed in between) is not used: its step is redone and rewrites it
  const rows = (await store.listCheckpoints(runId)).sort((a, b) => b.step - a.step);
  for (const r of rows)
    if (existsSync(join(r.path, 'trainer_state.json'))) return { path: r.path, step: r.step, sha256: r.sha256 };
  return null;
}

interface CheckpointArgs {
  runId: string;
  runDir: string;
  step: number;
  total: number;
  plan: SftPlan;
  model: ModelConfig;
  /** The trained parameters: every weight, or (LoRA) the adapters. */
  weights: Weights;
  optimizer: OptimizerState;
  assetsFrom: string | null;
  lora: PolicyLora | null;
}

/**
 * checkpoints/global_step_N: the actor as a model directory (written as policy/vN, linked into the
 * checkpoint, then removed; with LoRA a PEFT adapter directory), reference/ = policy v0 (the initial
 * model; with LoRA the B = 0 adapter, i.e. the base), trainer_state.json; then
 * the store row, then checkpoints beyond trainer.save_limit are removed (oldest first).
 */
async function writeSftCheckpoint(
  cfg: Config,
  store: Store,
  a: CheckpointArgs,
): Promise<{ path: string; step: number; sha256: string }> {
  const actorDir = policyDir(a.runDir, a.step);
  const metadata = { policy_version: String(a.step) };
  const { weightsSha256 } = a.lora
    ? await saveAdapter(actorDir, a.model, a.lora.config, a.weights, {
        optimizer: a.optimizer,
        overwrite: true,
        basePath: resolve(a.lora.baseDir),
        metadata,
      })
    : await saveCheckpoint(actorDir, a.model, a.weights, {
        optimizer: a.optimizer,
        overwrite: true,
        assetsFrom: a.assetsFrom,
        metadata,
      });
  const lrState = { optimizer_steps: a.optimizer.step, total_steps: a.total };
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
async function sftSummary(
  store: Store,
  runId: string,
  ck: { path: string; step: number; sha256: string } | null,
  lora: boolean,
): Promise<string> {
  const names = ['sft/loss', 'sft/token_acc', 'sft/grad_norm'];
  const ms = await store.getMetrics(runId, names);
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
  const lines = [formatTable(rows), ''];
  if (ck) {
    lines.push(
      lora
        ? `final checkpoint: ${ck.path} (step ${ck.step}, sha256 ${ck.sha256}); its actor/ is a LoRA adapter (PEFT layout): \`rlstream export ${ck.path} --merge --out DIR\` writes the merged model, an actor.model.path for rlstream train`
        : `final checkpoint: ${ck.path} (step ${ck.step}, sha256 ${ck.sha256}); its actor/ is a model directory for actor.model.path`,
    );
  }
  return lines.join('\n');
}
