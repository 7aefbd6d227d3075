/**
 * An image policy (actor.model.kind = image; docs/image-generation.md) in the pipeline's stages:
 * its settings from the config, the rollout's sampler of stored (or handed-over) versions, and the
 * update stage's learner. The learner has the language learner's life cycle (lib/pipeline/
 * learner.ts: fresh, at a trainer base, from a checkpoint, reset, advance, store, storeOptimizers),
 * so the update stage's commits, checkpoints and resume treat both alike; a version is a DiT model
 * directory (config.json model_type rlstream_dit + model.safetensors), its AdamW state an
 * optimizer.safetensors of the moments (lib/image/checkpoint.ts).
 */
import { join } from 'node:path';
import type { Config } from '../config/index.ts';
import { ConfigError, RlError, TransientError } from '../errors.ts';
import type { Logger } from '../log.ts';
import { OPTIMIZER_FILE } from '../model/checkpoint.ts';
import { policyKindOf } from '../model/policy-kinds.ts';
import { lrAt, type LrScheduleConfig } from '../optim/lr-schedule.ts';
import { Rng } from '../util/rng.ts';
import { ditFiles, loadDit, type DitModel } from '../image/checkpoint.ts';
import { ditLoraConfig, loadDitAdapter, type DitLora } from '../image/lora.ts';
import type { DitWeights } from '../image/dit.ts';
import type { ImageLossConfig } from '../image/flow-graph.ts';
import {
  imageUpdate,
  imageUpdateBatch,
  nftOldDecay,
  softUpdate,
  type ImageUpdateBatch,
  type NftOptimalityOptions,
} from '../image/rl.ts';
import type { UpdateGroup } from '../contracts/index.ts';
import { ImageTrainer } from '../image/trainer.ts';
import { sampleRequests, type ImageGeneration } from '../image/trajectory.ts';
import { guidedVelocity, type VelocityFn } from '../image/sde.ts';
import type { Executor, PolicyStore } from '../policy-store/index.ts';
import { takeHandOff } from '../policy-store/handoff.ts';
import { readCheckpointPath, verifyCheckpointFiles } from './checkpoints.ts';
import { crashPoint } from './crash-points.ts';
import { emaStep, LearnerVersion, type PolicyLearner, type TrainerBase } from './learner.ts';
import type { RunVersions } from './run-versions.ts';

const WEIGHTS_FILE = 'model.safetensors';

/** Whether the run trains an image policy (lib/model/policy-kinds.ts). */
export function isImagePolicy(cfg: Config): boolean {
  return policyKindOf(cfg.actor.model) === 'image';
}

/** What an image policy samples and trains with (algorithm.image, algorithm.policy_loss, actor). */
export interface ImagePolicySettings {
  loss: ImageLossConfig;
  steps: number;
  evalSteps: number;
  noiseLevel: number;
  cfgScale: number;
  /** Guidance of training samples (the loss's cfgScale too). */
  trainCfgScale: number;
  nftUpdates: number;
  /** diffusion_nft: how rewards become optimality probabilities (lib/image/rl.ts nftOptimality). */
  nftOptimality: NftOptimalityOptions;
  /** diffusion_nft: the soft update of the sampling policy, η_i = min(rate·i, max); null: on-policy (θ_old = θ). */
  nftOldDecay: { rate: number; max: number } | null;
  epochs: number;
  threads: number;
  seed: number;
}

export function imagePolicySettings(cfg: Config): ImagePolicySettings {
  const a = cfg.algorithm,
    im = a.image;
  const loss: ImageLossConfig =
    a.policy_loss === 'flow_grpo'
      ? {
          name: 'flow_grpo',
          clipLow: cfg.actor.clip_ratio_low,
          clipHigh: cfg.actor.clip_ratio_high,
          klCoef: a.use_kl_loss ? a.kl_coef : 0,
          cfgScale: im.train_cfg_scale,
        }
      : a.policy_loss === 'diffusion_nft'
        ? {
            name: 'diffusion_nft',
            nftBeta: im.nft_beta,
            cfgScale: im.train_cfg_scale,
            ...(im.nft_adaptive_weight ? { nftAdaptiveWeight: true } : {}),
          }
        : (() => {
            throw new ConfigError(
              `algorithm.policy_loss = ${a.policy_loss} is a language loss; an image policy trains with flow_grpo or diffusion_nft`,
            );
          })();
  return {
    loss,
    steps: im.steps,
    evalSteps: im.eval_steps,
    noiseLevel: im.noise_level,
    cfgScale: im.cfg_scale,
    trainCfgScale: im.train_cfg_scale,
    nftUpdates: im.nft_updates,
    nftOptimality: { clip: im.nft_adv_clip, std: im.nft_adv_std },
    nftOldDecay:
      loss.name === 'diffusion_nft' && im.nft_old_decay_rate > 0
        ? { rate: im.nft_old_decay_rate, max: im.nft_old_decay_max }
        : null,
    epochs: cfg.actor.ppo_epochs,
    threads: cfg.actor.threads,
    seed: cfg.data.seed,
  };
}

