/**
 * Model-engine benchmark: ORT (this repo's graphs) vs the PyTorch reference (test/torch/), side by
 * side in one run, same intra-op thread count for both (RLSTREAM_BENCH_THREADS, default: the
 * machine's parallelism, at most 8).
 *
 *  - train step (forward, PPO loss, backward, global-norm clip, AdamW): ms per step and the ratio
 *    ORT ÷ torch, at d128 / 4 heads / 2 layers / vocab 64 / T48 / B64 (goal ≤ 0.7) and
 *    d256 / 4 heads / 4 layers / vocab 64 / T48 / B128 (goal ≤ 0.9). FFN width 4·d.
 *  - decode: tokens/s generating 32 tokens after 16-token prompts (T48 in all), temperature 1, no
 *    early stop, ORT in-graph loop vs torch KV cache, and the ratio ORT ÷ torch at B64 and B128
 *    (goal ≥ 1.3), on the d128 model.
 *  - achieved train-step FLOP/s (analytic count: 6 FLOPs per matmul weight per token plus
 *    attention's 12·T·d per token and layer) ÷ the best single-GEMM FLOP/s ORT reaches on this
 *    machine with the same threads (goal ≥ 0.6).
 *  - peak RSS of each configuration: every measurement runs in its own child process.
 *  - process CPU ms per step / per generate call next to the wall times: on a shared machine the
 *    CPU time is the steadier number (with 1 thread it is the wall time minus waiting).
 *
 *  - LoRA at the SmolLM2-135M shape (RLSTREAM_BENCH_LORA=1): rank 16 on all linear layers vs full
 *    fine-tuning, same batch (RLSTREAM_BENCH_LORA_B × RLSTREAM_BENCH_LORA_T, default 2 × 1024):
 *    peak RSS ratio (goal ≤ 0.5), step time ratio (≤ 0.8), policy-version bytes ratio (≤ 0.05: the
 *    PEFT adapter_model.safetensors vs model.safetensors); and for sampling, the cost of merging
 *    W + s·B·A once per version vs the adapter path's extra time per forward (B64 × T2, decode-like).
 *  - Gradient checkpointing (TrainerOptions.gradientCheckpointing) in the real-shape and LoRA rows:
 *    each configuration also runs with it (`…_ckpt` rows; RLSTREAM_BENCH_CKPT=off skips those,
 *    =only runs just those, e.g. the 0.5B shape at full depth, whose run without it does not fit).
 *  - Causal attention by query blocks (TrainerOptions.queryBlocks; llama.ts queryBlocksFor: 4
 *    blocks from 256 tokens a row): RLSTREAM_BENCH_QUERY_BLOCKS=n sets the ORT train rows' block
 *    count (1: the full T × T scores) for an A/B.
 *
 * Run: `node --import tsx bench/model.ts` (prints a table). Torch rows are left out, with a
 * message, when PyTorch is not installed.
 */
import { execFile } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { GraphBuilder } from '../lib/onnx/builder.ts';
import { createSession, tensor } from '../lib/onnx/runtime.ts';
import { initWeights, modelConfig, type ModelConfig, type ModelConfigInput } from '../lib/model/index.ts';
import { toHfConfig } from '../lib/model/config.ts';
import { Sampler } from '../lib/model/sample.ts';
import { defaultSessionCache } from '../lib/model/session-cache.ts';
import { Trainer, type TrainBatch } from '../lib/model/train.ts';
import { initLora, loraConfig, loraSpecs, mergeLora, PEFT_PREFIX } from '../lib/model/lora.ts';
import { mergeLoraOnnx } from '../lib/model/lora-merge.ts';
import { paramSpecs } from '../lib/model/params.ts';
import { encodeSafetensors } from '../lib/model/safetensors.ts';
import { Rng } from '../lib/util/rng.ts';
import { runTorch, tempDir, torchPython, writeJson } from '../devkit/torch-ref.ts';

export interface Row {
  name: string;
  value: number;
  unit: string;
  goal?: number;
  /** 'lower': the goal is an upper bound (value ≤ goal); default 'higher' (value ≥ goal). */
  better?: 'higher' | 'lower';
}

interface Shape {
  name: string;
  d: number;
  layers: number;
  heads: number;
  vocab: number;
  T: number;
  B: number;
  trainGoal: number;
}

const SHAPES: Shape[] = [
  { name: 'd128_l2_b64_t48', d: 128, layers: 2, heads: 4, vocab: 64, T: 48, B: 64, trainGoal: 0.7 },
  { name: 'd256_l4_b128_t48', d: 256, layers: 4, heads: 4, vocab: 64, T: 48, B: 128, trainGoal: 0.9 },
];
const DECODE = { prompt: 16, newTokens: 32, batches: [64, 128], goal: 1.3 };

