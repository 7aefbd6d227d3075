/**
 * The trainer: one optimizer step over a mini-batch = k micro-batch runs of the training graph
 * (k − 1 `grad` runs whose gradients are summed, then one `step_acc`/`step` run that adds its own
 * gradient, clips by global norm and applies AdamW in-graph). Loss normalisers are computed over
 * the whole mini-batch first (verl global-batch semantics), so k micro-batches give the big-batch
 * result within float32 noise. Each micro-batch is trimmed to its longest row (length bucketing).
 *
 * Token alignment: a batch is given in token positions ([B, T]: `tokens`, `responseMask`, and the
 * per-token `advantages`, `oldLogprobs`, … of the token at that position). The graph predicts
 * token t + 1 at position t, so the trainer shifts the per-token fields left by one.
 */
import { ConfigError } from '../errors.ts';
import { lossAggModes, type GlobalBatchInfo } from '../rl/agg.ts';
import { nftRHat } from '../rl/nft.ts';
import { clipCovPriorities } from '../rl/policy-loss.ts';
import { Rng } from '../util/rng.ts';
import { ort, runInto, tensor, type Device, type SessionOptions } from '../onnx/runtime.ts';
import type { ModelConfig } from './config.ts';
import { initWeights } from './init.ts';
import { queryBlocksFor } from './llama.ts';
import { checkLoraFits, initLora, loraSpecs, towerLoraModules, validateAdapter, type LoraConfig } from './lora.ts';
import { mergeLoraOnnx } from './lora-merge.ts';
import {
  ENTROPY_COEFF_INPUT,
  finalizeMetrics,
  lossConfig,
  pgAggWeights,
  policyLossNeeds,
  type LossConfig,
  type LossConfigInput,
} from './loss.ts';
import {
  cloneWeights,
  isVisionParam,
  numel,
  paramSpecs,
  validateWeights,
  zerosLikeWeights,
  type ParamSpec,
  type Weights,
} from './params.ts';
import { hasImages, visionFeeds, type ImagePixels } from './vision.ts';
import { defaultSessionCache, keyOf, SessionCache } from './session-cache.ts';
import { ADAMW_IO, buildAdamWGraph, buildTrainGraph, type OptimConfig, type TrainGraphMode } from './train-graph.ts';

/** Elements per AdamW run (bounds the update's temporaries to a few × 16 MiB). */
const ADAMW_SLICE = 1 << 22;

export interface TrainBatch {
  /** Rows B and length T of every [B, T] array. */
  batchSize: number;
  seqLen: number;
  /** Token ids (prompt + response, padded) [B, T]. */
  tokens: Int32Array;
  /** 1 = real token, 0 = padding [B, T]; default all ones. */
  attentionMask?: Float32Array | Uint8Array;
  /** 1 = a response token whose log-prob enters the loss [B, T]. */
  responseMask: Float32Array | Uint8Array;
  /** Position ids [B, T]; default cumsum(attentionMask) − 1 (left padding supported). */
  positions?: Int32Array;
  advantages?: Float32Array;
  oldLogprobs?: Float32Array;
  refLogprobs?: Float32Array;
  /** Per-token weights multiplied into the policy-gradient loss (IS weights, token filtering). */
  lossWeights?: Float32Array;
  /** Critic: old values and returns per token. */
  values?: Float32Array;
  returns?: Float32Array;
  /** NFT: one ±1 reward per sequence [B] and its group label (verl uid) [B]. */
  rewards?: ArrayLike<number>;
  groupIndex?: readonly (string | number)[];
  /**
   * NFT: the fraction of correct responses in each row's whole group [B], in [0, 1] (clamped to
   * [rHatMin, rHatMax] as r̂). Given when a mini-batch may hold only part of a group (the
   * pipeline); then groupIndex is not needed. Default: r̂ from `rewards` over `groupIndex`.
   */
  groupAccuracy?: ArrayLike<number>;
  /**
   * verl global_batch_info overrides. Default: normalisers of this mini-batch (token count,
   * non-empty rows, dp_size 1). loss_scale_factor (seq-mean-token-sum-norm) defaults to seqLen;
   * pass max_response_length to match verl, whose divisor is the response tensor's length.
   */
  globalBatch?: GlobalBatchInfo;
  /**
   * A VLM's images per row [batchSize] (undefined or [] for a row without), in the order of the
   * row's expanded <|image_pad|> runs (vision.ts).
   */
  images?: readonly (readonly ImagePixels[] | undefined)[];
}

export interface StepResult {
  /** pg_loss, pg_clipfrac, pg_clipfrac_lower, ppo_kl, entropy, kl_loss, loss, grad_norm, lr (policy); vf_loss, vf_clipfrac, vpred_mean (value); sft_loss, token_acc (sft). */
  metrics: Record<string, number>;
  /** True when the gradient norm was not finite and the update was skipped (as verl). */
  skipped: boolean;
  /** Optimizer steps taken so far. */
  step: number;
}

export interface OptimizerState {
  step: number;
  expAvg: Weights;
  expAvgSq: Weights;
}