/** Optimizer steps of one epoch of a training step: flow_grpo one per stochastic denoising step, diffusion_nft nft_updates. */
export function imageOptimizerStepsPerEpoch(s: ImagePolicySettings): number {
  return s.loss.name === 'flow_grpo' ? (s.noiseLevel > 0 ? s.steps - 1 : 0) : s.nftUpdates;
}

/** The class index of a prompt: its text (trimmed) among the model's class_names. */
export function promptClass(classNames: readonly string[], prompt: string): number {
  const c = classNames.indexOf(prompt.trim());
  if (c < 0)
    throw new ConfigError(
      `prompt ${JSON.stringify(prompt)} is not one of the image policy's prompts (config.json class_names): ${classNames.join(', ')}`,
    );
  return c;
}

/** AdamW of an image policy from actor.optim (its learning rate the peak of the schedule). */
export function imageOptim(cfg: Config): ConstructorParameters<typeof ImageTrainer>[2] {
  const o = cfg.actor.optim;
  return {
    betas: [o.betas[0], o.betas[1]],
    eps: o.eps,
    weightDecay: o.weight_decay,
    maxGradNorm: o.max_grad_norm,
    lr: o.lr,
  };
}

/** An image policy's LoRA on its DiT blocks (actor.model.lora; lib/image/lora.ts), null without. */
export function imageLora(cfg: Config): DitLora | null {
  const l = cfg.actor.model.lora;
  return l
    ? ditLoraConfig({ rank: l.rank, alpha: l.alpha, dropout: l.dropout, targetModules: l.target_modules })
    : null;
}

/**
 * An image policy's trainer: `model`'s weights (actor.model.path; with LoRA the frozen base) and,
 * from `actorDir` (a checkpoint's actor/) when given, the trained state: its weights, or with LoRA
 * its adapter (none: PEFT's init seeded by data.seed). The AdamW state is the caller's to restore.
 */
export function imageTrainer(
  cfg: Config,
  model: DitModel,
  actorDir: string | null,
  opts: { emaDecay?: number } = {},
): ImageTrainer {
  const lora = imageLora(cfg);
  const weights = actorDir && !lora ? loadDit(actorDir).weights : model.weights;
  return new ImageTrainer(model.config, weights, imageOptim(cfg), {
    threads: cfg.actor.threads,
    gradientCheckpointing: cfg.actor.model.enable_gradient_checkpointing,
    ...opts,
    ...(lora
      ? {
          lora,
          loraSeed: cfg.data.seed,
          ...(actorDir ? { adapter: loadDitAdapter(actorDir, model.config, lora) } : {}),
        }
      : {}),
  });
}

/**
 * The rollout's image sampler: a request's image from its own noise stream (`seed/<sample id>`)
 * with the version's weights, taken from the in-process hand-off of the update stage or read from
 * the policy store. Training requests: algorithm.image.steps with the SDE (noise_level > 0),
 * guided by train_cfg_scale, with the version's DiffusionNFT sampling policy when it is
 * soft-updated (kind `sampler`); validation: eval_steps with the ODE, guided by cfg_scale, with
 * the version's EMA weights when algorithm.ema.enable (the update stage stores both beside each version).
 */
export class ImageSampler {
  readonly model: DitModel;
  private readonly tr: ImageTrainer;
  private readonly loaded = new Map<'policy' | 'ema' | 'sampler', { version: number; weights: DitWeights }>();
  fromMemory = 0;

  constructor(
    private readonly cfg: Config,
    private readonly store: PolicyStore,
    private readonly onLoad?: (version: number) => void,
  ) {
    this.model = loadDit(cfg.actor.model.path!);
    this.tr = new ImageTrainer(this.model.config, this.model.weights, imageOptim(cfg), {
      threads: cfg.actor.threads,
    });
  }