/**
 * Real shapes (published configs, random weights), run when RLSTREAM_BENCH_REAL=1 (they need
 * minutes per step on a few cores and ~16 GB at 0.5B; ORT and torch one after the other):
 * GRPO update step at micro-batch 2 × 1024 tokens; RLSTREAM_BENCH_REAL_LAYERS overrides the depth
 * (development), RLSTREAM_BENCH_REAL_ONLY picks one shape by name, RLSTREAM_BENCH_REAL_TORCH=0 leaves
 * out torch (which needs ~30 GB at the full 0.5B depth). Goals: train
 * tokens/s ORT ÷ torch ≥ 1.2, peak RSS ORT ÷ torch ≤ 0.6, 0.5B step RSS ≤ 16 GB.
 */
export const REAL_SHAPES: { name: string; config: ModelConfigInput }[] = [
  {
    name: 'smollm2_135m',
    config: {
      modelType: 'llama',
      hiddenSize: 576,
      intermediateSize: 1536,
      numHiddenLayers: 30,
      numAttentionHeads: 9,
      numKeyValueHeads: 3,
      vocabSize: 49152,
      tieWordEmbeddings: true,
      maxPositionEmbeddings: 2048,
      ropeTheta: 100000,
      rmsNormEps: 1e-5,
      bosTokenId: 1,
      eosTokenId: 2,
      padTokenId: 2,
    },
  },
  {
    name: 'qwen2.5_0.5b',
    config: {
      modelType: 'qwen2',
      hiddenSize: 896,
      intermediateSize: 4864,
      numHiddenLayers: 24,
      numAttentionHeads: 14,
      numKeyValueHeads: 2,
      vocabSize: 151936,
      tieWordEmbeddings: true,
      attentionBias: true,
      maxPositionEmbeddings: 2048,
      ropeTheta: 1000000,
      rmsNormEps: 1e-6,
      bosTokenId: 151643,
      eosTokenId: 151645,
      padTokenId: 151643,
    },
  },
];
const REAL_TRAIN = { B: 2, T: 1024, speedGoal: 1.2, rssGoal: 0.6, rss05bGb: 16 };
/** Sampling at the 135M shape: n = 8 responses of 256 tokens for each of 8 prompts of 256 tokens. */
const REAL_DECODE = { prompts: 8, n: 8, prompt: 256, newTokens: 256, goal: 2 };

async function childDecodeReal(
  nThreads: number,
  warmup: number,
  iters: number,
  decode: 'loop' | 'step' | 'auto' = 'auto',
): Promise<object> {
  const c = realConfig('smollm2_135m');
  const w = initWeights(c, 0);
  const rows = REAL_DECODE.prompts * REAL_DECODE.n;
  const sampler = new Sampler(c, {
    threads: nThreads,
    maxBatchSize: rows,
    maxBatchTokens: rows * (REAL_DECODE.prompt + REAL_DECODE.newTokens),
    decode,
  });
  const rng = Rng.fromSeed('bench:decode_real');
  const prompts = Array.from({ length: REAL_DECODE.prompts }, () =>
    Array.from({ length: REAL_DECODE.prompt }, () => rng.int(c.vocabSize)),
  );
  const reqs = prompts.flatMap((p, i) =>
    Array.from({ length: REAL_DECODE.n }, (_, k) => ({ id: `p${i}-${k}`, prompt: p })),
  );
  const times: number[] = [],
    cpu: number[] = [];
  for (let i = 0; i < warmup + iters; i++) {
    const t0 = performance.now(),
      c0 = process.cpuUsage();
    const gens = await sampler.generate(w, reqs, {
      maxNewTokens: REAL_DECODE.newTokens,
      temperature: 1,
      eosTokenIds: [],
      seed: i,
    });
    if (i >= warmup) {
      times.push(performance.now() - t0);
      cpu.push(cpuMs(c0));
    }
    if (gens.some((g) => g.tokens.length !== REAL_DECODE.newTokens))
      throw new Error('decode bench: a row stopped early');
  }
  await defaultSessionCache.clear(); // flushes an ORT profile (RLSTREAM_ORT_PROFILE)
  const ms = median(times);
  return {
    ms,
    cpu_ms: median(cpu),
    tokens_per_s: (rows * REAL_DECODE.newTokens) / (ms / 1000),
    times_ms: times,
    peak_rss_mb: peakRssMb(),
  };
}

function realConfig(name: string): ModelConfig {
  const r = REAL_SHAPES.find((x) => x.name === name)!;
  const layers = Number(process.env.RLSTREAM_BENCH_REAL_LAYERS);
  return modelConfig({ ...r.config, ...(Number.isInteger(layers) && layers > 0 ? { numHiddenLayers: layers } : {}) });
}

function threads(): number {
  const env = Number(process.env.RLSTREAM_BENCH_THREADS);
  return Number.isInteger(env) && env > 0 ? env : Math.min(8, availableParallelism());
}

