/**
 * An image policy in onnxruntime: its weights, AdamW moments and step count, the velocity session
 * (sampling) and one training session per loss (forward, backward and AdamW in one `session.run`).
 * AdamW scalars are computed in float64 outside the graph, as torch.optim.AdamW does:
 * step_size = lr/(1 − β₁ᵗ), bc2_sqrt = √(1 − β₂ᵗ), decay = 1 − lr·weight_decay.
 * `ema` (optional): an exponential moving average of the weights, w̄ ← d·w̄ + (1 − d)·w after
 * every step, used for sampling and evaluation when asked.
 * `lora` (optional; lib/image/lora.ts): `weights` given to the constructor are the frozen base, the
 * adapters (`adapter`, or PEFT's init seeded by `loraSeed`) are the trained parameters with the AdamW
 * state; `weights` is then the merged W + s·B·A (what sampling and a policy version hold), and the
 * EMA averages those merged weights (the base is constant, so it is the EMA of the adapters' update s·B·A).
 */
import type { InferenceSession } from 'onnxruntime-node';
import { createSession, tensor } from '../onnx/runtime.ts';
import { buildVelocityGraph, ditParamSpecs, type DitConfig, type DitWeights } from './dit.ts';
import { buildImageTrainGraph, type ImageLossConfig, type ImageOptim } from './flow-graph.ts';
import { ditFiles, ditOptimizerFile, loadDitOptimizer, type DitModel, type DitOptimizerState } from './checkpoint.ts';
import { ditAdapterFile, ditLoraSpecs, initDitLora, mergeDitLora, DIT_ADAPTER_FILE, type DitLora } from './lora.ts';
import type { ParamSpec } from './dit.ts';

export interface ImageBatch {
  /** Float inputs by name (flat), images [B, C, S, S], per-image values [B]. */
  floats: Record<string, Float32Array | number[]>;
  cls: number[];
}

export class ImageTrainer {
  readonly specs;
  /** The trained parameters' specs: every weight's, or (LoRA) the adapters'. */
  readonly trainSpecs: ParamSpec[];
  /** The trained parameters (every weight, or the adapters). */
  private trainable: DitWeights;
  /** LoRA: the frozen base weights. */
  private readonly base: DitWeights | null = null;
  private merged: DitWeights | null = null;
  private m: DitWeights = new Map();
  private v: DitWeights = new Map();
  stepCount = 0;
  /** Whether the last step's update was skipped (its loss or gradient norm not finite). */
  lastSkipped = false;
  ema: DitWeights | null = null;
  private velocitySession: InferenceSession | null = null;
  private trainSessions = new Map<
    string,
    { session: InferenceSession; metricNames: string[]; batchInputs: string[] }
  >();

  constructor(
    readonly config: DitConfig,
    weights: DitWeights,
    readonly optim: ImageOptim & { lr: number },
    readonly opts: {
      threads?: number;
      emaDecay?: number;
      gradientCheckpointing?: boolean;
      lora?: DitLora | null;
      /** LoRA: the adapter to start from (default: PEFT's init seeded by loraSeed). */
      adapter?: DitWeights;
      loraSeed?: number | string;
    } = {},
  ) {
    this.specs = ditParamSpecs(config);
    const copy = (w: DitWeights) => new Map([...w].map(([k, a]) => [k, Float32Array.from(a)]));
    for (const s of this.specs)
      if (weights.get(s.name)?.length !== s.shape.reduce((a, b) => a * b, 1))
        throw new Error(`image policy: weight ${s.name} missing or of the wrong size`);
    if (opts.lora) {
      this.base = copy(weights);
      this.trainSpecs = ditLoraSpecs(config, opts.lora);
      this.trainable = copy(opts.adapter ?? initDitLora(config, opts.lora, opts.loraSeed ?? 0));
    } else {
      this.trainSpecs = this.specs;
      this.trainable = copy(weights);
    }
    for (const s of this.trainSpecs) {
      const n = this.trainable.get(s.name)?.length;
      if (n !== s.shape.reduce((a, b) => a * b, 1))
        throw new Error(`image policy: adapter ${s.name} missing or of the wrong size`);
      this.m.set(s.name, new Float32Array(n));
      this.v.set(s.name, new Float32Array(n));
    }
    if (opts.emaDecay !== undefined) this.ema = new Map([...this.weights].map(([k, a]) => [k, Float32Array.from(a)]));
  }

  /** The model's weights: the trained ones, or (LoRA) the merged base + s·B·A. */
  get weights(): DitWeights {
    if (!this.base) return this.trainable;
    this.merged ??= mergeDitLora(this.config, this.opts.lora!, this.base, this.trainable);
    return this.merged;
  }

  /** LoRA: the adapters (null without LoRA). */
  get adapter(): DitWeights | null {
    return this.base ? this.trainable : null;
  }

  /** A model directory's files of these weights (default the current ones): ditFiles, and with LoRA the adapter file. */
  files(model: Omit<DitModel, 'weights'>, weights: DitWeights = this.weights): Map<string, Uint8Array | string> {
    const f = ditFiles({ ...model, weights });
    if (this.base) f.set(DIT_ADAPTER_FILE, ditAdapterFile(this.config, this.opts.lora!, this.trainable));
    return f;
  }

  /** optimizer.safetensors of the AdamW state (over the trained parameters). */
  optimizerFile(): Uint8Array {
    return ditOptimizerFile(this.trainSpecs, this.optimizerState());
  }

  /** Restores the AdamW state from an optimizerFile. */
  loadOptimizer(file: string): void {
    this.setOptimizerState(loadDitOptimizer(file, this.trainSpecs));
  }