  /** The weights of `version`: the policy's (in-process hand-off, else the store), its EMA (algorithm.ema.enable) or its DiffusionNFT sampling policy. */
  private async weightsOf(kind: 'policy' | 'ema' | 'sampler', version: number, db: Executor): Promise<DitWeights> {
    const cached = this.loaded.get(kind);
    if (cached?.version === version) return cached.weights;
    let w = kind === 'policy' ? await takeHandOff(this.store, version, db) : null;
    if (w) this.fromMemory++;
    else {
      const dir = await this.store.get(kind, version, db);
      if (!dir)
        throw new TransientError(`image policy ${kind} version ${version} is not in the policy store (yet); retrying`);
      const m = loadDit(dir);
      if (JSON.stringify(m.config) !== JSON.stringify(this.model.config))
        throw new ConfigError(`image policy version ${version} at ${dir} has another shape than actor.model.path`);
      w = m.weights;
    }
    this.loaded.set(kind, { version, weights: w });
    if (kind === 'policy') this.onLoad?.(version);
    return w;
  }

  /** One image per request, in request order (`val`: a validation request). */
  async generate(
    version: number,
    db: Executor,
    requests: ReadonlyArray<{ id: string; prompt: string; val: boolean }>,
  ): Promise<Array<ImageGeneration & { id: string; finishReason: 'eos' }>> {
    const s = imagePolicySettings(this.cfg);
    const { channels, imageSize } = this.model.config;
    const out = new Array<ImageGeneration & { id: string; finishReason: 'eos' }>(requests.length);
    for (const val of [false, true]) {
      const idx = requests.flatMap((r, i) => (r.val === val ? [i] : []));
      if (!idx.length) continue;
      const kind = val ? (this.cfg.algorithm.ema.enable ? 'ema' : 'policy') : s.nftOldDecay ? 'sampler' : 'policy';
      const w = await this.weightsOf(kind, version, db);
      const velocity: VelocityFn = (x, t, c) => this.tr.velocity(x, t, c, w);
      const gens = await sampleRequests(
        // training samples guided as the loss's velocity, so flow_grpo's recorded log-probs are the trained graph's
        guidedVelocity(velocity, val ? s.cfgScale : s.trainCfgScale, this.model.config.numClasses),
        idx.map((i) => ({ id: requests[i].id, cls: promptClass(this.model.classNames, requests[i].prompt) })),
        {
          channels,
          size: imageSize,
          steps: val ? s.evalSteps : s.steps,
          noiseLevel: val ? 0 : s.noiseLevel,
          seed: s.seed,
        },
      );
      idx.forEach((i, k) => (out[i] = gens[k]));
    }
    return out;
  }
}

/** What an image learner is built from. */
export interface ImageLearnerSetup {
  cfg: Config;
  versions: RunVersions;
  log: Logger;
  /** The actor's learning-rate schedule. */
  schedule: LrScheduleConfig;
  /** Replay: the initial policy (v0) directory to start from instead of actor.model.path. */
  initialWeightsDir?: string;
}

/** The update stage's learner of an image policy (the header; lib/pipeline/learner.ts for the life cycle). */
export class ImageLearner extends LearnerVersion implements PolicyLearner {
  private ema: DitWeights | null = null;
  private reference: DitWeights | null = null;
  /** DiffusionNFT's soft-updated sampling policy θ_old (null: on-policy). */
  private sampler: DitWeights | null = null;
  readonly settings: ImagePolicySettings;

  private constructor(
    private readonly s: ImageLearnerSetup,
    private readonly model: DitModel,
    private trainer: ImageTrainer,
    version: number,
    sha: string,
  ) {
    super(version, sha);
    this.settings = imagePolicySettings(s.cfg);
  }

  /** The prompt class of a group's prompt. */
  classOf(prompt: string): number {
    return promptClass(this.model.classNames, prompt);
  }

  private static initial(s: ImageLearnerSetup): DitModel {
    const m = loadDit(s.cfg.actor.model.path!);
    if (!s.initialWeightsDir) return m;
    const v0 = loadDit(s.initialWeightsDir);
    if (JSON.stringify(v0.config) !== JSON.stringify(m.config))
      throw new ConfigError(`${s.initialWeightsDir} has another shape than actor.model.path ${s.cfg.actor.model.path}`);
    return v0;
  }