function configFor(s: Pick<Shape, 'd' | 'layers' | 'heads' | 'vocab'>): ModelConfig {
  const input: ModelConfigInput = {
    hiddenSize: s.d,
    intermediateSize: 4 * s.d,
    numHiddenLayers: s.layers,
    numAttentionHeads: s.heads,
    numKeyValueHeads: s.heads,
    vocabSize: s.vocab,
    maxPositionEmbeddings: 128,
    bosTokenId: 1,
    eosTokenId: 2,
    padTokenId: 0,
  };
  return modelConfig(input);
}

/** Analytic FLOPs of one training step (forward + backward ≈ 3 × forward). */
export function trainStepFlops(c: ModelConfig, B: number, T: number): number {
  const D = c.hiddenSize,
    F = c.intermediateSize,
    hd = c.headDim;
  const qd = c.numAttentionHeads * hd,
    kvd = c.numKeyValueHeads * hd;
  const perLayer = D * (qd + 2 * kvd) + qd * D + 3 * D * F;
  const matmulParams = c.numHiddenLayers * perLayer + D * c.vocabSize;
  const tokens = B * T;
  const attention = c.numHiddenLayers * 2 * 2 * T * qd; // QKᵀ and PV per token (full T×T, as computed)
  return 3 * tokens * (2 * matmulParams + attention);
}

// ───────────────────────────── child measurements (ORT) ─────────────────────────────

type ChildSpec =
  | { kind: 'train'; shape: Shape; threads: number; warmup: number; iters: number }
  | { kind: 'decode'; shape: Shape; B: number; threads: number; warmup: number; iters: number }
  | { kind: 'gemm'; threads: number }
  | { kind: 'train_real'; name: string; ckpt: boolean; threads: number; warmup: number; iters: number }
  | { kind: 'decode_real'; threads: number; warmup: number; iters: number; decode?: 'loop' | 'step' | 'auto' }
  | {
      kind: 'train_lora';
      lora: boolean;
      ckpt: boolean;
      B: number;
      T: number;
      threads: number;
      warmup: number;
      iters: number;
    }
  | { kind: 'lora_sampling'; threads: number };

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const peakRssMb = () => process.resourceUsage().maxRSS / 1024;
/** CPU ms of the whole process (all ORT threads) since `c0`. */
const cpuMs = (c0: NodeJS.CpuUsage) => {
  const d = process.cpuUsage(c0);
  return (d.user + d.system) / 1000;
};

/** LoRA benchmark adapter: rank 16 on every linear layer (alpha 32). */
const BENCH_LORA = loraConfig({ rank: 16, alpha: 32, targetModules: 'all-linear' });

async function childTrain(
  s: Pick<Shape, 'B' | 'T'> & Partial<Shape>,
  nThreads: number,
  warmup: number,
  iters: number,
  config?: ModelConfig,
  lora = false,
  ckpt = false,
): Promise<object> {
  const c = config ?? configFor(s as Shape);
  const trainer = new Trainer({
    model: c,
    loss: { type: 'policy' },
    threads: nThreads,
    seed: 0,
    optim: { weightDecay: 0.01, maxGradNorm: 1 },
    ...(lora ? { lora: BENCH_LORA } : {}),
    ...(ckpt ? { gradientCheckpointing: true } : {}),
    ...(process.env.RLSTREAM_BENCH_QUERY_BLOCKS
      ? { queryBlocks: Number(process.env.RLSTREAM_BENCH_QUERY_BLOCKS) }
      : {}),
  });
  const rng = Rng.fromSeed('bench:train');
  const n = s.B * s.T;
  const tokens = Int32Array.from({ length: n }, () => rng.int(c.vocabSize));
  const resp = Float32Array.from({ length: n }, (_, i) => (i % s.T > s.T / 4 ? 1 : 0));
  const adv = Float32Array.from({ length: n }, () => rng.next() * 2 - 1);
  const old = Float32Array.from({ length: n }, () => -Math.log(c.vocabSize) + 0.1 * (rng.next() - 0.5));
  const batch: TrainBatch = {
    batchSize: s.B,
    seqLen: s.T,
    tokens,
    responseMask: resp,
    advantages: adv,
    oldLogprobs: old,
  };
  const times: number[] = [],
    cpu: number[] = [];
  for (let i = 0; i < warmup + iters; i++) {
    const t0 = performance.now(),
      c0 = process.cpuUsage();
    await trainer.step(batch, 1e-4);
    if (i >= warmup) {
      times.push(performance.now() - t0);
      cpu.push(cpuMs(c0));
    }
  }
  const params = [...trainer.weightsView().values()].reduce((a, w) => a + w.length, 0);
  const peak = peakRssMb();
  await defaultSessionCache.clear(); // flushes an ORT profile (RLSTREAM_ORT_PROFILE)
  // what a policy version stores (after the peak is taken): the PEFT adapter file, or model.safetensors
  const version_bytes = lora
    ? encodeSafetensors(
        loraSpecs(c, BENCH_LORA).map((p) => [
          PEFT_PREFIX + p.name,
          { shape: p.shape, data: trainer.weightsView().get(p.name)! },
        ]),
        { format: 'pt' },
      ).length
    : encodeSafetensors(
        paramSpecs(c).map((p) => [p.name, { shape: p.shape, data: trainer.weightsView().get(p.name)! }]),
        { format: 'pt' },
      ).length;
  return { ms: median(times), cpu_ms: median(cpu), times_ms: times, peak_rss_mb: peak, params, version_bytes };
}