export interface TrainerOptions {
  model: ModelConfig;
  loss: LossConfigInput | LossConfig;
  optim?: Partial<OptimConfig>;
  /** Rows per micro-batch (verl ppo_micro_batch_size_per_gpu); default the whole mini-batch. */
  microBatchSize?: number;
  threads?: number;
  device?: Device;
  /**
   * Read gradients and updated weights/moments as one packed output per run instead of one per
   * parameter (train-graph.ts `packed`). Default: on for GPU devices, where every output is a
   * read-back with a sync; off on the CPU, where outputs are plain copies and packing adds one.
   */
  packOutputs?: boolean;
  /** Initial weights (default: seeded init with `seed`). */
  weights?: Weights;
  /**
   * Seeds the initial weights (when none are given) and clip_cov's random token priorities: micro-batch k
   * of the step after optimizer step s draws lib/rl clipCovPriorities(rows·T, Rng.fromSeed(`clip_cov:${seed}:${s}:${k}`)).
   */
  seed?: number;
  optimizerState?: OptimizerState;
  cache?: SessionCache;
  /** Vocabulary rows per chunk of the fused LM head (train-graph.ts HEAD_CHUNK by default). */
  headChunk?: number;
  /** Elements per in-place AdamW run on the CPU (default ADAMW_SLICE = 4 Mi). */
  optimizerSlice?: number;
  /** A VLM's vision tower is not trained (actor.model.freeze_vision_tower): no gradient, no update, no decay. */
  freezeVisionTower?: boolean;
  /**
   * LoRA (lib/model/lora.ts): `weights` are then the frozen base (never copied, never updated, no
   * gradient or AdamW state); the trained parameters, `getWeights()` and the optimizer state are
   * the adapters'. `adapter`: the initial adapters (default PEFT's init seeded by `seed`).
   */
  lora?: LoraConfig;
  adapter?: Weights;
  /** Recompute each decoder layer's forward in the backward instead of keeping its activations (train-graph.ts gradientCheckpointing). */
  gradientCheckpointing?: boolean;
  /**
   * Run the LM head only at the positions in the loss (train-graph.ts headIndex; default on for
   * the policy and SFT losses): the prompt positions then cost no vocabulary-sized work.
   */
  headAtLossPositions?: boolean;
  /**
   * Causal attention by query blocks (llama.ts queryBlocksFor) for batches of at least
   * QUERY_BLOCKS_MIN_T tokens a row: default QUERY_BLOCKS; 1 turns it off.
   */
  queryBlocks?: number;
}

export const DEFAULT_OPTIM: OptimConfig = { betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0.01, maxGradNorm: 1.0 };

interface Prepared {
  B: number;
  T: number;
  feeds: Record<string, Float32Array | BigInt64Array>;
  /** A VLM's vision inputs (vision.ts visionFeeds), already tensors of their own shapes. */
  vision?: Record<string, ort.Tensor>;
  maskSum: number;
  /** Metrics computed outside the graph (e.g. NFT r̂ mean). */
  extra?: Record<string, number>;
}

export class Trainer {
  readonly model: ModelConfig;
  readonly loss: LossConfig;
  readonly optim: OptimConfig;
  /** The trained parameters: every weight, or the LoRA adapters. */
  private weights: Weights;
  /** LoRA: the frozen base weights (the caller's arrays, read only); null for full fine-tuning. */
  private readonly base: ReadonlyMap<string, Float32Array> | null;
  private opt: OptimizerState;
  /** Specs of the trained parameters (paramSpecs, or loraSpecs). */
  private readonly specs: ParamSpec[];
  readonly lora: LoraConfig | null;
  private readonly cache: SessionCache;
  private readonly sessOpts: SessionOptions;
  private readonly packed: boolean;

  /** The options without the initial weights, adapter and optimizer state: those are copied, and held no longer. */
  private readonly opts: Omit<TrainerOptions, 'weights' | 'adapter' | 'optimizerState'>;

