/**
 * The learner of the update stage: the policy's trainer (weights + AdamW state; with LoRA the
 * frozen base and the trained adapters), the optional critic (value model, clipped value loss)
 * and the optional EMA of the policy weights, all at one policy version. It starts fresh, from a
 * checkpoint (trainer.load_checkpoint_path), or at a trainer base (the run's last checkpoint or
 * its start: weights and AdamW state) from which the update stage re-trains the logged steps up
 * to its committed version (`advance` after each); trains a step; and stores the version it holds
 * (policy, critic and EMA weights side by side in the policy store, lib/pipeline/run-versions.ts),
 * and at checkpoint steps its AdamW states (`storeOptimizers`).
 */
import { join } from 'node:path';
import type { Config } from '../config/index.ts';
import { resolveCriticModel } from '../config/index.ts';
import { ConfigError } from '../errors.ts';
import type { Logger } from '../log.ts';
import { isAdapterDir, loadAdapter } from '../model/checkpoint.ts';
import {
  createTrainer,
  initWeights,
  loadCheckpoint,
  valueModelFrom,
  type ModelConfig,
  type Trainer,
  type TrainBatch,
  type TrainerOptions,
  type Weights,
} from '../model/index.ts';
import type { UpdateGroup } from '../contracts/index.ts';
import type { ImagePixels } from '../data/images.ts';
import { Scorer } from '../model/score.ts';
import { packedWeights } from '../model/seal.ts';
import { linearCoefAt, lrAt } from '../optim/lr-schedule.ts';
import { emaUpdate } from '../rl/ema.ts';
import { readCheckpointPath, verifyCheckpointFiles } from './checkpoints.ts';
import { crashPoint } from './crash-points.ts';
import { criticModelDir, experienceScorerOptions, sharedBaseWeights, type PolicyLora } from './policy.ts';
import type { RunVersions } from './run-versions.ts';
import type { Executor } from './stage-state.ts';
import type { TrainerSettings } from './trainer-settings.ts';

/** What a learner is built from. */
export interface LearnerSetup {
  cfg: Config;
  /** The policy's and (critic.enable) the critic's model configs. */
  model: ModelConfig;
  criticModel: ModelConfig | null;
  settings: TrainerSettings;
  lora: PolicyLora | null;
  versions: RunVersions;
  log: Logger;
  /** Replay: the initial policy (v0) directory to start from instead of actor.model.path / init_seed. */
  initialWeightsDir?: string;
}

/**
 * Where a learner's trainer state comes from when a run resumes: a checkpoint directory (actor/
 * with optimizer.safetensors, critic/ when the run has one) at `step`, or (dir null) the run's
 * initial weights with a fresh optimizer at step 0. The EMA is the stored EMA version `step`.
 */
export interface TrainerBase {
  step: number;
  dir: string | null;
  /** sha256 of the policy weights at `step`. */
  sha: string;
}

/**
 * What the update stage's commits and resume need of a learner, a language policy's (Learner) or
 * an image policy's (lib/pipeline/image-policy.ts ImageLearner).
 */
export interface PolicyLearner {
  /** The stored version the in-memory state is; -1 while a step is half done. */
  readonly version: number;
  /** sha256 of that version's weights file. */
  sha: string;
  reset(base: TrainerBase): Promise<void>;
  advance(version: number, sha: string): void;
  /** `inMemoryOnly`: hand the version to this process's readers without writing its file (policy.version_files). */
  store(version: number, db: Executor, inMemoryOnly?: boolean): Promise<void>;
  storeOptimizers(version: number, db: Executor): Promise<void>;
  /** Hands the version it holds to this process's readers when the store has no file of it. */
  handOverUnstored(db: Executor): Promise<void>;
}

/**
 * Which stored version a learner's in-memory state is, shared by the language and the image
 * learner: `at` the version it started from or last stored, `dirty` once a step trained on it
 * (then it is no stored version until `store`, `reset` or `advance`).
 */
export abstract class LearnerVersion {
  /** The stored version the in-memory state started from. */
  protected at: number;
  /** A step has trained since: the in-memory state is no stored version. */
  protected dirty = false;
  /** sha256 of that version's weights file. */
  sha: string;