/**
 * Sampling with LoRA at the 135M shape: merging W + s·B·A once per policy version (ORT, and the JS reference)
 * vs the adapter path's extra time per forward, measured on the eval graph at B64 × T2 (a
 * decode-like step: 64 rows, few tokens) with and without the adapters.
 */
async function childLoraSampling(nThreads: number): Promise<object> {
  const c = realConfig('smollm2_135m');
  const base = initWeights(c, 0);
  const adapter = initLora(c, BENCH_LORA, 1);
  const rng = Rng.fromSeed('bench:lora');
  for (const [k, a] of adapter)
    if (k.endsWith('lora_B.weight')) for (let i = 0; i < a.length; i++) a[i] = 0.01 * (rng.next() - 0.5);
  let t0 = performance.now();
  mergeLora(c, BENCH_LORA, base, adapter);
  const merge_js_ms = performance.now() - t0;
  await mergeLoraOnnx(c, BENCH_LORA, base, adapter, { session: { threads: nThreads } }); // session build
  t0 = performance.now();
  await mergeLoraOnnx(c, BENCH_LORA, base, adapter, { session: { threads: nThreads } });
  const merge_ms = performance.now() - t0;
  const B = 64,
    T = 2,
    n = B * T;
  const batch: TrainBatch = {
    batchSize: B,
    seqLen: T,
    tokens: Int32Array.from({ length: n }, () => rng.int(c.vocabSize)),
    responseMask: new Float32Array(n).fill(1),
    advantages: new Float32Array(n),
    oldLogprobs: new Float32Array(n).fill(-10),
  };
  const time = async (tr: Trainer, adapters: boolean): Promise<number> => {
    const ts: number[] = [];
    for (let i = 0; i < 7; i++) {
      const a = performance.now();
      await tr.evaluate(batch, { adapters });
      if (i >= 2) ts.push(performance.now() - a);
    }
    return median(ts);
  };
  const tr = new Trainer({
    model: c,
    loss: { type: 'policy' },
    threads: nThreads,
    weights: base,
    lora: BENCH_LORA,
    adapter,
  });
  const adapter_ms = await time(tr, true),
    base_ms = await time(tr, false);
  return { merge_ms, merge_js_ms, adapter_forward_ms: adapter_ms, base_forward_ms: base_ms, peak_rss_mb: peakRssMb() };
}

/** LoRA rank 16 all-linear vs full fine-tuning at the 135M shape, same batch; then the sampling trade-off. */
export async function loraRows(rows: Row[], nThreads: number): Promise<void> {
  const B = Number(process.env.RLSTREAM_BENCH_LORA_B) || 2,
    T = Number(process.env.RLSTREAM_BENCH_LORA_T) || 1024;
  const iters = Number(process.env.RLSTREAM_BENCH_LORA_ITERS) || 2;
  const c = realConfig('smollm2_135m');
  const tag = `smollm2_135m${c.numHiddenLayers !== 30 ? `_l${c.numHiddenLayers}` : ''}_b${B}_t${T}_r16_all`;
  // with gradient checkpointing first (its rows carry _ckpt / ckpt_), then without; only the run
  // without it goes on to the version bytes and the sampling trade-off
  const modes = ckptModes();
  let plain: { full: Record<string, number>; lora: Record<string, number> } | null = null;
  for (const ckpt of [true, false].filter((m) => modes.includes(m))) {
    const full = await runChild({ kind: 'train_lora', lora: false, ckpt, B, T, threads: nThreads, warmup: 1, iters });
    const lora = await runChild({ kind: 'train_lora', lora: true, ckpt, B, T, threads: nThreads, warmup: 1, iters });
    const sfx = ckpt ? '_ckpt' : '',
      pre = ckpt ? 'ckpt_' : '';
    rows.push({ name: `model/lora/${tag}/full${sfx}_ms`, value: round(full.ms), unit: 'ms' });
    rows.push({ name: `model/lora/${tag}/lora${sfx}_ms`, value: round(lora.ms), unit: 'ms' });
    rows.push({ name: `model/lora/${tag}/full${sfx}_peak_rss`, value: Math.round(full.peak_rss_mb), unit: 'MB' });
    rows.push({ name: `model/lora/${tag}/lora${sfx}_peak_rss`, value: Math.round(lora.peak_rss_mb), unit: 'MB' });
    if (!ckpt) rows.push({ name: `model/lora/${tag}/trained_params`, value: lora.params, unit: 'params' });
    rows.push({
      name: `model/lora/${tag}/${pre}rss_ratio`,
      value: round(lora.peak_rss_mb / full.peak_rss_mb),
      unit: 'ratio',
      goal: 0.5,
      better: 'lower',
    });
    rows.push({
      name: `model/lora/${tag}/${pre}step_time_ratio`,
      value: round(lora.ms / full.ms),
      unit: 'ratio',
      goal: 0.8,
      better: 'lower',
    });
    if (!ckpt) plain = { full, lora };
  }
  if (!plain) return;
  const { full, lora } = plain;
  rows.push({
    name: `model/lora/${tag}/version_bytes_ratio`,
    value: round(lora.version_bytes / full.version_bytes),
    unit: 'ratio',
    goal: 0.05,
    better: 'lower',
  });
  const s = await runChild({ kind: 'lora_sampling', threads: nThreads });
  rows.push({ name: 'model/lora/smollm2_135m_r16_all/merge_ms', value: round(s.merge_ms), unit: 'ms' });
  rows.push({ name: 'model/lora/smollm2_135m_r16_all/merge_js_ms', value: round(s.merge_js_ms), unit: 'ms' });
  rows.push({
    name: 'model/lora/smollm2_135m_r16_all/b64_t2_forward_adapter_ms',
    value: round(s.adapter_forward_ms),
    unit: 'ms',
  });
  rows.push({
    name: 'model/lora/smollm2_135m_r16_all/b64_t2_forward_base_ms',
    value: round(s.base_forward_ms),
    unit: 'ms',
  });
}

