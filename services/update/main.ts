/**
 * Update stage: trains the policy. At start it publishes policy version 0 (the seeded initial
 * weights, or actor.model.path) unless the run already has versions; on restart it resumes from
 * its last version (weights + AdamW state + KL/LR state). Each training step's update groups are
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
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { forStage } from '../../lib/log.ts';
import { runStage, type Pipeline, type StageRun } from '../../lib/pipeline/runtime.ts';
import { StageMetrics } from '../../lib/pipeline/metrics.ts';
import {
  tokenizerFor,
  policyModelConfig,
  criticModelConfig,
  experienceScorerOptions,
  policyLora,
  sharedBaseWeights,
} from '../../lib/pipeline/policy.ts';
import { loadAdapter, saveAdapter } from '../../lib/model/checkpoint.ts';
import {
  IntegrityError,
  versionsToPrune,
  ARTIFACT_KINDS,
  type ArtifactKind,
  type Executor,
} from '../../lib/policy-store/index.ts';
import type { ModelConfig } from '../../lib/model/index.ts';
import { resolveCriticModel } from '../../lib/config/index.ts';
import { loadStageState, saveStageState, PendingBatch, stagesWithState, txOf } from '../../lib/pipeline/stage-state.ts';
import {
  keptCheckpoints,
  klCoefAt,
  rebuildCheckpointDirs,
  resumeHint as runResumeHint,
  saveRunCheckpoint,
  trainerStateAt,
} from '../../lib/pipeline/run-checkpoints.ts';
import { crashPoint } from '../../lib/pipeline/crash-points.ts';
import {
  datasetPosition,
  describePosition,
  removeTempCheckpoints,
  readCheckpointPath,
  verifyCheckpointFiles,
} from '../../lib/pipeline/checkpoints.ts';
import {
  createTrainer,
  initWeights,
  saveCheckpoint,
  loadCheckpoint,
  checkpointSha256,
  valueModelFrom,
  type Trainer,
  type TrainerOptions,
  type Weights,
} from '../../lib/model/index.ts';
import { Scorer } from '../../lib/model/score.ts';
import { PolicyImages } from '../../lib/pipeline/images.ts';
import { PixelCache } from '../../lib/data/pixel-cache.ts';
import { policyId, type UpdateGroup, type PolicyVersion } from '../../lib/contracts/index.ts';
import { lrAt } from '../../lib/optim/lr-schedule.ts';
import { trainerSettings, trainsNft } from '../../lib/pipeline/trainer-settings.ts';
import { emaUpdate } from '../../lib/rl/ema.ts';
import { ConfigError, RlError } from '../../lib/errors.ts';
import { totalSteps as planTotalSteps, planFromConfig } from '../../lib/pipeline/plan.ts';
import {
  checkBatchArithmetic,
  packPolicyBatches,
  packValueBatches,
  type PackOptions,
  shouldCheckpoint,
  nftTargets,
  versionsInUse,
  type ControllerProgress,
} from './logic.ts';

export interface UpdateState {
  version: number;
  optimizerSteps: number;
  /** Consumer positions in the updates topic ("<topic>/<partition>" → next offset), for checkpoint rows. */
  positions?: Record<string, number>;
  /** trainer.load_checkpoint_path the run started from (null: a fresh start). */
  initFrom?: string | null;
}

export interface UpdateOptions {
  trainSize: number;
  /**
   * Replay: sha256 of the source run's policy versions. A sample of version v counts as on-policy
   * (old log-probs recomputed, as the source did) only when this run's version v has those exact
   * bytes; otherwise the importance ratio uses its recorded behaviour log-probs.
   */
  behaviourSha?: ReadonlyMap<number, string>;
  /** Replay: the initial policy (v0) directory to start from instead of actor.model.path / init_seed. */
  initialWeightsDir?: string;
}

/** Policy losses the ONNX training graph implements (lib/model/loss.ts); the others are in lib/rl only. */
const SUPPORTED_LOSSES = new Set([
  'vanilla',
  'gspo',
  'sapo',
  'gpg',
  'cispo',
  'reinforce',
  'geo_mean',
  'clip_cov',
  'kl_cov',
  'nft',
]);