  constructor(options: TrainerOptions) {
    const { weights, adapter, optimizerState, ...opts } = options;
    this.opts = opts;
    this.model = opts.model;
    this.loss = lossConfig(opts.loss as LossConfigInput);
    this.entropyCoeff = this.loss.type === 'policy' ? this.loss.entropyCoeff : 0;
    if (this.loss.type === 'value' && this.model.head !== 'value')
      throw new ConfigError('trainer: a value loss needs a value model (head "value")');
    if (this.loss.type !== 'value' && this.model.head !== 'lm')
      throw new ConfigError(`trainer: a ${this.loss.type} loss needs a policy model (head "lm")`);
    this.optim = { ...DEFAULT_OPTIM, ...(opts.optim ?? {}) };
    const [b1, b2] = this.optim.betas;
    if (!(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1))
      throw new ConfigError(`optim: betas must be in [0, 1), got [${this.optim.betas}]`);
    if (this.optim.maxGradNorm !== null && !(this.optim.maxGradNorm > 0))
      throw new ConfigError(`optim: maxGradNorm must be > 0 or null, got ${this.optim.maxGradNorm}`);
    if (this.optim.visionLrScale !== undefined && !(this.optim.visionLrScale > 0))
      throw new ConfigError(`optim: visionLrScale must be > 0, got ${this.optim.visionLrScale}`);
    if (opts.microBatchSize !== undefined && !(Number.isInteger(opts.microBatchSize) && opts.microBatchSize > 0))
      throw new ConfigError(`trainer: microBatchSize must be a positive integer, got ${opts.microBatchSize}`);
    this.lora = opts.lora ?? null;
    if (this.lora) {
      if (this.model.head !== 'lm')
        throw new ConfigError('trainer: LoRA adapts a policy model (head "lm"), not a value model');
      checkLoraFits(this.model, this.lora, 'actor.model.lora');
      if (opts.freezeVisionTower && towerLoraModules(this.model, this.lora).length)
        throw new ConfigError(
          'actor.model.freeze_vision_tower and actor.model.lora.vision_target_modules contradict each other (the tower would be frozen and adapted); drop one',
        );
      this.specs = loraSpecs(this.model, this.lora);
      // the base is frozen: held as given, no copy
      const base = weights ?? initWeights(this.model, opts.seed ?? 0);
      validateWeights(this.model, base, 'trainer base weights');
      this.base = base;
      this.weights = adapter ? cloneWeights(adapter) : initLora(this.model, this.lora, opts.seed ?? 0);
      validateAdapter(this.model, this.lora, this.weights, 'trainer adapter');
    } else {
      if (adapter) throw new ConfigError('trainer: an adapter was given without a LoRA config');
      this.specs = paramSpecs(this.model);
      this.base = null;
      this.weights = weights ? cloneWeights(weights) : initWeights(this.model, opts.seed ?? 0);
      validateWeights(this.model, this.weights, 'trainer weights');
    }
    this.opt = optimizerState
      ? cloneState(optimizerState)
      : {
          step: 0,
          expAvg: zerosLikeWeights(this.model, this.specs),
          expAvgSq: zerosLikeWeights(this.model, this.specs),
        };
    this.validateState(this.opt);
    this.cache = opts.cache ?? defaultSessionCache;
    this.sessOpts = {
      threads: opts.threads,
      device: opts.device,
      ...(opts.device === undefined || opts.device === 'cpu' ? { lowMemory: true } : {}),
    };
    this.packed = opts.packOutputs ?? (opts.device !== undefined && opts.device !== 'cpu');
  }

  /** A copy of the trained parameters: every weight, or (LoRA) the adapters. */
  getWeights(): Weights {
    return cloneWeights(this.weights);
  }
  /** The frozen base weights (LoRA), not copied: do not modify; null for full fine-tuning. */
  baseWeightsView(): ReadonlyMap<string, Float32Array> | null {
    return this.base;
  }
  /** The policy's full weights: W + s·B·A per adapted module with LoRA (new arrays for those; the base's own for the rest), else a copy. */
  async mergedWeights(): Promise<Weights> {
    return this.base && this.lora
      ? mergeLoraOnnx(this.model, this.lora, this.base, this.weights, { cache: this.cache, session: this.sessOpts })
      : this.getWeights();
  }
  /**
   * The current weights without copying. Do not modify the arrays. On the CPU a step writes the
   * new weights into these arrays in place: copy (`getWeights`) what must outlive the next step.
   */
  weightsView(): ReadonlyMap<string, Float32Array> {
    return this.weights;
  }
  /** Optimizer steps taken so far. */
  get stepCount(): number {
    return this.opt.step;
  }
  /** Replaces the trained parameters (the adapters with LoRA). */
  setWeights(w: Weights): void {
    validateWeights(this.model, w, 'setWeights', this.specs);
    this.weights = cloneWeights(w);
  }
  getOptimizerState(): OptimizerState {
    return cloneState(this.opt);
  }
  /**
   * The optimizer state without copying (writing it to a file). Do not modify; on the CPU a step
   * updates the moments in place: copy (`getOptimizerState`) what must outlive the next step.
   */
  optimizerStateView(): Readonly<OptimizerState> {
    return this.opt;
  }
  setOptimizerState(s: OptimizerState): void {
    this.validateState(s);
    this.opt = cloneState(s);
  }

  private validateState(s: OptimizerState): void {
    if (!(Number.isInteger(s.step) && s.step >= 0))
      throw new ConfigError(`optimizer state: step must be a non-negative integer, got ${s.step}`);
    validateWeights(this.model, s.expAvg, 'optimizer state exp_avg', this.specs);
    validateWeights(this.model, s.expAvgSq, 'optimizer state exp_avg_sq', this.specs);
  }

  private get headIndex(): boolean {
    return this.loss.type !== 'value' && this.opts.headAtLossPositions !== false;
  }

  private readonly graphs = new Map<string, { key: string; metricNames: string[]; build: () => Uint8Array }>();

