/**
 * The training graph: forward → loss → explicit backward → (global-norm clipping → AdamW) in one
 * ONNX graph. Modes:
 *  - `eval`: forward and loss only; outputs `metrics` and per-position `log_probs` (or `values`).
 *  - `grad`: also outputs `grad.<param>` (one micro-batch's share of the mini-batch gradient).
 *  - `grad_acc`: as `grad`, plus `acc.<param>` inputs that each gradient is accumulated into as
 *    the backward reaches it (GraphBuilder.grad `into`); the CPU step binds `grad.<param>` to the
 *    very buffer it feeds as `acc.<param>`, so k micro-batches sum in one set of gradient buffers.
 *  - `step`: outputs `new.<param>`, `new.<param>.exp_avg`, `new.<param>.exp_avg_sq`, `grad_norm`
 *    (GPU devices; on the CPU the trainer runs `grad` then the small in-place `buildAdamWGraph`).
 *  - `step_acc`: as `step`, with `acc.<param>` inputs added to the gradient (the sum of the earlier
 *    micro-batches' gradients), so k micro-batches cost k runs and the update stays in-graph.
 *
 * Inputs (all [B, T] row-major, position t predicts token t + 1; see train.ts for the shift):
 * `input_ids`, `position_ids` (int64), `attention_mask`, `targets` (int64), `loss_mask`,
 * `agg_weights`, and per loss: `advantages`, `old_log_probs`, `ref_log_probs`, `loss_weights`,
 * `nft_rhat`, `nft_positive`, `pg_agg_weights` (policy losses that fix their pg aggregation),
 * `clip_cov_priority` (clip_cov's random token priorities), `values`, `returns` (value). Parameters by HF name. Optimizer scalars (computed in
 * float64 outside, like torch's AdamW): `adam_step_size` = lr / (1 − β₁ᵗ), `adam_bc2_sqrt` =
 * √(1 − β₂ᵗ), `adam_decay` = 1 − lr·weight_decay.
 *
 * AdamW (Loshchilov & Hutter 2019, torch.optim.AdamW): g ← g·min(1, max_norm / (‖g‖ + 1e-6));
 * m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²; p ← p·(1 − lr·λ) − lr/(1−β₁ᵗ) · m / (√v / √(1−β₂ᵗ) + ε).
 * A vision parameter with optim.visionLrScale = k ≠ 1 uses lr·k: step_size·k and 1 − k·(1 − decay).
 */
import { GraphBuilder, type Dim, type FloatDType, type Var } from '../onnx/builder.ts';
import { numel } from '../onnx/dims.ts';
import { chunkedLmHeadLogprob } from '../onnx/nn.ts';
import type { ModelConfig } from './config.ts';
import { declareParams, llamaForward, valueHead, type ParamVars } from './llama.ts';
import {
  policyLossGraph,
  policyLossNeeds,
  sftLossGraph,
  valueLossGraph,
  type LossConfig,
  type LossGraph,
  type TokenTensors,
} from './loss.ts';
import { isVisionParam, paramSpecs } from './params.ts';
import { mropeDeltaInput, placeImageTokens } from './vision.ts';
import { loraSpecs, type LoraConfig } from './lora.ts';
import { logitBiasOf } from './decode-graph.ts';

export interface OptimConfig {
  betas: [number, number];
  eps: number;
  weightDecay: number;
  /** Global-norm clip; null = no clipping (the norm is still reported). */
  maxGradNorm: number | null;
  /**
   * Learning-rate multiplier of a VLM's vision tower (`visual.*`): its AdamW step and decoupled
   * decay use lr · visionLrScale (default 1). A tower trained from scratch under a larger init
   * than the decoder's moves relatively slower at one lr (docs/experiments/number-game-vision.md).
   */
  visionLrScale?: number;
}

export type TrainGraphMode = 'eval' | 'grad' | 'grad_acc' | 'step' | 'step_acc';