  /** A new run from actor.model.path (a replay: the source's v0), stored as version 0. */
  static async fresh(s: ImageLearnerSetup): Promise<ImageLearner> {
    const m = ImageLearner.initial(s);
    const l = new ImageLearner(s, m, imageTrainer(s.cfg, m, null), 0, '');
    l.sha = await l.storePolicy(0);
    await l.openParts();
    return l;
  }

  /** A learner at trainer base `base` (a checkpoint's weights and AdamW state, or the run's initial weights). */
  static async atBase(s: ImageLearnerSetup, base: TrainerBase): Promise<ImageLearner> {
    const m = ImageLearner.initial(s);
    let tr: ImageTrainer;
    if (base.dir) {
      const src = readCheckpointPath(base.dir);
      if (src.state) await verifyCheckpointFiles(base.dir, src.state);
      tr = imageTrainer(s.cfg, m, src.actorDir);
      if (src.state) tr.loadOptimizer(join(src.actorDir, OPTIMIZER_FILE));
    } else tr = imageTrainer(s.cfg, m, null);
    const l = new ImageLearner(s, m, tr, base.step, base.sha);
    await l.openParts();
    return l;
  }

  /**
   * A new run started from checkpoint `path` (its weights and AdamW state at its step; v0 is the
   * source's reference/), stored as that version. Returns the optimizer steps the LR schedule continues from.
   */
  static async fromCheckpoint(
    s: ImageLearnerSetup,
    path: string,
  ): Promise<{ learner: ImageLearner; optimizerSteps: number }> {
    const src = readCheckpointPath(path);
    if (src.state) await verifyCheckpointFiles(path, src.state);
    const m = ImageLearner.initial(s);
    const tr = imageTrainer(s.cfg, m, src.actorDir);
    if (src.state) tr.loadOptimizer(join(src.actorDir, OPTIMIZER_FILE));
    const start = src.state?.step ?? 0;
    if (start > 0) {
      const ref = src.referenceDir ? loadDit(src.referenceDir) : m;
      await s.versions.putFiles('policy', 0, ditFiles({ ...m, weights: ref.weights }), WEIGHTS_FILE);
    }
    const l = new ImageLearner(s, m, tr, start, '');
    l.sha = await l.storePolicy(start);
    await l.openParts();
    return { learner: l, optimizerSteps: Number(src.state?.lr_state.optimizer_steps ?? tr.stepCount) };
  }

  async reset(base: TrainerBase): Promise<void> {
    const l = await ImageLearner.atBase(this.s, base);
    this.trainer = l.trainer;
    this.reference = l.reference;
    this.ema = l.ema;
    this.sampler = l.sampler;
    this.settle(base.step, base.sha);
  }

  /**
   * One training step (`step`: the version it makes) on the batch rebuilt from the records
   * (lib/image/rl.ts imageUpdateBatch): actor.ppo_epochs passes of imageUpdate, the
   * learning rate of each optimizer step from the schedule. DiffusionNFT's (t, ε) are drawn from
   * `seed/nft/<step>`, so a re-trained step draws the same; its v_old is the sampling policy θ_old
   * (the weights at the step's start when it is not soft-updated).
   */
  async trainStep(a: {
    step: number;
    batch: ImageUpdateBatch;
    optimizerSteps: number;
    totalOptimizerSteps: number;
  }): Promise<{ metrics: Record<string, number>; optimizerSteps: number; tokens: number }> {
    const st = this.settings;
    this.dirty = true;
    const rng = Rng.fromSeed(`${st.seed}/nft/${a.step}`);
    let optimizerSteps = a.optimizerSteps;
    const old = this.sampler ?? new Map([...this.trainer.weights].map(([k, v]) => [k, Float32Array.from(v)]));
    const sums: Record<string, number> = {};
    for (let e = 0; e < st.epochs; e++) {
      const m = await imageUpdate(this.trainer, a.batch, {
        loss: st.loss,
        nftUpdates: st.nftUpdates,
        ...(this.reference ? { reference: this.reference } : {}),
        old,
        rng,
        lr: () => lrAt(this.s.schedule, ++optimizerSteps, a.totalOptimizerSteps),
      });
      for (const [k, v] of Object.entries(m)) sums[`actor/${k}`] = (sums[`actor/${k}`] ?? 0) + v / st.epochs;
    }
    sums['actor/lr'] = lrAt(this.s.schedule, Math.max(1, optimizerSteps), a.totalOptimizerSteps);
    return { metrics: sums, optimizerSteps, tokens: a.batch.cls.length };
  }