  /**
   * The graph for a micro-batch of rows of T tokens (its query blocks depend on T: llama.ts
   * queryBlocksFor). `adapters` false: the base model alone (LoRA's reference policy), an eval
   * graph without the adapter path.
   */
  private async session(
    mode: TrainGraphMode,
    lossWeights: boolean,
    T: number,
    adapters = true,
  ): Promise<{ sess: ort.InferenceSession; names: string[] }> {
    const lora = adapters && this.lora ? this.lora : null;
    const queryBlocks = queryBlocksFor(T, this.opts.queryBlocks); // each count is its own graph
    const id = `${mode}:${lossWeights}:${!!lora}:${queryBlocks}`;
    let g = this.graphs.get(id);
    if (!g) {
      const spec = {
        model: this.model,
        loss: this.loss,
        optim: this.optim,
        mode,
        lossWeights,
        ...(this.opts.freezeVisionTower && this.model.vision ? { freezeVisionTower: true } : {}),
        ...(this.packed && mode !== 'eval' ? { packed: true } : {}),
        ...(this.opts.headChunk ? { headChunk: this.opts.headChunk } : {}),
        ...(lora ? { lora } : {}),
        ...(this.opts.gradientCheckpointing && mode !== 'eval' ? { gradientCheckpointing: true } : {}),
        ...(this.headIndex && mode !== 'eval' ? { headIndex: true } : {}),
        ...(queryBlocks > 1 ? { queryBlocks } : {}),
      };
      const built = buildTrainGraph(spec);
      g = { key: `train:${keyOf(spec)}`, metricNames: built.metricNames, build: () => built.builder.toBytes() };
      this.graphs.set(id, g);
    }
    return { sess: await this.cache.get(g.key, g.build, this.sessOpts), names: g.metricNames };
  }

  /** The entropy bonus coefficient fed to graphs whose loss takes it as an input (policy loss `entropyCoeffInput`). */
  private entropyCoeff: number;

  /**
   * One optimizer step on a mini-batch at learning rate `lr`; `entropyCoeff` is this step's entropy
   * bonus coefficient where the loss takes it as an input (a schedule; it stays for later runs).
   */
  async step(batch: TrainBatch, lr: number, opts: { entropyCoeff?: number } = {}): Promise<StepResult> {
    if (!(lr >= 0) || !Number.isFinite(lr))
      throw new ConfigError(`trainer.step: lr must be a finite number ≥ 0, got ${lr}`);
    if (opts.entropyCoeff !== undefined) {
      if (!Number.isFinite(opts.entropyCoeff))
        throw new ConfigError(`trainer.step: entropyCoeff must be a finite number, got ${opts.entropyCoeff}`);
      this.entropyCoeff = opts.entropyCoeff;
    }
    const micro = this.prepare(batch);
    const useLw = !!batch.lossWeights && this.loss.type === 'policy';
    if (!this.packed) return this.stepInPlace(micro, useLw, lr);
    const sums: Record<string, number> = {};
    let acc: Map<string, Float32Array> | null = null;
    for (let k = 0; k < micro.length - 1; k++) {
      const { sess, names } = await this.session('grad', useLw, micro[k].T);
      const r = await sess.run(this.feeds(micro[k], sess));
      addMetrics(sums, r.metrics.data as Float32Array, names);
      acc = accumulate(acc, r, this.specs, this.packed);
    }
    const last = micro[micro.length - 1];
    const { sess, names } = await this.session(acc ? 'step_acc' : 'step', useLw, last.T);
    const t = this.opt.step + 1;
    const [b1, b2] = this.optim.betas;
    const feeds = this.feeds(last, sess);
    feeds.adam_step_size = tensor(this.floatType, [lr / (1 - Math.pow(b1, t))], []);
    feeds.adam_bc2_sqrt = tensor(this.floatType, [Math.sqrt(1 - Math.pow(b2, t))], []);
    feeds.adam_decay = tensor(this.floatType, [1 - lr * this.optim.weightDecay], []);
    for (const s of this.specs) {
      feeds[`${s.name}.exp_avg`] = tensor('float32', this.opt.expAvg.get(s.name)!, s.shape);
      feeds[`${s.name}.exp_avg_sq`] = tensor('float32', this.opt.expAvgSq.get(s.name)!, s.shape);
      if (acc) feeds[`acc.${s.name}`] = tensor('float32', acc.get(s.name)!, s.shape);
    }
    const r = await sess.run(feeds);
    addMetrics(sums, r.metrics.data as Float32Array, names);
    const gradNorm = (r.grad_norm.data as Float32Array)[0];
    const skipped = !Number.isFinite(gradNorm);
    if (!skipped) {
      const w: Weights = new Map(),
        m: Weights = new Map(),
        v: Weights = new Map();
      if (this.packed) {
        // [all weights | all exp_avg | all exp_avg_sq], each in paramSpecs order: views, no copy
        const all = r['new.packed'].data as Float32Array;
        let o = 0;
        for (const target of [w, m, v])
          for (const s of this.specs) {
            const n = numel(s.shape);
            target.set(s.name, all.subarray(o, o + n));
            o += n;
          }
      } else {
        for (const s of this.specs) {
          w.set(s.name, r[`new.${s.name}`].data as Float32Array);
          m.set(s.name, r[`new.${s.name}.exp_avg`].data as Float32Array);
          v.set(s.name, r[`new.${s.name}.exp_avg_sq`].data as Float32Array);
        }
      }
      this.weights = w;
      this.opt = { step: t, expAvg: m, expAvgSq: v };
    }
    const maskSum = micro.reduce((s, m) => s + m.maskSum, 0);
    return {
      metrics: { ...finalizeMetrics(sums, maskSum), ...(micro[0].extra ?? {}), grad_norm: gradNorm, lr },
      skipped,
      step: this.opt.step,
    };
  }

  /** One persistent gradient buffer per parameter (CPU step). */
  private gradBuf: Weights | null = null;