  protected constructor(version: number, sha: string) {
    this.at = version;
    this.sha = sha;
  }

  /** The policy version the in-memory state holds; -1 while a step is half done. */
  get version(): number {
    return this.dirty ? -1 : this.at;
  }

  /** The in-memory state is stored version `version`, whose weights have sha256 `sha`. */
  protected settle(version: number, sha: string): void {
    this.at = version;
    this.sha = sha;
    this.dirty = false;
  }

  /** Moves the EMA of the policy weights to the weights held now (algorithm.ema.decay); false when there is none. */
  protected abstract nextEma(): boolean;

  /**
   * A logged step re-trained (after a resume): the in-memory state is now `version`, whose stored
   * weights have sha256 `sha`; the EMA moves as when the version was first stored. Nothing is written.
   */
  advance(version: number, sha: string): void {
    this.nextEma();
    this.settle(version, sha);
  }
}

/** θ_ema ← d·θ_ema + (1 − d)·θ (lib/rl/ema.ts emaUpdate) on weight maps: the new EMA, a copy. */
export function emaStep(
  ema: ReadonlyMap<string, Float32Array>,
  weights: ReadonlyMap<string, Float32Array>,
  decay: number,
): Map<string, Float32Array> {
  const next = emaUpdate(Object.fromEntries(ema), Object.fromEntries(weights), decay);
  return new Map(Object.entries(next).map(([k, v]) => [k, Float32Array.from(v)]));
}

/** A mini-batch of packed tensors (services/update/logic.ts) and its token count. */
export interface LearnerBatch {
  batch: TrainBatch;
  tokens: number;
}

export class Learner extends LearnerVersion implements PolicyLearner {
  private critic: Trainer | null = null;
  private ema: Weights | null = null;
  private readonly scorer: Scorer;

  private constructor(
    private readonly s: LearnerSetup,
    private actor: Trainer,
    version: number,
    sha: string,
  ) {
    super(version, sha);
    this.scorer = new Scorer(s.model, experienceScorerOptions(s.cfg));
  }

  /**
   * A learner at trainer base `base` (the policy and critic with their AdamW state, the EMA):
   * the update stage then re-trains the logged steps after it (`advance` after each).
   */
  static async atBase(s: LearnerSetup, base: TrainerBase): Promise<Learner> {
    const src = base.dir ? await trainersOfCheckpoint(s, base.dir).catch((e) => resumeRefused(s, base.dir!, e)) : null;
    const actor = src?.actor ?? (await initialTrainer(s));
    const l = new Learner(s, actor, base.step, base.sha);
    l.critic = src?.critic ?? null;
    await l.openParts();
    return l;
  }

  /** A new run from seeded or given initial weights, stored as version 0. */
  static async fresh(s: LearnerSetup): Promise<Learner> {
    const l = new Learner(s, await initialTrainer(s), 0, '');
    l.sha = await l.storePolicy(0);
    await l.openParts();
    return l;
  }

  /**
   * A new run started from checkpoint `path`: its weights and AdamW state, at the step (dataset
   * position) it was taken at, stored as that version; v0 keeps the source's initial policy (the
   * KL reference). Returns the learner and the optimizer steps the LR schedule continues from.
   */
  static async fromCheckpoint(s: LearnerSetup, path: string): Promise<{ learner: Learner; optimizerSteps: number }> {
    const src = readCheckpointPath(path);
    // an rlstream checkpoint records its weights' sha256 (trainer_state.json): a damaged one is refused before it is read
    if (src.state) await verifyCheckpointFiles(path, src.state);
    const ck = await loadCheckpoint(src.actorDir);
    const start = src.state?.step ?? 0;
    if (start > 0) {
      const ref = src.referenceDir
        ? (await loadCheckpoint(src.referenceDir, { optimizer: false })).weights
        : await initialWeights(s);
      await s.versions.put('policy', 0, s.model, ref, { metadata: { policy_version: '0' } });
    }
    const l = new Learner(
      s,
      createTrainer({ ...actorOptions(s), weights: ck.weights, optimizerState: ck.optimizer }),
      start,
      '',
    );
    const optimizerSteps = Number(src.state?.lr_state.optimizer_steps ?? ck.optimizer?.step ?? 0);
    if (s.criticModel) l.critic = await criticFromCheckpoint(s, s.criticModel, path, src, start);
    l.sha = await l.storePolicy(start);
    await l.openParts();
    return { learner: l, optimizerSteps };
  }