  private paramFeeds(w: DitWeights): Record<string, ReturnType<typeof tensor>> {
    const f: Record<string, ReturnType<typeof tensor>> = {};
    for (const s of this.specs) f[s.name] = tensor('float32', w.get(s.name)!, s.shape);
    return f;
  }

  /** v(x, t, cls) for a batch (flat [B, C, S, S]) with these weights (default: the current ones). */
  async velocity(x: Float32Array, t: number[], cls: number[], w: DitWeights = this.weights): Promise<Float32Array> {
    this.velocitySession ??= await createSession(buildVelocityGraph(this.config), { threads: this.opts.threads });
    const S = this.config.imageSize,
      B = cls.length;
    const out = await this.velocitySession.run({
      ...this.paramFeeds(w),
      x: tensor('float32', x, [B, this.config.channels, S, S]),
      t: tensor('float32', Float32Array.from(t), [B]),
      cls: tensor('int64', cls, [B]),
    });
    return out.velocity.data as Float32Array;
  }

  /** The AdamW state (copies). */
  optimizerState(): DitOptimizerState {
    const copy = (w: DitWeights) => new Map([...w].map(([k, a]) => [k, Float32Array.from(a)]));
    return { step: this.stepCount, expAvg: copy(this.m), expAvgSq: copy(this.v) };
  }

  /** Restores an AdamW state (optimizerState of a trainer of the same config). */
  setOptimizerState(st: DitOptimizerState): void {
    for (const s of this.trainSpecs) {
      const n = this.m.get(s.name)!.length;
      const a = st.expAvg.get(s.name),
        b = st.expAvgSq.get(s.name);
      if (a?.length !== n || b?.length !== n)
        throw new Error(`image policy: optimizer state of ${s.name} missing or of the wrong size`);
      this.m.set(s.name, Float32Array.from(a));
      this.v.set(s.name, Float32Array.from(b));
    }
    this.stepCount = st.step;
  }

  /**
   * One AdamW step on `loss` over the batch (at learning rate `lr`, default optim.lr); returns the
   * loss's metrics and the gradient norm. A non-finite loss or gradient norm skips the update
   * (`lastSkipped`).
   */
  async step(loss: ImageLossConfig, batch: ImageBatch, lr = this.optim.lr): Promise<Record<string, number>> {
    const key = JSON.stringify(loss);
    let entry = this.trainSessions.get(key);
    if (!entry) {
      const g = buildImageTrainGraph({
        dit: this.config,
        loss,
        optim: this.optim,
        mode: 'step',
        gradientCheckpointing: this.opts.gradientCheckpointing,
        lora: this.opts.lora ?? null,
      });
      const session = await createSession(g.builder.toBytes(), { threads: this.opts.threads });
      entry = { session, metricNames: g.metricNames, batchInputs: g.batchInputs };
      this.trainSessions.set(key, entry);
    }
    const sess = entry.session,
      g = entry;
    const B = batch.cls.length,
      S = this.config.imageSize,
      C = this.config.channels;
    const feeds: Record<string, ReturnType<typeof tensor>> = this.paramFeeds(this.base ?? this.trainable);
    for (const s of this.trainSpecs) {
      if (this.base) feeds[s.name] = tensor('float32', this.trainable.get(s.name)!, s.shape);
      feeds[`${s.name}.exp_avg`] = tensor('float32', this.m.get(s.name)!, s.shape);
      feeds[`${s.name}.exp_avg_sq`] = tensor('float32', this.v.get(s.name)!, s.shape);
    }
    for (const n of g.batchInputs) {
      if (n === 'cls') {
        feeds.cls = tensor('int64', batch.cls, [B]);
        continue;
      }
      const d = batch.floats[n];
      if (!d)
        throw new Error(`image batch: input ${n} missing (the ${loss.name} loss reads ${g.batchInputs.join(', ')})`);
      const a = d instanceof Float32Array ? d : Float32Array.from(d);
      feeds[n] = tensor('float32', a, a.length === B ? [B] : [B, C, S, S]);
    }
    const t = this.stepCount + 1;
    const [b1, b2] = this.optim.betas;
    feeds.adam_step_size = tensor('float32', [lr / (1 - b1 ** t)], []);
    feeds.adam_bc2_sqrt = tensor('float32', [Math.sqrt(1 - b2 ** t)], []);
    feeds.adam_decay = tensor('float32', [1 - lr * this.optim.weightDecay], []);
    const out = await sess.run(feeds);
    const gradNorm = Number((out.grad_norm.data as Float32Array)[0]);
    const metrics = out.metrics.data as Float32Array;
    const r: Record<string, number> = { grad_norm: gradNorm };
    g.metricNames.forEach((n, i) => (r[n] = metrics[i]));
    // a non-finite loss or gradient norm: the update is skipped (weights, moments and step count stay), as verl does
    this.lastSkipped = !Number.isFinite(gradNorm) || !Number.isFinite(r.loss);
    if (this.lastSkipped) return r;
    const packed = out['new.packed'].data as Float32Array;
    let off = 0;
    for (const dst of [this.trainable, this.m, this.v])
      for (const s of this.trainSpecs) {
        const n = dst.get(s.name)!.length;
        dst.set(s.name, packed.slice(off, off + n));
        off += n;
      }
    this.stepCount = t;
    this.merged = null;
    if (this.ema) {
      const d = this.opts.emaDecay!;
      for (const [k, w] of this.weights) {
        const e = this.ema.get(k)!;
        for (let i = 0; i < e.length; i++) e[i] = d * e[i] + (1 - d) * w[i];
      }
    }
    return r;
  }
}