  /**
   * The CPU step, memory ∝ the model: the grad graph writes each gradient straight into a
   * persistent buffer (pre-allocated outputs; runInto collects the binding's copy of them);
   * micro-batches after the first run the `grad_acc` graph, which reads that buffer as
   * `acc.<param>` and adds each gradient into it as the backward reaches it; the global norm is
   * computed here in float64; then the small AdamW graph (train-graph.ts buildAdamWGraph) updates
   * weights and moments IN PLACE, slice by slice (≤ ADAMW_SLICE elements per run), writing into the
   * very buffers it reads. So the process holds weights + gradients + two moments (16 B per
   * parameter) plus activations, and no copy of any of them; a non-finite norm skips the update
   * (weights untouched).
   */
  private async stepInPlace(micro: Prepared[], useLw: boolean, lr: number): Promise<StepResult> {
    const sums: Record<string, number> = {};
    this.gradBuf ??= zerosLikeWeights(this.model, this.specs);
    for (let k = 0; k < micro.length; k++) {
      const { sess, names } = await this.session(k === 0 ? 'grad' : 'grad_acc', useLw, micro[k].T);
      const feeds = this.feeds(micro[k], sess);
      const into: Record<string, ort.Tensor> = {};
      for (const s of this.specs) {
        const g = tensor('float32', this.gradBuf.get(s.name)!, s.shape);
        into[`grad.${s.name}`] = g;
        if (k > 0) feeds[`acc.${s.name}`] = g; // read and written in place (train-graph.ts grad_acc)
      }
      const r = await runInto(sess, feeds, into, ['metrics']);
      addMetrics(sums, r.metrics.data as Float32Array, names);
    }
    let sq = 0;
    for (const g of this.gradBuf.values()) for (let i = 0; i < g.length; i++) sq += g[i] * g[i];
    const gradNorm = Math.sqrt(sq);
    const skipped = !Number.isFinite(gradNorm);
    if (!skipped) {
      const t = this.opt.step + 1;
      const [b1, b2] = this.optim.betas;
      const coef = this.optim.maxGradNorm === null ? 1 : Math.min(this.optim.maxGradNorm / (gradNorm + 1e-6), 1);
      const adam = await this.cache.get(
        `adamw:${keyOf({ betas: this.optim.betas, eps: this.optim.eps })}`,
        () => buildAdamWGraph(this.optim),
        this.sessOpts,
      );
      // lr · k for the vision tower's parameters (optim.visionLrScale = k)
      const scalarsAt = (k: number) => ({
        [ADAMW_IO.gradScale]: tensor('float32', [coef], []),
        [ADAMW_IO.stepSize]: tensor('float32', [(lr * k) / (1 - Math.pow(b1, t))], []),
        [ADAMW_IO.bc2Sqrt]: tensor('float32', [Math.sqrt(1 - Math.pow(b2, t))], []),
        [ADAMW_IO.decay]: tensor('float32', [1 - lr * k * this.optim.weightDecay], []),
      });
      const base = scalarsAt(1),
        vk = this.optim.visionLrScale ?? 1,
        vision = vk === 1 ? base : scalarsAt(vk);
      for (const s of this.specs) {
        if (this.opts.freezeVisionTower && isVisionParam(s.name)) continue; // frozen tower: no update, no decay
        const scalars = isVisionParam(s.name) ? vision : base;
        const w = this.weights.get(s.name)!,
          g = this.gradBuf.get(s.name)!,
          m = this.opt.expAvg.get(s.name)!,
          v = this.opt.expAvgSq.get(s.name)!;
        const slice = this.opts.optimizerSlice ?? ADAMW_SLICE;
        for (let o = 0; o < w.length; o += slice) {
          const e = Math.min(w.length, o + slice),
            n = [e - o];
          const tw = tensor('float32', w.subarray(o, e), n),
            tm = tensor('float32', m.subarray(o, e), n),
            tv = tensor('float32', v.subarray(o, e), n);
          await runInto(
            adam,
            {
              ...scalars,
              [ADAMW_IO.w]: tw,
              [ADAMW_IO.g]: tensor('float32', g.subarray(o, e), n),
              [ADAMW_IO.m]: tm,
              [ADAMW_IO.v]: tv,
            },
            { [ADAMW_IO.newW]: tw, [ADAMW_IO.newM]: tm, [ADAMW_IO.newV]: tv },
            [],
          );
        }
      }
      this.opt.step = t;
    }
    const maskSum = micro.reduce((s, m) => s + m.maskSum, 0);
    return {
      metrics: { ...finalizeMetrics(sums, maskSum), ...(micro[0].extra ?? {}), grad_norm: gradNorm, lr },
      skipped,
      step: this.opt.step,
    };
  }

  /**
   * Loss, metrics and per-token log-probs (policy) or values (critic) without updating; aligned to
   * token positions (position 0 is 0). `adapters: false` (LoRA): the base model with the adapters
   * off — the reference policy, from the same weights in memory.
   */
  async evaluate(
    batch: TrainBatch,
    opts: { adapters?: boolean } = {},
  ): Promise<{ metrics: Record<string, number>; perToken: Float32Array }> {
    const micro = this.prepare(batch);
    const useLw = !!batch.lossWeights && this.loss.type === 'policy';
    const sums: Record<string, number> = {};
    const B = batch.batchSize,
      T = batch.seqLen;
    const perToken = new Float32Array(B * T);
    let row = 0;
    for (const m of micro) {
      const { sess, names } = await this.session('eval', useLw, m.T, opts.adapters ?? true);
      const r = await sess.run(this.feeds(m, sess));
      addMetrics(sums, r.metrics.data as Float32Array, names);
      const out = (r.log_probs ?? r.values_out).data as Float32Array;
      for (let i = 0; i < m.B; i++)
        for (let t = 0; t + 1 < m.T; t++) perToken[(row + i) * T + t + 1] = out[i * m.T + t];
      row += m.B;
    }
    return {
      metrics: {
        ...finalizeMetrics(
          sums,
          micro.reduce((s, m) => s + m.maskSum, 0),
        ),
        ...(micro[0].extra ?? {}),
      },
      perToken,
    };
  }