async function childDecode(s: Shape, B: number, nThreads: number, warmup: number, iters: number): Promise<object> {
  const c = configFor(s);
  const w = initWeights(c, 0);
  const sampler = new Sampler(c, { threads: nThreads, maxBatchSize: B });
  const rng = Rng.fromSeed('bench:decode');
  const reqs = Array.from({ length: B }, (_, i) => ({
    id: `r${i}`,
    prompt: Array.from({ length: DECODE.prompt }, () => rng.int(c.vocabSize)),
  }));
  const times: number[] = [],
    cpu: number[] = [];
  for (let i = 0; i < warmup + iters; i++) {
    const t0 = performance.now(),
      c0 = process.cpuUsage();
    const gens = await sampler.generate(w, reqs, {
      maxNewTokens: DECODE.newTokens,
      temperature: 1,
      eosTokenIds: [],
      seed: i,
    });
    if (i >= warmup) {
      times.push(performance.now() - t0);
      cpu.push(cpuMs(c0));
    }
    if (gens.some((g) => g.tokens.length !== DECODE.newTokens)) throw new Error('decode bench: a row stopped early');
  }
  const ms = median(times);
  return {
    ms,
    cpu_ms: median(cpu),
    tokens_per_s: (B * DECODE.newTokens) / (ms / 1000),
    times_ms: times,
    peak_rss_mb: peakRssMb(),
  };
}

/** Best FLOP/s of one MatMul (weight as initializer, like a model) over a few sizes. */
async function childGemm(nThreads: number): Promise<object> {
  const sizes: [number, number, number][] = [
    [3072, 128, 512],
    [3072, 512, 128],
    [6144, 256, 1024],
    [1024, 1024, 1024],
    [2048, 2048, 2048],
  ];
  let best = 0;
  const all: Record<string, number> = {};
  for (const [M, K, N] of sizes) {
    const b = new GraphBuilder({ name: 'gemm' });
    const x = b.input('x', 'float32', [M, K]);
    const rng = Rng.fromSeed(`gemm:${M}:${K}:${N}`);
    const w = b.initializer(
      'w',
      Float32Array.from({ length: K * N }, () => rng.next() - 0.5),
      [K, N],
    );
    b.output(b.matmul(x, w), 'y');
    const sess = await createSession(b.toBytes(), { threads: nThreads });
    const feeds = {
      x: tensor(
        'float32',
        Float32Array.from({ length: M * K }, () => rng.next() - 0.5),
        [M, K],
      ),
    };
    const flops = 2 * M * K * N;
    const reps = Math.max(3, Math.min(50, Math.round(2e10 / flops)));
    for (let i = 0; i < 2; i++) await sess.run(feeds);
    const times: number[] = [];
    for (let i = 0; i < reps; i++) {
      const t0 = performance.now();
      await sess.run(feeds);
      times.push(performance.now() - t0);
    }
    const rate = flops / (Math.min(...times) / 1000);
    all[`${M}x${K}x${N}`] = rate;
    best = Math.max(best, rate);
    await sess.release();
  }
  return { best_flops: best, by_size: all, peak_rss_mb: peakRssMb() };
}