function bucketOf(step: number): string {
  return `step:${String(step).padStart(8, '0')}`;
}

export async function startUpdate(p: Pipeline, opts: UpdateOptions): Promise<StageRun> {
  const cfg = p.cfg;
  if (!SUPPORTED_LOSSES.has(cfg.algorithm.policy_loss))
    throw new ConfigError(
      `algorithm.policy_loss = ${cfg.algorithm.policy_loss} is available in lib/rl but not yet in the ONNX training graph; the training graph supports: ${[...SUPPORTED_LOSSES].join(', ')}`,
    );
  const arith = checkBatchArithmetic({
    rolloutBatchSize: cfg.data.rollout_batch_size,
    n: cfg.rollout.n,
    globalBatchSize: cfg.actor.global_batch_size,
    microBatchSize: cfg.actor.micro_batch_size_per_device_for_update,
  });
  const tok = tokenizerFor(cfg);
  const model = policyModelConfig(cfg, tok);
  // every policy version is a complete model directory: the source's generation config and tokenizer files go along
  const assetsFrom = cfg.actor.model.path;
  const plan = planFromConfig(cfg, p.runId, opts.trainSize, 0);
  const totalSteps = planTotalSteps(plan);
  const totalOptSteps = Math.max(1, totalSteps * arith.miniBatches * cfg.actor.ppo_epochs);
  const log = forStage(p.log, 'update');
  const metrics = new StageMetrics(p, 'update');
  const scorer = new Scorer(model, experienceScorerOptions(cfg));
  // a vision policy (and critic) score and train each row with its prompt's images
  const pixelCache = new PixelCache();
  const images = new PolicyImages(model, pixelCache);
  const criticImages = cfg.critic.enable === true ? new PolicyImages(criticModelConfig(cfg, tok), pixelCache) : null;
  const leftovers = await removeTempCheckpoints(p.runDir);
  if (leftovers.length)
    log.warn(
      { removed: leftovers },
      `removed ${leftovers.length} half-written checkpoint(s) left by an interrupted write`,
    );
  /**
   * A stored version's directory (policy, critic or EMA), every file checked against the sha256
   * recorded when it was written; a damaged one stops the stage saying how to resume from the last
   * good checkpoint.
   */
  async function storedDir(kind: ArtifactKind, version: number, db: Executor = p.db.db): Promise<string | null> {
    try {
      return await p.policies.get(kind, version, db);
    } catch (e) {
      if (e instanceof IntegrityError)
        throw new RlError(`${e.message}. ${await resumeHint(db)}`, {
          code: 'ERR_INTEGRITY',
          cause: e,
          details: e.details,
        });
      throw e;
    }
  }
  async function versionDir(kind: ArtifactKind, version: number, db: Executor = p.db.db): Promise<string> {
    const dir = await storedDir(kind, version, db);
    if (!dir)
      throw new ConfigError(
        `${kind} version ${version} of run ${p.runId} is not in the policy store (${p.policies.kind === 'filesystem' ? p.policies.writeDir(kind, version) : "the run's database"}); it was never written or was pruned. ${await resumeHint(db)}`,
      );
    return dir;
  }
  const checkpoints = { runId: p.runId, runDir: p.runDir, store: p.store };
  const resumeHint = (db: Executor) => runResumeHint(checkpoints, txOf(db));
  /** Writes a version of `kind` into the policy store (before any event names it). Returns the sha256 of its model.safetensors. */
  async function storeVersion(
    kind: ArtifactKind,
    version: number,
    cfgOf: ModelConfig,
    weights: Weights,
    extra: { optimizer?: import('../../lib/model/index.ts').OptimizerState; metadata?: Record<string, string> },
    db: Executor = p.db.db,
  ): Promise<string> {
    if (kind === 'policy' && lora) {
      // LoRA: a policy version is the adapter only, in PEFT layout (`weights` are the adapters)
      await saveAdapter(p.policies.writeDir(kind, version), cfgOf, lora.config, weights, {
        ...extra,
        overwrite: true,
        basePath: resolve(lora.baseDir),
      });
      return (await p.policies.put(kind, version, db)).find((f) => f.name === 'adapter_model.safetensors')!.sha256;
    }
    // a complete model directory: the source's generation config and tokenizer files go with the weights
    await saveCheckpoint(p.policies.writeDir(kind, version), cfgOf, weights, { ...extra, overwrite: true, assetsFrom });
    const files = await p.policies.put(kind, version, db);
    return files.find((f) => f.name === 'model.safetensors')!.sha256;
  }
  let state = (await loadStageState<UpdateState>(p.db.db, p.runId, 'update')) ?? null;
  const loadPath = cfg.trainer.load_checkpoint_path ? resolve(cfg.trainer.load_checkpoint_path) : null;
  const others = state ? [] : await stagesWithState(p.db.db, p.runId);
  if ((state || others.length) && !cfg.trainer.find_last_checkpoint) {
    const last = await p.store.latestCheckpoint(p.runId);
    throw new ConfigError(
      `run ${p.runId} already has state in ${p.db.where} (${state ? `update stage at policy version ${state.version}` : `stages ${others.join(', ')}`}${last ? `, last checkpoint ${last.path}` : ''}) and trainer.find_last_checkpoint = false refuses to continue it. ` +
        'To resume it, set trainer.find_last_checkpoint=true (the default); to start over, use a new run (another trainer.run_dir, or pipeline.run_id=…); ' +
        `to start a new run from one of its checkpoints, give that run trainer.load_checkpoint_path=${last ? last.path : '<run_dir>/checkpoints/global_step_N'}`,
    );
  }
  if (state && (state.initFrom ?? null) !== loadPath) {
    throw new ConfigError(
      `run ${p.runId} already has state (update stage at policy version ${state.version}, started ${state.initFrom ? `from ${state.initFrom}` : 'from scratch'}); trainer.load_checkpoint_path = ${loadPath ?? 'null'} applies to a new run only — ` +
        `resume this run with ${state.initFrom ? `trainer.load_checkpoint_path=${state.initFrom}` : 'trainer.load_checkpoint_path unset'}, or start a new run (pipeline.run_id=… or another trainer.run_dir) from the checkpoint`,
    );
  }
  const settings = trainerSettings(cfg);
  let trainer: Trainer;
  /** The policy version the in-memory trainer (and critic, EMA) holds. */
  let trainerVersion = -1;
  let currentSha = '';
  // LoRA (actor.model.lora): the base is read once and frozen; the trainer trains and versions carry the adapters
  const lora = policyLora(cfg);
  const baseWeights = (): Promise<Weights> => sharedBaseWeights(lora!.baseDir);
  const trainerOpts = {
    ...settings.actor.trainer,
    model,
    ...(lora ? { lora: lora.config } : {}),
    loss: settings.policyLoss,
  };
  const isNft = trainsNft(cfg);
  const initialWeights = async (): Promise<Weights> => {
    if (lora) return baseWeights();
    const dir = opts.initialWeightsDir ?? cfg.actor.model.path;
    return dir
      ? (await loadCheckpoint(dir, { optimizer: false })).weights
      : initWeights(model, cfg.actor.model.init_seed, { visionStd: cfg.actor.model.vision.init_std });
  };
  /** A trainer holding a stored policy version (weights or, with LoRA, the base + the version's adapter) and its AdamW state. */
  async function trainerFromVersion(dir: string): Promise<{ trainer: Trainer; sha: string }> {
    if (lora) {
      const ad = await loadAdapter(dir, model, { optimizer: true, expect: lora.config });
      return {
        trainer: createTrainer({
          ...trainerOpts,
          weights: await baseWeights(),
          adapter: ad.adapter,
          optimizerState: ad.optimizer,
        }),
        sha: ad.weightsSha256,
      };
    }
    const ck = await loadCheckpoint(dir, { optimizer: true });
    return {
      trainer: createTrainer({ ...trainerOpts, weights: ck.weights, optimizerState: ck.optimizer }),
      sha: ck.weightsSha256,
    };
  }
  if (state) {
    ({ trainer, sha: currentSha } = await trainerFromVersion(await versionDir('policy', state.version)));
    trainerVersion = state.version;
    const last = await p.store.latestCheckpoint(p.runId);
    const at = describePosition(datasetPosition(plan, state.version));
    const from =
      last && last.step === state.version && existsSync(last.path)
        ? `from checkpoint global_step_${last.step} (sha256 ${currentSha})`
        : `from policy version ${state.version} (${p.policies.kind === 'filesystem' ? p.policies.writeDir('policy', state.version) : 'policy store: postgres'}, sha256 ${currentSha})${last ? `; last checkpoint global_step_${last.step}` : ''}`;
    log.info({ ...datasetPosition(plan, state.version) }, `resumed at ${at}, ${from}`);
  } else if (loadPath) {
    // a new run started from a checkpoint: its weights and AdamW state, the step (dataset
    // position) and LR schedule position it was taken at; v0 keeps the source's initial policy (KL reference)
    const src = readCheckpointPath(loadPath);
    // an rlstream checkpoint records its weights' sha256 (trainer_state.json): a damaged one is refused before it is read
    if (src.state) await verifyCheckpointFiles(loadPath, src.state);
    const ck = await loadCheckpoint(src.actorDir);
    const start = src.state?.step ?? 0;
    if (start > 0) {
      const ref = src.referenceDir
        ? (await loadCheckpoint(src.referenceDir, { optimizer: false })).weights
        : await initialWeights();
      await storeVersion('policy', 0, model, ref, { metadata: { policy_version: '0' } });
    }
    trainer = createTrainer({ ...trainerOpts, weights: ck.weights, optimizerState: ck.optimizer });
    const optimizerSteps = Number(src.state?.lr_state.optimizer_steps ?? ck.optimizer?.step ?? 0);
    state = { version: start, optimizerSteps, positions: {}, initFrom: loadPath };
    if (cfg.critic.enable) {
      // the critic continues from the checkpoint's value model and AdamW state (written as this
      // run's critic version `start` before the state that says the run started, so a crash
      // here restarts from the checkpoint again); an rlstream checkpoint without one is refused
      // rather than silently pairing a trained policy with an untrained critic
      if (src.criticDir) {
        const c = await loadCheckpoint(src.criticDir, { optimizer: true });
        const cm = criticModelConfig(cfg, tok);
        if (
          c.config.hiddenSize !== cm.hiddenSize ||
          c.config.numHiddenLayers !== cm.numHiddenLayers ||
          c.config.vocabSize !== cm.vocabSize
        ) {
          throw new ConfigError(
            `trainer.load_checkpoint_path: the critic at ${src.criticDir} (d_model ${c.config.hiddenSize}, layers ${c.config.numHiddenLayers}, vocab ${c.config.vocabSize}) does not match critic.model (d_model ${cm.hiddenSize}, layers ${cm.numHiddenLayers}, vocab ${cm.vocabSize})`,
          );
        }
        await storeVersion('critic', start, cm, c.weights, { optimizer: c.optimizer });
        log.info({ critic: src.criticDir }, `critic restored from ${src.criticDir} (weights and optimizer state)`);
      } else if (src.state && !resolveCriticModel(cfg).path) {
        throw new ConfigError(
          `trainer.load_checkpoint_path: ${loadPath} has no critic (critic/ is missing: its run trained without one), but critic.enable = true (algorithm.adv_estimator = ${cfg.algorithm.adv_estimator} trains a value model). ` +
            `Give critic.model.path a value-model directory to start the critic from, or load the checkpoint's policy weights as a new model (trainer.load_checkpoint_path=${join(loadPath, 'actor')}) to start with a fresh critic at step 0`,
        );
      } else if (src.state)
        log.warn(
          { critic: resolveCriticModel(cfg).path },
          `${loadPath} has no critic; the critic starts from critic.model.path`,
        );
    }
    currentSha = await writeVersion(start);
    trainerVersion = start;
    await saveStageState(p.db.db, p.runId, 'update', state);
    log.info(
      { ...datasetPosition(plan, start) },
      `resumed at ${describePosition(datasetPosition(plan, start))}, from checkpoint ${loadPath} (sha256 ${currentSha})`,
    );
  } else {
    trainer = createTrainer({ ...trainerOpts, weights: await initialWeights() });
    state = { version: 0, optimizerSteps: 0, positions: {}, initFrom: null };
    currentSha = await writeVersion(0);
    trainerVersion = 0;
    await saveStageState(p.db.db, p.runId, 'update', state);
  }
  // the critic (value model, clipped value loss) when critic.enable (GAE): trained on each step's
  // returns after the policy, saved as <run_dir>/critic/vNNNNNN next to each policy version
  let critic: Trainer | null = null;
  let criticOpts: TrainerOptions | null = null;
  if (cfg.critic.enable) {
    const cm = criticModelConfig(cfg, tok);
    const copts = (criticOpts = { ...settings.critic.trainer, model: cm, loss: settings.valueLoss });
    // this run's critic version (a resume, or one restored from trainer.load_checkpoint_path); a
    // missing one means a first start (or critic.enable turned on for a run that had none)
    const savedDir = await storedDir('critic', state.version);
    const saved = savedDir ? await loadCheckpoint(savedDir, { optimizer: true }) : null;
    if (saved) critic = createTrainer({ ...copts, weights: saved.weights, optimizerState: saved.optimizer });
    else {
      // critic.model.path, else the actor's model directory (a causal LM gets a fresh score head), else a fresh model
      const cpath = resolveCriticModel(cfg).path ?? cfg.actor.model.path;
      const cseed = cfg.critic.model.init_seed ?? cfg.actor.model.init_seed + 1;
      critic = createTrainer({
        ...copts,
        ...(cpath
          ? { weights: valueModelFrom(await loadCheckpoint(cpath, { optimizer: false }), cseed).weights }
          : { weights: initWeights(cm, cseed, { visionStd: cfg.actor.model.vision.init_std }) }),
      });
      await storeVersion('critic', state.version, cm, critic.getWeights(), { optimizer: critic.getOptimizerState() });
    }
  }

  // EMA of the policy weights (algorithm.ema): stored next to each version (kind ema; <run_dir>/ema/ on a filesystem)
  let ema: Map<string, Float32Array> | null = null;
  if (cfg.algorithm.ema.enable) {
    const dir = await storedDir('ema', state.version);
    ema = dir ? (await loadCheckpoint(dir, { optimizer: false })).weights : null;
    if (!ema) {
      ema = trainer.getWeights();
      await storeVersion('ema', state.version, model, ema, {});
    }
  }
  if (p.policies.kind === 'postgres') {
    const rebuilt = await rebuildCheckpointDirs(
      checkpoints,
      cfg.trainer.save_limit,
      async (v) => ({
        actor: await versionDir('policy', v),
        critic: cfg.critic.enable ? await storedDir('critic', v) : null,
      }),
      () => versionDir('policy', 0),
    );
    for (const { step, path } of rebuilt)
      log.info({ step, path }, `checkpoint global_step_${step} rebuilt from the run's database at ${path}`);
  }
  // (re)publish the current version: idempotent by id, and covers a crash between save and publish
  await p.bus.produce([p.message('policy', await versionRecord(state.version, Date.now()))]);

  async function writeVersion(version: number, db: Executor = p.db.db): Promise<string> {
    // no run id in the metadata: equal weights give equal bytes (and sha256) in every run (replay, resume from a checkpoint)
    return storeVersion(
      'policy',
      version,
      model,
      trainer.getWeights(),
      { optimizer: trainer.getOptimizerState(), metadata: { policy_version: String(version) } },
      db,
    );
  }
  /**
   * Brings the in-memory trainer (and critic, EMA) back to the committed version: a batch that
   * trained and then failed before committing (a lost database connection, a retriable error)
   * is redelivered, and must train from the committed weights again, not from its own result.
   */
  async function restore(version: number, db: Executor): Promise<void> {
    ({ trainer, sha: currentSha } = await trainerFromVersion(await versionDir('policy', version, db)));
    if (critic && criticOpts) {
      const saved = await loadCheckpoint(await versionDir('critic', version, db), { optimizer: true });
      critic = createTrainer({ ...criticOpts, weights: saved.weights, optimizerState: saved.optimizer });
    }
    if (ema) ema = (await loadCheckpoint(await versionDir('ema', version, db), { optimizer: false })).weights;
    trainerVersion = version;
    log.warn(
      { version },
      `restored the trainer to the committed policy version ${version} (a batch failed after training)`,
    );
  }
  async function versionRecord(
    version: number,
    nowMs: number,
    extra: Partial<PolicyVersion> = {},
    db: Executor = p.db.db,
  ): Promise<PolicyVersion> {
    const dir = await versionDir('policy', version, db);
    return {
      run_id: p.runId,
      id: policyId(p.runId, version),
      step: version,
      policy_version: version,
      parent_version: version === 0 ? null : version - 1,
      checkpoint_path: p.policies.kind === 'filesystem' ? dir : `postgres:policy/${version}`,
      sha256: await checkpointSha256(dir),
      format: 'safetensors',
      size_bytes: 0,
      created_ms: nowMs,
      consumed: [],
      groups: 0,
      samples: 0,
      tokens: 0,
      ...extra,
    };
  }

  const packing: PackOptions = {
    miniBatchSize: cfg.actor.global_batch_size,
    padTokenId: model.padTokenId,
    lossScaleFactor: cfg.data.max_response_length,
    vppo: cfg.algorithm.vppo.enable,
    klLoss: cfg.algorithm.use_kl_loss,
  };

  async function trainStep(step: number, groups: UpdateGroup[]): Promise<Record<string, number>> {
    const kept = groups.filter((g) => !g.filtered);
    const version = state!.version;
    const nft = isNft ? nftTargets(kept, cfg.algorithm.nft.correct_key) : null;
    // old log-probs: recomputed with the current weights for on-policy samples; stale samples
    // (behaviour version < current) keep their behaviour log-probs (decoupled PPO importance ratio)
    const onPolicy = !opts.behaviourSha || opts.behaviourSha.get(version) === currentSha;
    const fresh = kept.flatMap((g) =>
      g.policy_version === version && onPolicy
        ? g.samples.map((x) => ({ id: x.id, prompt: g.prompt_ids, response: x.response_ids, g }))
        : [],
    );
    const old = new Map<string, Float32Array>();
    const px = await images.byGroup(kept);
    if (fresh.length) {
      // LoRA: the adapted policy's weights W + s·B·A (the base is not copied for the other tensors)
      const sc = await scorer.score(
        lora ? await trainer.mergedWeights() : (trainer.weightsView() as Weights),
        fresh.map((f) => ({ prompt: f.prompt, response: f.response, images: px.get(f.g) })),
        { temperature: cfg.rollout.temperature, entropy: false },
      );
      fresh.forEach((f, i) => old.set(f.id, sc[i].logprobs));
    }
    const sums: Record<string, number> = {};
    let n = 0,
      tokens = 0;
    for (let epoch = 0; epoch < cfg.actor.ppo_epochs; epoch++) {
      for (const { batch, tokens: nt } of packPolicyBatches(kept, { oldLogprobs: old, nft, images: px }, packing)) {
        state!.optimizerSteps++;
        const lr = lrAt(settings.actor.schedule, state!.optimizerSteps, totalOptSteps);
        const r = await trainer.step(batch, lr);
        for (const [k, v] of Object.entries(r.metrics)) sums[k] = (sums[k] ?? 0) + v;
        n++;
        tokens += nt;
      }
    }
    const m: Record<string, number> = {};
    for (const [k, v] of Object.entries(sums)) m[`actor/${k}`] = v / n;
    if (critic) {
      const csums: Record<string, number> = {};
      let cn = 0;
      for (let epoch = 0; epoch < (cfg.critic.ppo_epochs ?? cfg.actor.ppo_epochs); epoch++) {
        for (const { batch } of packValueBatches(kept, await criticImages!.byGroup(kept), packing)) {
          const lr = lrAt(settings.critic.schedule, critic.getOptimizerState().step + 1, totalOptSteps);
          const r = await critic.step(batch, lr);
          for (const [k, v] of Object.entries(r.metrics)) csums[k] = (csums[k] ?? 0) + v;
          cn++;
        }
      }
      for (const [k, v] of Object.entries(csums)) m[`critic/${k}`] = v / cn;
    }
    m['actor/approx_kl'] = m['actor/ppo_kl'] ?? 0;
    m['actor/clipfrac'] = m['actor/pg_clipfrac'] ?? 0;
    m['actor/lr'] = lrAt(settings.actor.schedule, Math.max(1, state!.optimizerSteps), totalOptSteps);
    const stal = kept.map((g) => version - g.policy_version);
    m['staleness/mean'] = stal.reduce((a, b) => a + b, 0) / Math.max(1, stal.length);
    m['staleness/max'] = Math.max(0, ...stal);
    m['perf/update_tokens'] = tokens;
    return m;
  }

  /** When this process published its last policy version (throughput is measured between versions). */
  let lastVersionMs: number | null = null;
  return runStage(p, 'update', ['updates'], async (records, ctx) => {
    metrics.beginBatch(ctx.waitedMs);
    const st = (await loadStageState<UpdateState>(ctx.db, p.runId, 'update')) ?? state!;
    state = st;
    if (trainerVersion !== st.version) await restore(st.version, ctx.db);
    const positions = st.positions ?? (st.positions = {});
    for (const r of records) {
      const k = `${r.message.topic}/${r.message.partition}`;
      positions[k] = Math.max(positions[k] ?? 0, r.message.offset + 1);
    }
    const pending = new PendingBatch(ctx.db, p.runId, 'update');
    const fresh = records.filter((r) => (r.value as UpdateGroup).step > st.version);
    pending.add(
      fresh.map((r) => ({
        bucket: bucketOf((r.value as UpdateGroup).step),
        id: (r.value as UpdateGroup).id,
        payload: r.message.value,
        headers: r.message.headers,
      })),
    );
    while (st.version < totalSteps) {
      // stopping (SIGTERM): the steps trained so far are kept, the rest of the batch's groups wait in stage_pending
      if (ctx.signal.aborted) break;
      const step = st.version + 1;
      const items = await pending.items(bucketOf(step));
      const groups: UpdateGroup[] = [];
      for (const it of items) groups.push(await p.codecs.updates.decode(it.payload, it.headers));
      if (groups.filter((g) => !g.filtered).length < cfg.data.rollout_batch_size) break;
      crashPoint('update:start');
      const t0 = performance.now();
      trainerVersion = -1; // mid-step: a failure from here on restores the committed version
      const m = await trainStep(step, groups);
      const tTrain = performance.now();
      crashPoint('update:trained');
      st.version = step;
      trainerVersion = step;
      currentSha = await writeVersion(step, ctx.db);
      crashPoint('update:version-written');
      if (critic)
        await storeVersion(
          'critic',
          step,
          critic.model,
          critic.getWeights(),
          { optimizer: critic.getOptimizerState() },
          ctx.db,
        );
      if (ema) {
        const next = emaUpdate(
          Object.fromEntries(ema),
          Object.fromEntries(trainer.weightsView()),
          cfg.algorithm.ema.decay,
        );
        ema = new Map(Object.entries(next).map(([k, v]) => [k, Float32Array.from(v)]));
        await storeVersion(
          'ema',
          step,
          model,
          ema,
          { metadata: { policy_version: String(step), ema_decay: String(cfg.algorithm.ema.decay) } },
          ctx.db,
        );
      }
      const rec = await versionRecord(
        step,
        Date.now(),
        {
          groups: groups.length,
          samples: groups.reduce((a, g) => a + g.samples.length, 0),
          tokens: m['perf/update_tokens'] ?? 0,
          consumed: Object.entries(positions).map(([k, next]) => ({
            topic: k.slice(0, k.lastIndexOf('/')),
            partition: Number(k.slice(k.lastIndexOf('/') + 1)),
            next_offset: next,
          })),
        },
        ctx.db,
      );
      if (shouldCheckpoint(step, totalSteps, cfg.trainer.save_freq)) {
        crashPoint('checkpoint:start');
        const ts = trainerStateAt({
          cfg,
          runId: p.runId,
          plan,
          step,
          sha256: rec.sha256,
          positions: st.positions ?? {},
          klCoef: await klCoefAt(cfg, ctx.db, p.runId, step),
          schedule: settings.actor.schedule,
          optimizerSteps: st.optimizerSteps,
          totalOptimizerSteps: totalOptSteps,
        });
        // temporary name, fsync, rename — then the row; a half-written one is never listed
        await saveRunCheckpoint(
          checkpoints,
          ts,
          {
            actor: p.policies.writeDir('policy', step),
            reference: await versionDir('policy', 0, ctx.db),
            critic: critic ? p.policies.writeDir('critic', step) : null,
          },
          cfg.trainer.save_limit,
          ctx.tx,
        );
      }
      // throughput of the whole pipeline over this step: its samples (and their prompt + response
      // tokens) ÷ the wall time since the previous version (none for the first step of a process)
      const nowMs = Date.now();
      if (lastVersionMs !== null && nowMs > lastVersionMs) {
        const kept = groups.filter((g) => !g.filtered);
        const samples = kept.reduce((a, g) => a + g.samples.length, 0);
        const tokens = kept.reduce(
          (a, g) => a + g.samples.reduce((t, x) => t + g.prompt_ids.length + x.response_ids.length, 0),
          0,
        );
        const seconds = (nowMs - lastVersionMs) / 1000;
        m['perf/samples_per_second'] = samples / seconds;
        m['perf/tokens_per_second'] = tokens / seconds;
      }
      lastVersionMs = nowMs;
      metrics.set(step, m);
      metrics.add(step, {}, { compute: tTrain - t0, checkpoint: performance.now() - tTrain });
      ctx.emit('policy', rec);
      p.telemetry?.policyVersion('update', step);
      pending.settle(bucketOf(step));
      log.info(
        { step, reward: undefined, pg_loss: m['actor/pg_loss'], ms: Math.round(tTrain - t0) },
        `step ${step} trained`,
      );
    }
    await metrics.flush(ctx);
    await ctx.flush();
    await saveStageState(ctx.db, p.runId, 'update', st);
    // only now (Kafka: after the state that says they are trained) may a trained step's groups go
    await pending.persist();
    await pruneVersions(st.version, ctx.db);
  });

  /**
   * Removes the stored versions no longer needed (lib/policy-store/retention.ts): not the
   * reference, the newest two, those within pipeline.max_staleness, a kept checkpoint's, nor the
   * trainer.keep_policy_versions newest others. Critic and EMA versions go with their policy version.
   */
  async function pruneVersions(newest: number, db: Executor): Promise<void> {
    // through the batch's executor (PGlite: its transaction holds the one connection; it sees this batch's checkpoint row)
    const checkpointSteps = await keptCheckpoints(checkpoints, cfg.trainer.save_limit, txOf(db));
    // validation rounds the controller published and has not seen finish still sample with their version
    const inUse = versionsInUse(await loadStageState<ControllerProgress>(db, p.runId, 'controller'), newest);
    const opts = {
      newest,
      maxStaleness: cfg.pipeline.max_staleness,
      checkpointSteps,
      keepExtra: cfg.trainer.keep_policy_versions,
      inUse,
    };
    const pruned: number[] = [];
    for (const kind of ARTIFACT_KINDS) {
      for (const v of versionsToPrune(await p.policies.versions(kind, db), opts)) {
        await p.policies.remove(kind, v, db);
        if (kind === 'policy') pruned.push(v);
      }
    }
    if (pruned.length)
      log.debug(
        { pruned },
        `pruned policy versions ${pruned.join(', ')} (no longer needed; trainer.keep_policy_versions keeps more)`,
      );
  }
}