  /**
   * Brings the trainer, critic and EMA back to trainer base `base` (a batch that trained and then
   * failed before committing: the update stage re-trains from there up to its committed version).
   */
  async reset(base: TrainerBase): Promise<void> {
    const l = await Learner.atBase(this.s, base);
    this.actor = l.actor;
    this.critic = l.critic;
    this.ema = l.ema;
    this.settle(base.step, base.sha);
  }

  /**
   * Old log-probs of a step's on-policy samples, by sample id, recomputed with the weights it
   * holds (LoRA: the merged W + s·B·A) at rollout.temperature. On-policy: drawn with the version
   * it holds, and (a replay, `behaviourSha`) that version has the source run's bytes. Stale
   * samples are left out: they keep their behaviour log-probs (the decoupled PPO importance ratio).
   */
  async oldLogprobs(
    kept: readonly UpdateGroup[],
    images: ReadonlyMap<UpdateGroup, ImagePixels[]>,
    behaviourSha?: ReadonlyMap<number, string>,
  ): Promise<Map<string, Float32Array>> {
    const onPolicy = !behaviourSha || behaviourSha.get(this.at) === this.sha;
    const fresh = kept.flatMap((g) =>
      g.policy_version === this.at && onPolicy ? g.samples.map((x) => ({ x, g })) : [],
    );
    const old = new Map<string, Float32Array>();
    if (!fresh.length) return old;
    const weights = this.s.lora ? await this.actor.mergedWeights() : (this.actor.weightsView() as Weights);
    const scores = await this.scorer.score(
      weights,
      fresh.map(({ x, g }) => ({ prompt: g.prompt_ids, response: x.response_ids, images: images.get(g) })),
      { temperature: this.s.cfg.rollout.temperature, entropy: false },
    );
    fresh.forEach(({ x }, i) => old.set(x.id, scores[i].logprobs));
    return old;
  }

  /**
   * One training step: `epochs` passes over the policy's mini-batches (one optimizer step each, at
   * the scheduled learning rate of optimizer step `optimizerSteps + 1, …` of `totalOptimizerSteps`),
   * then the critic's over its own. Returns the mean of each trainer metric (`actor/…`,
   * `critic/…`), `actor/lr`, the optimizer steps taken so far and the tokens trained on.
   */
  async trainStep(a: {
    policyBatches: () => LearnerBatch[];
    criticBatches: () => Promise<LearnerBatch[]>;
    epochs: number;
    criticEpochs: number;
    optimizerSteps: number;
    totalOptimizerSteps: number;
  }): Promise<{ metrics: Record<string, number>; optimizerSteps: number; tokens: number }> {
    const { settings } = this.s;
    this.dirty = true; // a failure from here on brings the trainer back from its base (update-resume.ts)
    const actor = new MetricMeans('actor/');
    let optimizerSteps = a.optimizerSteps,
      tokens = 0;
    const ent = settings.entropySchedule;
    const entropyCoeffAt = (step: number) =>
      ent ? linearCoefAt(ent.start, ent.end, step, a.totalOptimizerSteps) : null;
    for (let epoch = 0; epoch < a.epochs; epoch++) {
      for (const { batch, tokens: nt } of a.policyBatches()) {
        optimizerSteps++;
        const coef = entropyCoeffAt(optimizerSteps);
        const r = await this.actor.step(
          batch,
          lrAt(settings.actor.schedule, optimizerSteps, a.totalOptimizerSteps),
          coef === null ? {} : { entropyCoeff: coef },
        );
        actor.add(r.metrics);
        tokens += nt;
      }
    }
    const metrics = actor.means();
    if (this.critic) {
      const critic = new MetricMeans('critic/');
      for (let epoch = 0; epoch < a.criticEpochs; epoch++) {
        for (const { batch } of await a.criticBatches()) {
          const step = this.critic.getOptimizerState().step + 1;
          critic.add(
            (await this.critic.step(batch, lrAt(settings.critic.schedule, step, a.totalOptimizerSteps))).metrics,
          );
        }
      }
      Object.assign(metrics, critic.means());
    }
    metrics['actor/lr'] = lrAt(settings.actor.schedule, Math.max(1, optimizerSteps), a.totalOptimizerSteps);
    const coef = entropyCoeffAt(Math.max(1, optimizerSteps));
    if (coef !== null) metrics['actor/entropy_coeff'] = coef;
    return { metrics, optimizerSteps, tokens };
  }