async function child(spec: ChildSpec): Promise<object> {
  switch (spec.kind) {
    case 'train':
      return childTrain(spec.shape, spec.threads, spec.warmup, spec.iters);
    case 'decode':
      return childDecode(spec.shape, spec.B, spec.threads, spec.warmup, spec.iters);
    case 'gemm':
      return childGemm(spec.threads);
    case 'decode_real':
      return childDecodeReal(spec.threads, spec.warmup, spec.iters, spec.decode);
    case 'train_real':
      return childTrain(
        { B: REAL_TRAIN.B, T: REAL_TRAIN.T },
        spec.threads,
        spec.warmup,
        spec.iters,
        realConfig(spec.name),
        false,
        spec.ckpt,
      );
    case 'train_lora':
      return childTrain(
        { B: spec.B, T: spec.T },
        spec.threads,
        spec.warmup,
        spec.iters,
        realConfig('smollm2_135m'),
        spec.lora,
        spec.ckpt,
      );
    case 'lora_sampling':
      return childLoraSampling(spec.threads);
  }
}

function runChild(spec: ChildSpec): Promise<any> {
  const self = fileURLToPath(import.meta.url);
  return new Promise((res, rej) => {
    execFile(
      process.execPath,
      ['--import', 'tsx', self, '--child', JSON.stringify(spec)],
      { encoding: 'utf8', timeout: 1_800_000, maxBuffer: 16 << 20 },
      (err, stdout, stderr) => {
        if (err) {
          rej(new Error(`bench child ${spec.kind} failed: ${err.message}\n${stderr}`));
          return;
        }
        const lines = stdout.trim().split('\n');
        res(JSON.parse(lines[lines.length - 1]));
      },
    );
  });
}

/** GRPO update step at the real shapes: ORT then torch (never both at once), tokens/s and peak RSS; then sampling at 135M. */
export async function realRows(rows: Row[], nThreads: number, withTorch: boolean, dir: string): Promise<void> {
  const only = process.env.RLSTREAM_BENCH_REAL_ONLY;
  const iters = Number(process.env.RLSTREAM_BENCH_REAL_ITERS) || 2;
  const { B, T } = REAL_TRAIN;
  if (!only || only === 'decode') {
    const c = realConfig('smollm2_135m');
    const cfgPath = join(dir, 'smollm2_135m-decode.json');
    writeJson(cfgPath, toHfConfig(c));
    const tag = `smollm2_135m${c.numHiddenLayers !== 30 ? `_l${c.numHiddenLayers}` : ''}_${REAL_DECODE.prompts}x${REAL_DECODE.n}_p${REAL_DECODE.prompt}_n${REAL_DECODE.newTokens}`;
    const ort = await runChild({ kind: 'decode_real', threads: nThreads, warmup: 0, iters: 1 });
    rows.push({ name: `model/decode_real/${tag}/ort_tok_s`, value: round(ort.tokens_per_s), unit: 'tok/s' });
    rows.push({ name: `model/decode_real/${tag}/ort_peak_rss`, value: Math.round(ort.peak_rss_mb), unit: 'MB' });
    if (withTorch) {
      // transformers' generate(num_return_sequences = n) expands the prompts before the prefill: B = prompts × n rows
      // both anchors: the same prompts, lengths and threads, one timed generate call
      const common = [
        ...['--config', cfgPath, '--prompt-len', String(REAL_DECODE.prompt), '--new', String(REAL_DECODE.newTokens)],
        ...['--threads', String(nThreads), '--warmup', '0', '--iters', '1'],
      ];
      const t = await runTorch('bench_decode.py', ['--batch', String(REAL_DECODE.prompts * REAL_DECODE.n), ...common], {
        timeoutMs: 3_600_000,
      });
      rows.push({ name: `model/decode_real/${tag}/torch_tok_s`, value: round(t.tokens_per_s), unit: 'tok/s' });
      rows.push({ name: `model/decode_real/${tag}/torch_peak_rss`, value: Math.round(t.peak_rss_mb), unit: 'MB' });
      rows.push({
        name: `model/decode_real/${tag}/ort_over_torch`,
        value: round(ort.tokens_per_s / t.tokens_per_s),
        unit: 'ratio',
      });
      // the fair anchor: each prompt prefilled once and its cache expanded to n rows, cache
      // preallocated and written in place, GQA by reshape (what the Sampler does)
      const f = await runTorch(
        'bench_decode_fair.py',
        ['--prompts', String(REAL_DECODE.prompts), '--n', String(REAL_DECODE.n), ...common],
        { timeoutMs: 3_600_000 },
      );
      rows.push({ name: `model/decode_real/${tag}/torch_fair_tok_s`, value: round(f.tokens_per_s), unit: 'tok/s' });
      rows.push({
        name: `model/decode_real/${tag}/torch_fair_peak_rss`,
        value: Math.round(f.peak_rss_mb),
        unit: 'MB',
      });
      rows.push({
        name: `model/decode_real/${tag}/ort_over_torch_fair`,
        value: round(ort.tokens_per_s / f.tokens_per_s),
        unit: 'ratio',
        goal: REAL_DECODE.goal,
        better: 'higher',
      });
      rows.push({
        name: `model/decode_real/${tag}/ort_over_torch_fair_peak_rss`,
        value: round(ort.peak_rss_mb / f.peak_rss_mb),
        unit: 'ratio',
        goal: 1,
        better: 'lower',
      });
    }
  }
  for (const r of REAL_SHAPES) {
    if (only && r.name !== only) continue;
    const c = realConfig(r.name);
    const tag = `${r.name}${c.numHiddenLayers !== r.config.numHiddenLayers ? `_l${c.numHiddenLayers}` : ''}_b${B}_t${T}`;
    const cfgPath = join(dir, `${r.name}.json`);
    writeJson(cfgPath, toHfConfig(c));
    const tokS = (ms: number) => (B * T) / (ms / 1000);
    // without and with gradient checkpointing (`ort_…` and `ort_ckpt_…` rows), each in its own process
    const orts: { ck: string; ms: number; peak_rss_mb: number }[] = [];
    for (const ckpt of ckptModes()) {
      const ort = await runChild({ kind: 'train_real', name: r.name, ckpt, threads: nThreads, warmup: 1, iters });
      const ck = ckpt ? '_ckpt' : '';
      orts.push({ ck, ms: ort.ms, peak_rss_mb: ort.peak_rss_mb });
      rows.push({ name: `model/train_real/${tag}/ort${ck}_tok_s`, value: round(tokS(ort.ms)), unit: 'tok/s' });
      rows.push({
        name: `model/train_real/${tag}/ort${ck}_peak_rss`,
        value: Math.round(ort.peak_rss_mb),
        unit: 'MB',
        ...(r.name.startsWith('qwen') ? { goal: REAL_TRAIN.rss05bGb * 1024, better: 'lower' as const } : {}),
      });
      rows.push({
        name: `model/train_real/${tag}/ort${ck}_bytes_per_param`,
        value: round((ort.peak_rss_mb * 2 ** 20) / ort.params),
        unit: 'B',
      });
    }
    if (!withTorch || process.env.RLSTREAM_BENCH_REAL_TORCH === '0') continue;
    const t = await runTorch(
      'bench_train.py',
      [
        '--config',
        cfgPath,
        '--batch',
        String(B),
        '--seq',
        String(T),
        '--threads',
        String(nThreads),
        '--warmup',
        '1',
        '--iters',
        String(iters),
      ],
      { timeoutMs: 3_600_000 },
    );
    rows.push({ name: `model/train_real/${tag}/torch_tok_s`, value: round(tokS(t.ms)), unit: 'tok/s' });
    rows.push({ name: `model/train_real/${tag}/torch_peak_rss`, value: Math.round(t.peak_rss_mb), unit: 'MB' });
    for (const o of orts) {
      rows.push({
        name: `model/train_real/${tag}/ort${o.ck}_over_torch_tok_s`,
        value: round(t.ms / o.ms),
        unit: 'ratio',
        goal: REAL_TRAIN.speedGoal,
        better: 'higher',
      });
      rows.push({
        name: `model/train_real/${tag}/ort${o.ck}_over_torch_rss`,
        value: round(o.peak_rss_mb / t.peak_rss_mb),
        unit: 'ratio',
        goal: REAL_TRAIN.rssGoal,
        better: 'lower',
      });
    }
  }
}