export interface TrainGraphSpec {
  model: ModelConfig;
  loss: LossConfig;
  optim: OptimConfig;
  mode: TrainGraphMode;
  float?: FloatDType;
  /** Whether the batch carries per-token `loss_weights` (policy losses). */
  lossWeights?: boolean;
  /**
   * One output instead of one per parameter: `grad.packed` (grad mode: every gradient, flattened,
   * in paramSpecs order) or `new.packed` (step modes: all new weights, then all first moments, then
   * all second moments). On a GPU execution provider each output is a separate read-back with a
   * device sync, which dominates a small step.
   */
  packed?: boolean;
  /** Vocabulary rows per chunk of the fused LM head + log-softmax (default `HEAD_CHUNK`). */
  headChunk?: number;
  /**
   * A VLM's vision tower gets no gradient (actor.model.freeze_vision_tower): its `grad.*` are
   * zero and the step modes pass its weights and moments through unchanged (no decay either).
   */
  freezeVisionTower?: boolean;
  /**
   * LoRA (lib/model/lora.ts): the base weights stay inputs but are frozen (no gradient, no AdamW
   * state); the adapters `<module>.lora_A.weight` / `.lora_B.weight` are the trained parameters,
   * so `grad.*`, `new.*`, `acc.*` and the moments are the adapters' only.
   */
  lora?: LoraConfig;
  /**
   * Gradient checkpointing (actor.model.enable_gradient_checkpointing): every decoder layer keeps
   * only its input for the backward and recomputes its forward there (llama.ts checkpointLayers):
   * activation memory of one layer instead of all, for one more forward's compute; a VLM's ViT
   * blocks likewise (unless frozen). Same gradients (test/unit/model/checkpointing.test.ts). No
   * effect on `eval`.
   */
  gradientCheckpointing?: boolean;
  /** Causal attention by query blocks (llama.ts causalBlocks): the masked score blocks are not computed. Default 1. */
  queryBlocks?: number;
  /**
   * The LM head only where the loss reads it (`grad` and step modes of the token losses): inputs
   * `head_index` int64 [N] (the flat B·T positions with a non-zero loss mask, ascending) and
   * `head_inverse` int64 [B, T] (k + 1 at the k-th of them, 0 elsewhere). The head runs on the N
   * gathered hidden states; its per-token results are placed back at their positions, and the
   * other positions read the old log-probs (ratio 1) and zero entropy, which the loss masks out.
   * A GRPO batch's prompt quarter, or an SFT row's prompt, then costs no vocabulary-sized work.
   */
  headIndex?: boolean;
}

/**
 * Default vocabulary chunk of the LM head: the largest logits tensor is [B·T, HEAD_CHUNK] f32
 * (2048 tokens × 8192 × 4 B = 64 MiB) instead of [B·T, V] (151936 vocab: 1.2 GiB).
 */
export const HEAD_CHUNK = 8192;