  /**
   * Stores the trained state as `version`: the policy (its sha256 becomes `sha`; `inMemoryOnly`:
   * handed to the readers in this process with no file written, RunVersions.put), then the critic,
   * then the EMA of the policy weights updated with this version (algorithm.ema.decay).
   */
  async store(version: number, db: Executor, inMemoryOnly = false): Promise<void> {
    const { versions, model, cfg } = this.s;
    this.at = version;
    this.dirty = false;
    this.sha = await this.storePolicy(version, db, inMemoryOnly);
    crashPoint('update:version-written');
    if (this.critic) await versions.put('critic', version, this.critic.model, this.critic.getWeights(), {}, db);
    if (this.nextEma())
      await versions.put(
        'ema',
        version,
        model,
        this.ema!,
        { metadata: { policy_version: String(version), ema_decay: String(cfg.algorithm.ema.decay) } },
        db,
      );
  }

  /**
   * Stores the AdamW state of the policy (a LoRA policy: of its adapters) and of the critic as
   * checkpoint step `version`'s optimizer artifacts (a version itself holds weights only), written
   * from the trainers' own arrays (no step runs while they are written).
   */
  async storeOptimizers(version: number, db: Executor): Promise<void> {
    const { versions, model } = this.s;
    await versions.putOptimizer(
      'optimizer',
      version,
      model,
      this.actor.optimizerStateView(),
      this.actor.weightsView() as Weights,
      db,
    );
    if (this.critic)
      await versions.putOptimizer(
        'critic-optimizer',
        version,
        this.critic.model,
        this.critic.optimizerStateView(),
        this.critic.weightsView() as Weights,
        db,
      );
  }

  protected nextEma(): boolean {
    if (!this.ema) return false;
    this.ema = emaStep(this.ema, this.actor.weightsView(), this.s.cfg.algorithm.ema.decay);
    return true;
  }

  /** Writes the policy (no run id in the metadata: equal weights give equal bytes and sha256 in every run). */
  private storePolicy(version: number, db?: Executor, inMemoryOnly = false): Promise<string> {
    return this.s.versions.put(
      'policy',
      version,
      this.s.model,
      // kept in memory only: copied into one buffer, which a worker thread seals in place (lib/model/seal.ts)
      inMemoryOnly ? packedWeights(this.actor.weightsView()) : this.actor.getWeights(),
      { metadata: { policy_version: String(version) }, ...(inMemoryOnly ? { inMemoryOnly } : {}) },
      db,
    );
  }

  /**
   * Hands the version it holds (re-trained after a resume, `advance`) to the readers in this
   * process when the store has no file of it (a version kept in memory only when it was trained).
   */
  async handOverUnstored(db: Executor): Promise<void> {
    if (this.dirty || (await this.s.versions.stored(this.at, db))) return;
    this.s.versions.handOver(this.at, this.actor.getWeights(), this.sha);
  }