  /** The mini-batch loss gradient (summed over micro-batches) and metrics, without updating. */
  async computeGradients(batch: TrainBatch): Promise<{ grads: Weights; metrics: Record<string, number> }> {
    const micro = this.prepare(batch);
    const useLw = !!batch.lossWeights && this.loss.type === 'policy';
    const sums: Record<string, number> = {};
    let acc: Map<string, Float32Array> | null = null;
    for (const m of micro) {
      const { sess, names } = await this.session('grad', useLw, m.T);
      const r = await sess.run(this.feeds(m, sess));
      addMetrics(sums, r.metrics.data as Float32Array, names);
      acc = accumulate(acc, r, this.specs, this.packed);
    }
    return {
      grads: acc!,
      metrics: {
        ...finalizeMetrics(
          sums,
          micro.reduce((s, m) => s + m.maskSum, 0),
        ),
        ...(micro[0].extra ?? {}),
      },
    };
  }

  private get floatType(): 'float32' {
    return 'float32';
  }

  private baseShapes: Map<string, number[]> | null = null;
  private baseShape(name: string): number[] {
    this.baseShapes ??= new Map(paramSpecs(this.model).map((s) => [s.name, s.shape]));
    return this.baseShapes.get(name)!;
  }

  private feeds(m: Prepared, sess: ort.InferenceSession): Record<string, ort.Tensor> {
    const f: Record<string, ort.Tensor> = {};
    for (const name of sess.inputNames) {
      const d = m.feeds[name];
      if (d)
        f[name] = tensor(
          d instanceof BigInt64Array ? 'int64' : 'float32',
          d,
          name === 'head_index' ? [d.length] : [m.B, m.T],
        );
    }
    if (this.loss.type === 'policy' && this.loss.entropyCoeffInput)
      f[ENTROPY_COEFF_INPUT] = tensor(this.floatType, [this.entropyCoeff], []);
    if (this.base) {
      // LoRA: the frozen base (the same arrays every run), and the adapters when the graph has them
      for (const [name, w] of this.base) f[name] = tensor('float32', w, this.baseShape(name));
      if (!sess.inputNames.includes(this.specs[0].name)) return f;
    }
    for (const s of this.specs) f[s.name] = tensor('float32', this.weights.get(s.name)!, s.shape);
    if (m.vision) Object.assign(f, m.vision);
    return f;
  }