/** The LM head's weight [V, D]: lm_head.weight, or the embedding when tied. */
export function lmHeadWeight(model: ModelConfig, p: ParamVars): Var {
  const w = p.get(model.tieWordEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight');
  if (!w) throw new Error('internal: LM head weight not declared');
  return w;
}

export interface TrainGraph {
  builder: GraphBuilder;
  /** Names of the entries of the `metrics` output vector (additive sums). */
  metricNames: string[];
  /** Per-token batch inputs the graph expects (besides ids/positions/attention mask). */
  batchInputs: string[];
}

export function buildTrainGraph(spec: TrainGraphSpec): TrainGraph {
  const { model, loss, optim, mode } = spec;
  const b = new GraphBuilder({ name: `train_${mode}`, float: spec.float ?? 'float32' });
  const F = b.float;
  const BT = ['B', 'T'];
  const ids = b.input('input_ids', 'int64', BT);
  const positions = b.input('position_ids', 'int64', BT);
  const attn = b.input('attention_mask', F, BT);
  const batchInputs: string[] = [];
  const tok = (name: string, dtype: 'int64' | FloatDType = F): Var => {
    batchInputs.push(name);
    return b.input(name, dtype, BT);
  };
  const flat = (v: Var) => b.reshape(v, ['B*T']);
  const targets = tok('targets', 'int64');
  const t: TokenTensors = { mask: flat(tok('loss_mask')), aggWeights: flat(tok('agg_weights')) };
  if (loss.type === 'policy') {
    const needs = policyLossNeeds(loss);
    if (needs.advantages) t.advantages = flat(tok('advantages'));
    t.oldLogprobs = flat(tok('old_log_probs'));
    if (needs.nft) {
      t.nftRHat = flat(tok('nft_rhat'));
      t.nftPositive = flat(tok('nft_positive'));
    }
    if (needs.pgAggWeights) t.pgAggWeights = flat(tok('pg_agg_weights'));
    if (needs.clipCovPriority) t.clipCovPriority = flat(tok('clip_cov_priority'));
    t.rowShape = ['B', 'T'];
    if (loss.useKlLoss) t.refLogprobs = flat(tok('ref_log_probs'));
    if (spec.lossWeights) t.lossWeights = flat(tok('loss_weights'));
  } else if (loss.type === 'value') {
    t.values = flat(tok('values'));
    t.returns = flat(tok('returns'));
  }

  const p = declareParams(b, model, 'inputs');
  // a VLM places its image tokens at the <|image_pad|> positions (vision.ts; inputs pixel_patches, patch_pos, patch_mask, embed_index);
  // with LoRA the whole base, vision tower included, is frozen: only the adapters are trained
  const freeze = !!spec.freezeVisionTower || !!spec.lora;
  const trained = spec.lora ? loraSpecs(model, spec.lora) : paramSpecs(model);
  const pl: ParamVars = new Map();
  if (spec.lora) for (const s of trained) pl.set(s.name, b.input(s.name, F, s.shape));
  const mropeDelta = model.vision ? mropeDeltaInput(b, model, ids) : null;
  const { hidden } = llamaForward(b, model, p, {
    ids,
    positions,
    ...(mropeDelta ? { mropeDelta } : {}),
    attentionMask: attn,
    ...(model.vision
      ? {
          placeImages: (x: Var, N: Dim) =>
            placeImageTokens(b, model, p, x, N, {
              freeze,
              checkpoint: !!spec.gradientCheckpointing && mode !== 'eval',
              ...(spec.lora ? { lora: { config: spec.lora, p: pl } } : {}),
            }),
        }
      : {}),
    ...(spec.lora ? { lora: { config: spec.lora, p: pl } } : {}),
    ...(spec.gradientCheckpointing && mode !== 'eval' ? { checkpointLayers: true } : {}),
    queryBlocks: spec.queryBlocks,
  });
  let lg: LossGraph;
  let perPosition: Var;
  if (loss.type === 'value') {
    t.vpred = valueHead(b, model, p, hidden);
    lg = valueLossGraph(b, t, loss);
    perPosition = t.vpred;
  } else {
    // the LM head fused with log-softmax / entropy over vocabulary chunks: [B·T, V] never exists
    const at = spec.headIndex && mode !== 'eval' ? headPositions(b, hidden, flat(targets)) : null;
    const r = b.scope('head', () =>
      chunkedLmHeadLogprob(b, at?.hidden ?? hidden, lmHeadWeight(model, p), at?.targets ?? flat(targets), {
        entropy: loss.type === 'policy',
        temperature: loss.temperature,
        chunk: spec.headChunk ?? HEAD_CHUNK,
        correct: loss.type === 'sft',
        logitBias: logitBiasOf(model), // the sampler's mask: one distribution for behaviour, old and new log-probs
      }),
    );
    const logprob = at ? at.place(r.logprob, t.oldLogprobs ?? 0) : r.logprob;
    const entropy = r.entropy && at ? at.place(r.entropy, 0) : r.entropy;
    const correct = r.correct && at ? at.place(r.correct, 0) : r.correct;
    t.logprob = logprob;
    // the entropy is always reported; it only carries a gradient when it is in the loss
    t.entropy =
      entropy && loss.type === 'policy' && loss.entropyCoeff === 0 && !loss.entropyCoeffInput
        ? b.stopGradient(entropy)
        : entropy;
    if (loss.type === 'policy') lg = policyLossGraph(b, t, loss);
    else lg = sftLossGraph(b, t, correct!);
    perPosition = logprob;
  }
  const metricNames = Object.keys(lg.sums);
  b.output(
    b.concat(
      metricNames.map((k) => b.reshape(lg.sums[k], [1])),
      0,
    ),
    'metrics',
  );
  if (mode === 'eval') {
    b.output(b.reshape(perPosition, BT), loss.type === 'value' ? 'values_out' : 'log_probs');
    return { builder: b, metricNames, batchInputs };
  }

  const specs = trained;
  const pv = specs.map((s) => (spec.lora ? pl : p).get(s.name)!);
  const acc = () => specs.map((s) => b.input(`acc.${s.name}`, F, s.shape));
  let grads = b.grad(lg.loss, pv, undefined, mode === 'grad_acc' ? { into: acc() } : {});
  if (mode === 'grad' || mode === 'grad_acc') {
    if (spec.packed) b.output(packFlat(b, grads), 'grad.packed');
    else grads.forEach((g, i) => b.output(g, `grad.${specs[i].name}`));
    return { builder: b, metricNames, batchInputs };
  }
  b.scope('optim', () => {
    if (mode === 'step_acc') {
      const a = acc();
      grads = grads.map((g, i) => b.add(g, a[i]));
    }
    const sq = grads.map((g) =>
      b.reduceSum(
        b.mul(g, g),
        g.shape.map((_, i) => i),
      ),
    );
    const total = sq.slice(1).reduce((a, s) => b.add(a, s), sq[0]);
    const norm = b.sqrt(total);
    b.output(norm, 'grad_norm');
    const coef = optim.maxGradNorm === null ? null : b.min(b.div(optim.maxGradNorm, b.add(norm, 1e-6)), 1);
    const stepSize = b.input('adam_step_size', F, []);
    const bc2Sqrt = b.input('adam_bc2_sqrt', F, []);
    const decay = b.input('adam_decay', F, []);
    const [b1, b2] = optim.betas;
    const outW: Var[] = [],
      outM: Var[] = [],
      outV: Var[] = [];
    specs.forEach((s, i) => {
      b.scope(s.name, () => {
        // with LoRA the trained tower parameters are its adapters: frozen only with freezeVisionTower
        if ((spec.lora ? !!spec.freezeVisionTower : freeze) && isVisionParam(s.name)) {
          // frozen: weights and moments unchanged (the moment inputs are still declared, so feeds stay uniform)
          outW.push(pv[i]);
          outM.push(b.input(`${s.name}.exp_avg`, F, s.shape));
          outV.push(b.input(`${s.name}.exp_avg_sq`, F, s.shape));
          return;
        }
        const g = coef ? b.mul(grads[i], coef) : grads[i];
        const m = b.input(`${s.name}.exp_avg`, F, s.shape);
        const v = b.input(`${s.name}.exp_avg_sq`, F, s.shape);
        const m2 = b.add(b.mul(m, b1), b.mul(g, 1 - b1));
        const v2 = b.add(b.mul(v, b2), b.mul(b.mul(g, g), 1 - b2));
        const denom = b.add(b.div(b.sqrt(v2), bc2Sqrt), optim.eps);
        const k = isVisionParam(s.name) ? (optim.visionLrScale ?? 1) : 1;
        const upd = b.mul(b.div(m2, denom), k === 1 ? stepSize : b.mul(stepSize, k));
        const w = optim.weightDecay !== 0 ? b.mul(pv[i], k === 1 ? decay : b.sub(1, b.mul(b.sub(1, decay), k))) : pv[i];
        outW.push(b.sub(w, upd));
        outM.push(m2);
        outV.push(v2);
      });
    });
    if (spec.packed) b.output(packFlat(b, [...outW, ...outM, ...outV]), 'new.packed');
    else {
      specs.forEach((s, i) => {
        b.output(outW[i]!, `new.${s.name}`);
        b.output(outM[i]!, `new.${s.name}.exp_avg`);
        b.output(outV[i]!, `new.${s.name}.exp_avg_sq`);
      });
    }
  });
  return { builder: b, metricNames, batchInputs };
}

/**
 * The loss positions of a [B·T] batch (TrainGraphSpec.headIndex): hidden [B·T, D] → [N, D] and
 * targets [B·T] → [N] gathered at `head_index`; `place(v [N], outside)` puts a per-position result
 * back on [B·T] through `head_inverse` (a Gather from [outside-row; v], whose gradient is a
 * scatter-add: no duplicate-index hazard), `outside` where the inverse is 0.
 */
function headPositions(
  b: GraphBuilder,
  hidden: Var,
  targets: Var,
): { hidden: Var; targets: Var; place: (v: Var, outside: Var | number) => Var } {
  const idx = b.input('head_index', 'int64', ['N']);
  const inv = b.reshape(b.input('head_inverse', 'int64', ['B', 'T']), ['B*T']);
  const inside = b.greater(inv, b.const(0, 'int64'));
  const place = (v: Var, outside: Var | number): Var => {
    if (v.dtype === 'bool') return b.cast(place(b.cast(v, 'float32'), outside), 'bool'); // onnxruntime's CPU Where takes no bool
    const zero = b.const([0], v.dtype); // [1]: the row every outside position reads
    return b.where(
      inside,
      b.gather(b.concat([zero, v], 0), inv),
      typeof outside === 'number' ? b.const(outside, v.dtype) : outside,
    );
  };
  return { hidden: b.gather(hidden, idx), targets: b.gather(targets, idx), place };
}

/** Every tensor flattened and concatenated, in order: one [Σ numel] vector. */
function packFlat(b: GraphBuilder, vs: readonly Var[]): Var {
  return b.concat(
    vs.map((v) => b.reshape(v, [numel(v.shape)])),
    0,
  );
}

/** Names of the AdamW graph's inputs / outputs (every tensor a flat [n] slice of one parameter). */
export const ADAMW_IO = {
  w: 'w',
  g: 'g',
  m: 'm',
  v: 'v',
  gradScale: 'grad_scale',
  stepSize: 'adam_step_size',
  bc2Sqrt: 'adam_bc2_sqrt',
  decay: 'adam_decay',
  newW: 'new_w',
  newM: 'new_m',
  newV: 'new_v',
} as const;

/**
 * AdamW on one flat slice [n] of a parameter, its gradient and moments (torch.optim.AdamW, as the
 * step graph): g ← g·grad_scale (the global-norm clip coefficient, computed outside);
 * m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²; w ← w·decay − step_size · m / (√v / bc2_sqrt + ε).
 * Each output is computed after the last read of the same input, so the trainer binds new_w /
 * new_m / new_v to the buffers of w / m / v (pre-allocated outputs) and the update is in place;
 * running it on slices of at most a few million elements bounds its temporaries.
 */
export function buildAdamWGraph(optim: Pick<OptimConfig, 'betas' | 'eps'>): Uint8Array {
  const b = new GraphBuilder({ name: 'adamw', float: 'float32' });
  const n = ['n'];
  const w = b.input(ADAMW_IO.w, 'float32', n),
    g0 = b.input(ADAMW_IO.g, 'float32', n);
  const m = b.input(ADAMW_IO.m, 'float32', n),
    v = b.input(ADAMW_IO.v, 'float32', n);
  const scale = b.input(ADAMW_IO.gradScale, 'float32', []),
    stepSize = b.input(ADAMW_IO.stepSize, 'float32', []);
  const bc2Sqrt = b.input(ADAMW_IO.bc2Sqrt, 'float32', []),
    decay = b.input(ADAMW_IO.decay, 'float32', []);
  const [b1, b2] = optim.betas;
  const g = b.mul(g0, scale);
  const m2 = b.add(b.mul(m, b1), b.mul(g, 1 - b1));
  const v2 = b.add(b.mul(v, b2), b.mul(b.mul(g, g), 1 - b2));
  const denom = b.add(b.div(b.sqrt(v2), bc2Sqrt), optim.eps);
  b.output(b.sub(b.mul(w, decay), b.mul(b.div(m2, denom), stepSize)), ADAMW_IO.newW);
  b.output(m2, ADAMW_IO.newM);
  b.output(v2, ADAMW_IO.newV);
  return b.toBytes();
}