// ───────────────────────────── the benchmark ─────────────────────────────

const round = (v: number, digits = 3) => Number(v.toPrecision(digits));

/** Which train configurations the real-shape and LoRA rows run: RLSTREAM_BENCH_CKPT = both (default), off or only. */
function ckptModes(): boolean[] {
  const v = process.env.RLSTREAM_BENCH_CKPT ?? 'both';
  if (v === 'both') return [false, true];
  if (v === 'off') return [false];
  if (v === 'only') return [true];
  throw new Error(`RLSTREAM_BENCH_CKPT must be both, off or only, got "${v}"`);
}

export async function run(): Promise<Row[]> {
  const nThreads = threads();
  const torch = torchPython();
  if (!torch.python) console.error(`bench/model: torch rows skipped: ${torch.reason}`);
  const tmp = tempDir('rlstream-bench-model-');
  const rows: Row[] = [];
  try {
    const gemm = await runChild({ kind: 'gemm', threads: nThreads });
    rows.push({ name: 'model/gemm/best_gflops', value: round(gemm.best_flops / 1e9), unit: 'GFLOP/s' });

    for (const s of SHAPES) {
      const c = configFor(s);
      const cfgPath = join(tmp.dir, `${s.name}.json`);
      writeJson(cfgPath, toHfConfig(c));
      const ort = await runChild({ kind: 'train', shape: s, threads: nThreads, warmup: 2, iters: 5 });
      rows.push({ name: `model/train/${s.name}/ort_ms`, value: round(ort.ms), unit: 'ms' });
      rows.push({ name: `model/train/${s.name}/ort_cpu_ms`, value: round(ort.cpu_ms), unit: 'ms' });
      rows.push({ name: `model/train/${s.name}/ort_peak_rss`, value: Math.round(ort.peak_rss_mb), unit: 'MB' });
      const flops = trainStepFlops(c, s.B, s.T);
      rows.push({
        name: `model/train/${s.name}/flops_vs_best_gemm`,
        value: round(flops / (ort.ms / 1000) / gemm.best_flops),
        unit: 'ratio',
        goal: 0.6,
        better: 'higher',
      });
      if (torch.python) {
        const t = await runTorch(
          'bench_train.py',
          [
            '--config',
            cfgPath,
            '--batch',
            String(s.B),
            '--seq',
            String(s.T),
            '--threads',
            String(nThreads),
            '--warmup',
            '2',
            '--iters',
            '5',
          ],
          { timeoutMs: 1_800_000 },
        );
        rows.push({ name: `model/train/${s.name}/torch_ms`, value: round(t.ms), unit: 'ms' });
        rows.push({ name: `model/train/${s.name}/torch_cpu_ms`, value: round(t.cpu_ms), unit: 'ms' });
        rows.push({ name: `model/train/${s.name}/torch_peak_rss`, value: Math.round(t.peak_rss_mb), unit: 'MB' });
        rows.push({
          name: `model/train/${s.name}/ort_over_torch`,
          value: round(ort.ms / t.ms),
          unit: 'ratio',
          goal: s.trainGoal,
          better: 'lower',
        });
      }
    }

    if (process.env.RLSTREAM_BENCH_REAL === '1') await realRows(rows, nThreads, torch.python !== null, tmp.dir);
    else console.error('bench/model: real-shape rows (135M / 0.5B train step) skipped: set RLSTREAM_BENCH_REAL=1');
    if (process.env.RLSTREAM_BENCH_LORA === '1') await loraRows(rows, nThreads);
    else console.error('bench/model: LoRA rows (135M, rank 16 vs full fine-tuning) skipped: set RLSTREAM_BENCH_LORA=1');

    const ds = SHAPES[0];
    const dcfg = join(tmp.dir, `${ds.name}.json`);
    for (const B of DECODE.batches) {
      const tag = `d${ds.d}_l${ds.layers}_b${B}_p${DECODE.prompt}_n${DECODE.newTokens}`;
      const ort = await runChild({ kind: 'decode', shape: ds, B, threads: nThreads, warmup: 1, iters: 3 });
      rows.push({ name: `model/decode/${tag}/ort_tok_s`, value: Math.round(ort.tokens_per_s), unit: 'tok/s' });
      rows.push({ name: `model/decode/${tag}/ort_cpu_ms`, value: round(ort.cpu_ms), unit: 'ms' });
      rows.push({ name: `model/decode/${tag}/ort_peak_rss`, value: Math.round(ort.peak_rss_mb), unit: 'MB' });
      if (torch.python) {
        const t = await runTorch(
          'bench_decode.py',
          [
            '--config',
            dcfg,
            '--batch',
            String(B),
            '--prompt-len',
            String(DECODE.prompt),
            '--new',
            String(DECODE.newTokens),
            '--threads',
            String(nThreads),
            '--warmup',
            '1',
            '--iters',
            '3',
          ],
          { timeoutMs: 1_800_000 },
        );
        rows.push({ name: `model/decode/${tag}/torch_tok_s`, value: Math.round(t.tokens_per_s), unit: 'tok/s' });
        rows.push({ name: `model/decode/${tag}/torch_cpu_ms`, value: round(t.cpu_ms), unit: 'ms' });
        rows.push({ name: `model/decode/${tag}/torch_peak_rss`, value: Math.round(t.peak_rss_mb), unit: 'MB' });
        rows.push({
          name: `model/decode/${tag}/ort_over_torch`,
          value: round(ort.tokens_per_s / t.tokens_per_s),
          unit: 'ratio',
          goal: DECODE.goal,
          better: 'higher',
        });
      }
    }
    rows.push({ name: 'model/threads', value: nThreads, unit: 'threads' });
  } finally {
    tmp.cleanup();
  }
  return rows;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const i = process.argv.indexOf('--child');
  if (i >= 0) {
    process.stdout.write(JSON.stringify(await child(JSON.parse(process.argv[i + 1]) as ChildSpec)) + '\n');
  } else {
    const rows = await run();
    const w = Math.max(...rows.map((r) => r.name.length));
    console.log(`${'benchmark'.padEnd(w)}  ${'value'.padStart(9)}  ${'unit'.padEnd(7)}  goal`);
    for (const r of rows) {
      let goal = '';
      if (r.goal !== undefined) {
        const lower = r.better === 'lower';
        const met = lower ? r.value <= r.goal : r.value >= r.goal;
        goal = `${lower ? '≤' : '≥'} ${r.goal} ${met ? '(met)' : '(NOT met)'}`;
      }
      console.log(`${r.name.padEnd(w)}  ${String(r.value).padStart(9)}  ${r.unit.padEnd(7)}  ${goal}`);
    }
  }
}