  /**
   * One training step on a step's kept groups: the batch rebuilt from their records
   * (lib/image/rl.ts imageUpdateBatch: groups in id order, each prompt's class), then trainStep.
   */
  trainGroups(
    kept: readonly UpdateGroup[],
    step: number,
    optimizerSteps: number,
    totalOptimizerSteps: number,
  ): ReturnType<ImageLearner['trainStep']> {
    const loss = this.settings.loss.name === 'flow_grpo' ? 'flow_grpo' : 'diffusion_nft';
    const batch = imageUpdateBatch(kept, loss, (g) => this.classOf(g.prompt_text), this.settings.nftOptimality);
    return this.trainStep({ step, batch, optimizerSteps, totalOptimizerSteps });
  }

  /**
   * Stores the trained state as `version` (policy, then the EMA moved to it when algorithm.ema.enable,
   * then DiffusionNFT's sampling policy soft-updated towards it: η = min(rate·version, max)).
   */
  async store(version: number, db: Executor, inMemoryOnly = false): Promise<void> {
    if (inMemoryOnly)
      throw new RlError('an image policy version is always written to the policy store', { retriable: false });
    this.at = version;
    this.dirty = false;
    this.sha = await this.storePolicy(version, db);
    crashPoint('update:version-written');
    if (this.nextEma())
      await this.s.versions.putFiles('ema', version, ditFiles({ ...this.model, weights: this.ema! }), WEIGHTS_FILE, db);
    const d = this.settings.nftOldDecay;
    if (this.sampler && d) {
      softUpdate(this.sampler, this.trainer.weights, nftOldDecay(version, d.rate, d.max));
      await this.s.versions.putFiles(
        'sampler',
        version,
        ditFiles({ ...this.model, weights: this.sampler }),
        WEIGHTS_FILE,
        db,
      );
    }
  }

  /** Nothing to hand over: an image policy's versions are always written (services/update/logic.ts versionFilesOf). */
  async handOverUnstored(): Promise<void> {}

  /** Stores the AdamW state as checkpoint step `version`'s optimizer artifact. */
  async storeOptimizers(version: number, db: Executor): Promise<void> {
    const file = this.trainer.optimizerFile();
    await this.s.versions.putFiles('optimizer', version, new Map([[OPTIMIZER_FILE, file]]), OPTIMIZER_FILE, db);
  }

  private storePolicy(version: number, db?: Executor): Promise<string> {
    const weights = new Map([...this.trainer.weights].map(([k, v]) => [k, Float32Array.from(v)]));
    return this.s.versions.putFiles(
      'policy',
      version,
      this.trainer.files(this.model, weights),
      WEIGHTS_FILE,
      db,
      weights,
    );
  }

  protected nextEma(): boolean {
    if (!this.ema) return false;
    this.ema = emaStep(this.ema, this.trainer.weights, this.s.cfg.algorithm.ema.decay);
    return true;
  }

  /**
   * The reference (v0, flow_grpo with a KL term), the EMA (algorithm.ema.enable) and DiffusionNFT's
   * soft-updated sampling policy at this version: the stored one, else the weights now, stored.
   * Read when the learner opens, outside any batch (an embedded batch's transaction holds the
   * database's one connection).
   */
  private async openParts(): Promise<void> {
    if ((this.settings.loss.klCoef ?? 0) > 0) this.reference = loadDit(await this.s.versions.dir('policy', 0)).weights;
    if (this.settings.nftOldDecay) {
      const dir = await this.s.versions.find('sampler', this.at);
      this.sampler = dir
        ? loadDit(dir).weights
        : new Map([...this.trainer.weights].map(([k, v]) => [k, Float32Array.from(v)]));
      if (!dir)
        await this.s.versions.putFiles(
          'sampler',
          this.at,
          ditFiles({ ...this.model, weights: this.sampler }),
          WEIGHTS_FILE,
        );
    }
    if (!this.s.cfg.algorithm.ema.enable) return;
    const dir = await this.s.versions.find('ema', this.at);
    this.ema = dir
      ? loadDit(dir).weights
      : new Map([...this.trainer.weights].map(([k, v]) => [k, Float32Array.from(v)]));
    if (!dir)
      await this.s.versions.putFiles('ema', this.at, ditFiles({ ...this.model, weights: this.ema }), WEIGHTS_FILE);
  }
}