  /**
   * The critic (critic.enable) and EMA (algorithm.ema.enable) at this version: a critic already
   * set (from a checkpoint), the stored ones (a stored critic version holds weights: its AdamW
   * state starts fresh, as it did when that version was first written at a run's start), or a
   * first start's (also when one was turned on for a run that had none), stored as this version.
   */
  private async openParts(): Promise<void> {
    const { cfg, criticModel, versions, model } = this.s;
    if (criticModel && !this.critic) {
      const savedDir = await versions.find('critic', this.at);
      const saved = savedDir ? await loadCheckpoint(savedDir, { optimizer: false }) : null;
      if (saved)
        this.critic = createTrainer({
          ...criticOptions(this.s),
          weights: saved.weights,
          optimizerState: saved.optimizer,
        });
      else {
        // critic.model.path, else the actor's model directory (a causal LM gets a fresh score head), else a fresh model
        const cpath = criticModelDir(cfg);
        const cseed = cfg.critic.model.init_seed ?? cfg.actor.model.init_seed + 1;
        this.critic = createTrainer({
          ...criticOptions(this.s),
          ...(cpath
            ? { weights: valueModelFrom(await loadCheckpoint(cpath, { optimizer: false }), cseed).weights }
            : { weights: initWeights(criticModel, cseed, { visionStd: cfg.actor.model.vision.init_std }) }),
        });
        await versions.put('critic', this.at, criticModel, this.critic.getWeights(), {});
      }
    }
    // EMA of the policy weights: stored next to each version (kind ema; <run_dir>/ema/ on a filesystem)
    if (cfg.algorithm.ema.enable) {
      const dir = await versions.find('ema', this.at);
      this.ema = dir ? (await loadCheckpoint(dir, { optimizer: false })).weights : null;
      if (!this.ema) {
        this.ema = this.actor.getWeights();
        await versions.put('ema', this.at, model, this.ema, {});
      }
    }
  }
}

/** Running sums of a trainer's metrics over a step's mini-batches, reported as means. */
class MetricMeans {
  private readonly sums: Record<string, number> = {};
  private n = 0;
  constructor(private readonly prefix: string) {}
  add(m: Record<string, number>): void {
    for (const [k, v] of Object.entries(m)) this.sums[k] = (this.sums[k] ?? 0) + v;
    this.n++;
  }
  means(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [k, v] of Object.entries(this.sums)) out[`${this.prefix}${k}`] = v / this.n;
    return out;
  }
}

function actorOptions(s: LearnerSetup): TrainerOptions {
  return {
    ...s.settings.actor.trainer,
    model: s.model,
    ...(s.lora ? { lora: s.lora.config } : {}),
    loss: s.settings.policyLoss,
  };
}

function criticOptions(s: LearnerSetup): TrainerOptions {
  return { ...s.settings.critic.trainer, model: s.criticModel!, loss: s.settings.valueLoss };
}

/**
 * The policy trainer a new run starts with: its initial weights and, with LoRA, the replay's
 * source's initial adapter (its v0) or PEFT's init seeded by data.seed (lib/model/lora.ts initLora).
 */
async function initialTrainer(s: LearnerSetup): Promise<Trainer> {
  const weights = await initialWeights(s);
  if (!s.lora || !s.initialWeightsDir) return createTrainer({ ...actorOptions(s), weights });
  if (!isAdapterDir(s.initialWeightsDir))
    throw new ConfigError(
      `${s.initialWeightsDir} holds no LoRA adapter (adapter_config.json) to start actor.model.lora from; replay a LoRA run with LoRA, a full fine-tuning run without`,
    );
  const v0 = await loadAdapter(s.initialWeightsDir, s.model, { optimizer: false, expect: s.lora.config });
  return createTrainer({ ...actorOptions(s), weights, adapter: v0.adapter });
}

/** The weights a new run starts from: the LoRA base, the replay's or actor.model.path's model, or a seeded init. */
async function initialWeights(s: LearnerSetup): Promise<Weights> {
  if (s.lora) return sharedBaseWeights(s.lora.baseDir);
  // a replay starts from the source's v0; a v0 stored in bf16 holds rounded weights, so then from
  // what the source's trainer started from: its config's model (or seeded init), as below
  if (s.initialWeightsDir) {
    const v0 = await loadCheckpoint(s.initialWeightsDir, { optimizer: false });
    if (!v0.config.storedDtype) return v0.weights;
  }
  const dir = s.cfg.actor.model.path;
  return dir
    ? (await loadCheckpoint(dir, { optimizer: false })).weights
    : initWeights(s.model, s.cfg.actor.model.init_seed, { visionStd: s.cfg.actor.model.vision.init_std });
}

/**
 * A resume whose checkpoint fails its sha256 check (its actor/ and reference/ are hard links of
 * the policy versions' files, so a damaged version shows here): what failed, and the newest intact
 * checkpoint to start a new run from.
 */