  /** Validate, shift, compute aggregation weights over the whole mini-batch, split into trimmed micro-batches. */
  private prepare(batch: TrainBatch): Prepared[] {
    const { batchSize: B, seqLen: T } = batch;
    if (!(Number.isInteger(B) && B > 0 && Number.isInteger(T) && T >= 2))
      throw new ConfigError(`train batch: need batchSize ≥ 1 and seqLen ≥ 2, got ${B}×${T}`);
    if (T > this.model.maxPositionEmbeddings)
      throw new ConfigError(
        `train batch: seqLen ${T} exceeds maxPositionEmbeddings ${this.model.maxPositionEmbeddings}`,
      );
    const n = B * T;
    const check = (name: string, a: ArrayLike<number> | undefined, required: boolean) => {
      if (!a) {
        if (required)
          throw new ConfigError(
            `train batch: "${name}" is required for the ${this.loss.type === 'policy' ? `${this.loss.lossMode} ` : ''}${this.loss.type} loss`,
          );
        return;
      }
      if (a.length !== n)
        throw new ConfigError(`train batch: "${name}" has ${a.length} values, expected batchSize × seqLen = ${n}`);
    };
    check('tokens', batch.tokens, true);
    check('responseMask', batch.responseMask, true);
    check('attentionMask', batch.attentionMask, false);
    check('positions', batch.positions, false);
    const pol = this.loss.type === 'policy' ? this.loss : null;
    const needs = pol ? policyLossNeeds(pol) : null;
    check('advantages', batch.advantages, !!needs?.advantages);
    check('oldLogprobs', batch.oldLogprobs, !!pol);
    check('refLogprobs', batch.refLogprobs, !!pol?.useKlLoss);
    check('lossWeights', batch.lossWeights, false);
    check('values', batch.values, this.loss.type === 'value');
    check('returns', batch.returns, this.loss.type === 'value');
    if (batch.images && batch.images.length !== B)
      throw new ConfigError(`train batch: "images" has ${batch.images.length} rows, expected one per sequence (${B})`);
    if (!this.model.vision && hasImages(batch.images))
      throw new ConfigError('train batch: "images" given but the model is text-only (no vision config)');
    const V = this.model.vocabSize;
    for (let i = 0; i < n; i++) {
      const tkn = batch.tokens[i];
      if (!(tkn >= 0 && tkn < V))
        throw new ConfigError(
          `train batch: token ${tkn} at row ${Math.floor(i / T)}, position ${i % T} is outside the vocabulary [0, ${V})`,
        );
    }
    const attn = batch.attentionMask ?? new Float32Array(n).fill(1);
    // shifted loss mask: position t carries token t + 1
    const lossMask = new Float32Array(n);
    for (let r = 0; r < B; r++)
      for (let t = 0; t + 1 < T; t++) lossMask[r * T + t] = batch.responseMask[r * T + t + 1] ? 1 : 0;
    let maskSum = 0;
    for (let i = 0; i < n; i++) maskSum += lossMask[i];
    if (maskSum === 0)
      throw new ConfigError('train batch: no response tokens to train on (responseMask is all zero after position 0)');
    const info: GlobalBatchInfo = { ...(batch.globalBatch ?? {}) };
    if (info.loss_scale_factor == null) info.loss_scale_factor = T;
    let agg: ArrayLike<number>;
    let nftRows: { rhat: Float32Array; positive: Float32Array } | null = null;
    let extra: Record<string, number> | undefined;
    if (pol && needs!.nft) {
      // NFT: r̂ per row from the group's ±1 rewards (lib/rl/nft.ts); its own aggregation ("sum" = Σ ÷ scale)
      if (!batch.rewards || !(batch.groupIndex || batch.groupAccuracy))
        throw new ConfigError(
          'train batch: the nft loss needs "rewards" (±1 per sequence) and "groupIndex" (group label per sequence) or "groupAccuracy" (the fraction correct of each sequence\'s group)',
        );
      if (batch.rewards.length !== B)
        throw new ConfigError(
          `train batch: "rewards" has ${batch.rewards.length} values, expected one per sequence (${B})`,
        );
      const rh = batch.groupAccuracy
        ? rHatFromAccuracy(batch.groupAccuracy, B, pol.nft.rHatMin, pol.nft.rHatMax)
        : nftRHat(batch.rewards, batch.groupIndex!, { r_hat_min: pol.nft.rHatMin, r_hat_max: pol.nft.rHatMax });
      nftRows = { rhat: new Float32Array(n), positive: new Float32Array(n) };
      for (let r = 0; r < B; r++) {
        if (batch.rewards[r] !== 1 && batch.rewards[r] !== -1)
          throw new ConfigError(`train batch: nft rewards must be +1 or −1; rewards[${r}] = ${batch.rewards[r]}`);
        nftRows.rhat.fill(rh[r], r * T, (r + 1) * T);
        nftRows.positive.fill(batch.rewards[r] > 0 ? 1 : 0, r * T, (r + 1) * T);
      }
      extra = { r_hat_mean: rh.reduce((a, v) => a + v, 0) / B };
      agg =
        pol.nft.lossAggMode === 'sum'
          ? lossMask.map((m) => m / pol.nft.lossScaleFactor)
          : lossAggModes.get(pol.nft.lossAggMode).weights(Float64Array.from(lossMask), B, T, info);
    } else {
      agg = lossAggModes.get(this.loss.lossAggMode).weights(Float64Array.from(lossMask), B, T, info);
    }
    // gspo / sapo / geo_mean: the pg term's own aggregation over the whole mini-batch
    const pgAgg =
      pol && !needs!.nft ? (pgAggWeights(pol, Float64Array.from(lossMask), B, T, info) ?? undefined) : undefined;
    const shift = (a: ArrayLike<number> | undefined): Float32Array | undefined => {
      if (!a) return undefined;
      const o = new Float32Array(n);
      for (let r = 0; r < B; r++) for (let t = 0; t + 1 < T; t++) o[r * T + t] = a[r * T + t + 1];
      return o;
    };
    const positions = batch.positions ?? positionsFromMask(attn, B, T);
    const targets = new Int32Array(n);
    for (let r = 0; r < B; r++) for (let t = 0; t + 1 < T; t++) targets[r * T + t] = batch.tokens[r * T + t + 1];
    const full: Record<string, ArrayLike<number> | undefined> = {
      input_ids: batch.tokens,
      position_ids: positions,
      attention_mask: attn,
      targets,
      loss_mask: lossMask,
      agg_weights: agg,
      advantages: shift(batch.advantages),
      old_log_probs: shift(batch.oldLogprobs),
      ref_log_probs: shift(batch.refLogprobs),
      loss_weights: shift(batch.lossWeights),
      values: shift(batch.values),
      returns: shift(batch.returns),
      nft_rhat: nftRows?.rhat,
      nft_positive: nftRows?.positive,
      pg_agg_weights: pgAgg,
    };
    const mb = this.opts.microBatchSize ?? B;
    const out: Prepared[] = [];
    for (let r0 = 0; r0 < B; r0 += mb) {
      const rows = Math.min(mb, B - r0);
      // trim to the longest real row of this micro-batch (positions past it are padding everywhere)
      let Tk = 2;
      for (let r = r0; r < r0 + rows; r++)
        for (let t = T - 1; t >= Tk; t--)
          if (attn[r * T + t]) {
            Tk = t + 1;
            break;
          }
      const feeds: Record<string, Float32Array | BigInt64Array> = {};
      let ms = 0;
      for (const [name, a] of Object.entries(full)) {
        if (!a) continue;
        const isInt = name === 'input_ids' || name === 'position_ids' || name === 'targets';
        const o = isInt ? new BigInt64Array(rows * Tk) : new Float32Array(rows * Tk);
        for (let r = 0; r < rows; r++) {
          for (let t = 0; t < Tk; t++) {
            const v = a[(r0 + r) * T + t];
            if (isInt) (o as BigInt64Array)[r * Tk + t] = BigInt(v);
            else (o as Float32Array)[r * Tk + t] = v;
          }
        }
        if (name === 'loss_mask') for (let i = 0; i < o.length; i++) ms += (o as Float32Array)[i];
        feeds[name] = o;
      }
      if (needs?.clipCovPriority) {
        // clip_cov selects per micro-batch (as verl); the same seeded draw as lib/rl's rng option
        if (rows * Tk > 2 ** 24)
          throw new ConfigError(
            `train batch: clip_cov needs at most 2^24 tokens per micro-batch (its priorities are exact in float32), got ${rows}×${Tk}; lower the micro-batch size`,
          );
        feeds.clip_cov_priority = Float32Array.from(
          clipCovPriorities(rows * Tk, Rng.fromSeed(`clip_cov:${this.opts.seed ?? 0}:${this.opt.step}:${out.length}`)),
        );
      }
      if (this.headIndex) Object.assign(feeds, headFeeds(feeds.loss_mask as Float32Array));
      const vision = this.model.vision
        ? visionFeeds(this.model, feeds.input_ids, rows, Tk, batch.images?.slice(r0, r0 + rows), 'train batch')
        : undefined;
      out.push({ B: rows, T: Tk, feeds, maskSum: ms, extra, ...(vision ? { vision } : {}) });
    }
    return out;
  }
}

/**
 * train-graph.ts headIndex's inputs from a micro-batch's flat loss mask: `head_index` the positions
 * with a non-zero mask (ascending), `head_inverse` k + 1 at the k-th of them and 0 elsewhere. A
 * micro-batch without loss positions runs the head at position 0 alone, placed nowhere.
 */
export function headFeeds(lossMask: ArrayLike<number>): { head_index: BigInt64Array; head_inverse: BigInt64Array } {
  const inverse = new BigInt64Array(lossMask.length);
  const index: bigint[] = [];
  for (let i = 0; i < lossMask.length; i++)
    if (lossMask[i] !== 0) {
      index.push(BigInt(i));
      inverse[i] = BigInt(index.length);
    }
  return { head_index: index.length ? BigInt64Array.from(index) : BigInt64Array.of(0n), head_inverse: inverse };
}

/** HF-style position ids: cumsum(mask) − 1, clamped at 0 (so left padding works). */
export function positionsFromMask(mask: ArrayLike<number>, B: number, T: number): Int32Array {
  const pos = new Int32Array(B * T);
  for (let r = 0; r < B; r++) {
    let c = 0;
    for (let t = 0; t < T; t++) {
      if (mask[r * T + t]) c++;
      pos[r * T + t] = Math.max(c - 1, 0);
    }
  }
  return pos;
}

function addMetrics(sums: Record<string, number>, data: Float32Array, names: string[]): void {
  names.forEach((k, i) => {
    sums[k] = (sums[k] ?? 0) + data[i];
  });
}

function accumulate(
  acc: Map<string, Float32Array> | null,
  r: ort.InferenceSession.OnnxValueMapType,
  specs: ParamSpec[],
  packed: boolean,
): Map<string, Float32Array> {
  const out = acc ?? new Map<string, Float32Array>();
  const all = packed ? (r['grad.packed'].data as Float32Array) : null;
  let o = 0;
  for (const s of specs) {
    const n = numel(s.shape);
    const g = all ? all.subarray(o, o + n) : (r[`grad.${s.name}`].data as Float32Array);
    o += n;
    const a = out.get(s.name);
    if (!a) out.set(s.name, Float32Array.from(g));
    else for (let i = 0; i < a.length; i++) a[i] += g[i];
  }
  return out;
}

function cloneState(s: OptimizerState): OptimizerState {
  return { step: s.step, expAvg: cloneWeights(s.expAvg), expAvgSq: cloneWeights(s.expAvgSq) };
}

export function createTrainer(opts: TrainerOptions): Trainer {
  return new Trainer(opts);
}

/** NFT r̂ per row from the accuracy of its whole group: clamp(acc, lo, hi) (lib/rl/nft.ts nftRHat). */
function rHatFromAccuracy(acc: ArrayLike<number>, B: number, lo: number, hi: number): Float64Array {
  if (lo > hi) throw new ConfigError(`nft: rHatMin (${lo}) must be ≤ rHatMax (${hi})`);
  if (acc.length !== B)
    throw new ConfigError(`train batch: "groupAccuracy" has ${acc.length} values, expected one per sequence (${B})`);
  const out = new Float64Array(B);
  for (let r = 0; r < B; r++) {
    const a = acc[r];
    if (!(a >= 0 && a <= 1))
      throw new ConfigError(`train batch: "groupAccuracy" must be a fraction in [0, 1]; groupAccuracy[${r}] = ${a}`);
    out[r] = Math.min(Math.max(a, lo), hi);
  }
  return out;
}