async function resumeRefused(s: LearnerSetup, dir: string, e: unknown): Promise<never> {
  if (!(e instanceof ConfigError)) throw e;
  const what = e.message.replace(/^trainer\.load_checkpoint_path: /, '').replace(/; use an earlier checkpoint .*$/, '');
  throw new ConfigError(`resuming from checkpoint ${dir}: ${what}. ${await s.versions.resumeHint()}`);
}

/**
 * The policy trainer (weights or, with LoRA, the base + the adapter) and the critic of a
 * checkpoint directory, each with its AdamW state (an rlstream checkpoint's files are checked
 * against its trainer_state.json first); a plain model directory gives a fresh optimizer.
 */
async function trainersOfCheckpoint(
  s: LearnerSetup,
  path: string,
): Promise<{ actor: Trainer; critic: Trainer | null }> {
  const src = readCheckpointPath(path);
  if (src.state) await verifyCheckpointFiles(path, src.state);
  const optimizer = src.state ? true : undefined;
  let actor: Trainer;
  if (s.lora && isAdapterDir(src.actorDir)) {
    const ad = await loadAdapter(src.actorDir, s.model, { optimizer, expect: s.lora.config });
    actor = createTrainer({
      ...actorOptions(s),
      weights: await sharedBaseWeights(s.lora.baseDir),
      adapter: ad.adapter,
      optimizerState: ad.optimizer,
    });
  } else {
    const ck = await loadCheckpoint(src.actorDir, { optimizer });
    actor = createTrainer({ ...actorOptions(s), weights: ck.weights, optimizerState: ck.optimizer });
  }
  if (!s.criticModel || !src.criticDir) return { actor, critic: null };
  const c = await loadCheckpoint(src.criticDir, { optimizer });
  return { actor, critic: createTrainer({ ...criticOptions(s), weights: c.weights, optimizerState: c.optimizer }) };
}

/**
 * The critic of a run started from a checkpoint continues from the checkpoint's value model and
 * AdamW state (stored as this run's critic version `start` before the state that says the run
 * started, so a crash here restarts from the checkpoint again); an rlstream checkpoint without
 * one is refused rather than silently pairing a trained policy with an untrained critic.
 */
async function criticFromCheckpoint(
  s: LearnerSetup,
  cm: ModelConfig,
  path: string,
  src: ReturnType<typeof readCheckpointPath>,
  start: number,
): Promise<Trainer | null> {
  const { cfg, log } = s;
  if (src.criticDir) {
    const c = await loadCheckpoint(src.criticDir, { optimizer: true });
    if (
      c.config.hiddenSize !== cm.hiddenSize ||
      c.config.numHiddenLayers !== cm.numHiddenLayers ||
      c.config.vocabSize !== cm.vocabSize
    ) {
      throw new ConfigError(
        `trainer.load_checkpoint_path: the critic at ${src.criticDir} (d_model ${c.config.hiddenSize}, layers ${c.config.numHiddenLayers}, vocab ${c.config.vocabSize}) does not match critic.model (d_model ${cm.hiddenSize}, layers ${cm.numHiddenLayers}, vocab ${cm.vocabSize})`,
      );
    }
    await s.versions.put('critic', start, cm, c.weights, {});
    log.info({ critic: src.criticDir }, `critic restored from ${src.criticDir} (weights and optimizer state)`);
    return createTrainer({ ...criticOptions(s), weights: c.weights, optimizerState: c.optimizer });
  } else if (src.state && !resolveCriticModel(cfg).path) {
    throw new ConfigError(
      `trainer.load_checkpoint_path: ${path} has no critic (critic/ is missing: its run trained without one), but critic.enable = true (algorithm.adv_estimator = ${cfg.algorithm.adv_estimator} trains a value model). ` +
        `Give critic.model.path a value-model directory to start the critic from, or load the checkpoint's policy weights as a new model (trainer.load_checkpoint_path=${join(path, 'actor')}) to start with a fresh critic at step 0`,
    );
  } else if (src.state)
    log.warn(
      { critic: resolveCriticModel(cfg).path },
      `${path} has no critic; the critic starts from critic.model.path`,
    );
  return null;
}
