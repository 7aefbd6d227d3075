/**
 * The glyphs example end to end: render glyphs, train the recogniser (the reward model) and a
 * judge recogniser on the held-out faces (evaluation only), learn a DiT by flow matching on
 * renders (SFT), then RL with DiffusionNFT or Flow-GRPO on the recogniser's reward. Writes to
 * --out: recogniser.onnx, curve.jsonl (one line per evaluation: phase, step, accuracy of
 * generated glyphs, mean ocr_confidence, the judge's accuracy, CPU minutes, wall minutes, load),
 * a PNG grid of samples per evaluation, sft.safetensors and the final policy as a model
 * directory (model/). RL stops at --rl-iters or when the whole run has used --cpu-minutes of CPU
 * (user + sys of this process) or --minutes of wall time.
 *
 *   node --import tsx examples/glyphs/run.ts --out /tmp/glyphs --algo diffusion_nft \
 *     [--sft-steps N] [--rl-iters N] [--chars 36] [--size 32] [--cpu-minutes 30] [--minutes 60]
 *
 * Defaults (GLYPH_DEFAULTS, RL_LR): SFT 6000 steps with class dropout 0.1, evaluation and RL
 * guided with w = 4, RL for 80 iterations, DiffusionNFT with its paper's optimality r and adaptive
 * weighting (both algorithms reach 0.95–0.97 so; docs/image-generation.md). --rl-cfg 1 --eval-cfg 1
 * trains and evaluates CFG-free.
 * --from-sft DIR/sft.safetensors starts RL from an earlier run's SFT weights.
 */
import { mkdirSync, writeFileSync, appendFileSync, readFileSync } from 'node:fs';
import { decodeSafetensors, encodeSafetensors, toFloat32 } from '../../lib/model/safetensors.ts';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import os from 'node:os';
import { ditConfig, initDitWeights, type DitWeights } from '../../lib/image/dit.ts';
import { gridPng } from '../../lib/image/png.ts';
import { saveDit } from '../../lib/image/checkpoint.ts';
import { nftOldDecay, rlIteration, softUpdate } from '../../lib/image/rl.ts';
import { gaussian, sampleImages } from '../../lib/image/sde.ts';
import { ImageTrainer } from '../../lib/image/trainer.ts';
import type { ImageLossConfig } from '../../lib/image/flow-graph.ts';
import { Rng } from '../../lib/util/rng.ts';
import { CHARS, HELDOUT_FONTS, TRAIN_FONTS, asSaved, renderSet } from './glyphs.ts';
import { trainRecogniser, type Recogniser } from './recogniser.ts';

/** The DiT's shape (lib/image/dit.ts). */
export interface GlyphModel {
  hidden: number;
  depth: number;
  heads: number;
  patch: number;
}

export interface GlyphRunOptions {
  out: string;
  algo: 'diffusion_nft' | 'flow_grpo';
  chars: number;
  size: number;
  sftSteps: number;
  rlIters: number;
  recogniserSteps: number;
  perChar: number;
  /** SFT steps between evaluations (RL evaluates every evalEvery/10 iterations). */
  evalEvery: number;
  /** Wall-minute cap of the whole run. */
  minutes: number;
  /** CPU-minute cap of the whole run (user + sys of this process). */
  cpuMinutes?: number;
  model?: Partial<GlyphModel>;
  /** SFT: batch, learning rate, its schedule (constant, or cosine: linear warm-up over the first 5 %, cosine to 10 % at the end), EMA decay of the weights evaluated and handed to RL (0: none). */
  sftBatch?: number;
  sftLr?: number;
  sftSchedule?: 'constant' | 'cosine';
  emaDecay?: number;
  /** RL: learning rate (fresh AdamW; default by algorithm, RL_LR), prompts per iteration, images per prompt, denoising steps while training. */
  rlLr?: number;
  rlPrompts?: number;
  groupSize?: number;
  rlSteps?: number;
  nftBeta?: number;
  nftUpdates?: number;
  /** DiffusionNFT: r = ½ + ½·clip(A/c, −1, 1) with c = nftAdvClip and Z of A = nftStd (lib/image/rl.ts nftOptimality). */
  nftAdvClip?: number;
  nftStd?: 'centred' | 'global';
  /** DiffusionNFT: the paper's adaptive loss weighting (flow-graph.ts nftAdaptiveWeight; --nft-adaptive 0 turns it off). */
  nftAdaptive?: boolean;
  noiseLevel?: number;
  /** RL: classifier-free guidance of the rollouts and of the velocity the loss trains (lib/image/rl.ts; 1: unguided). */
  rlCfg?: number;
  /** DiffusionNFT: soft update of the sampling policy, η_i = min(rate·i, max) (0, 0: on-policy). */
  nftEtaRate?: number;
  nftEtaMax?: number;
  /** Flow-GRPO: ratio clip range ε (1 ± ε) and KL coefficient to the SFT weights. */
  clip?: number;
  klCoef?: number;
  /** SFT: probability that an image's class is replaced by the null class K (classifier-free guidance training; 0: never, no draw). */
  cfgDropout?: number;
  /** Evaluation: classifier-free guidance scale w, v = v_null + w·(v_c − v_null) (1: unguided). */
  evalCfg?: number;
  /** Evaluation: samples per character (10-step ODE from a noise stream no training step draws from). */
  evalPerChar?: number;
  /** Recogniser (and judge) hidden size. */
  recogniserHidden?: number;
  /** RL's random stream (prompts, rollout noise, DiffusionNFT's (t, ε)): glyphs-<algo>, or glyphs-<algo>-<rlSeed>. */
  rlSeed?: string;
  /** Start RL from these SFT weights (a previous run's sft.safetensors) instead of running SFT. */
  fromSft?: string;
  threads?: number;
  log?: (line: Record<string, unknown>) => void;
}

/** The example's defaults (36 characters at 32×32). */
export const GLYPH_DEFAULTS = {
  model: { hidden: 64, depth: 2, heads: 4, patch: 4 } as GlyphModel,
  sftBatch: 64,
  sftLr: 2e-3,
  sftSchedule: 'constant' as 'constant' | 'cosine',
  emaDecay: 0,
  rlPrompts: 8,
  groupSize: 8,
  rlSteps: 10,
  nftBeta: 1,
  nftUpdates: 2,
  nftAdvClip: 5,
  nftStd: 'global' as 'centred' | 'global',
  nftAdaptive: true,
  noiseLevel: 0.7,
  rlCfg: 4,
  nftEtaRate: 0.001,
  nftEtaMax: 0.5,
  clip: 1e-3,
  klCoef: 0,
  evalPerChar: 4,
  cfgDropout: 0.1,
  evalCfg: 4,
  recogniserHidden: 256,
};

/** RL learning rate of each algorithm (docs/image-generation.md "Results"). */
export const RL_LR = { diffusion_nft: 5e-5, flow_grpo: 2e-4 };

const EVAL_SEED = 'glyphs-eval';

/** Accuracy, mean ocr_confidence and the judge's accuracy of `perClass` ODE samples (10 steps) of every class with weights `w`. */
async function evaluate(
  tr: ImageTrainer,
  w: DitWeights,
  rec: Recogniser,
  judge: Recogniser,
  K: number,
  perClass: number,
  cfg: number,
) {
  const cls = Array.from({ length: K * perClass }, (_, i) => i % K);
  const guided = async (x: Float32Array, t: number[], c: number[]) => {
    const vc = await tr.velocity(x, t, c, w);
    if (cfg === 1) return vc;
    const vu = await tr.velocity(
      x,
      t,
      c.map(() => K),
      w,
    );
    return Float32Array.from(vc, (v, i) => vu[i] + cfg * (v - vu[i]));
  };
  const s = await sampleImages(guided, {
    cls,
    pixels: tr.config.imageSize ** 2,
    steps: 10,
    rng: Rng.fromSeed(EVAL_SEED),
  });
  const img = asSaved(s.x0);
  const sc = await rec.score(img, cls);
  return {
    accuracy: sc.filter((r) => r.correct).length / sc.length,
    ocr_confidence: sc.reduce((a, r) => a + r.ocr_confidence, 0) / sc.length,
    judge_accuracy: await judge.accuracy(img, cls),
    images: s.x0,
  };
}

const round = (x: number, d = 4) => Math.round(x * 10 ** d) / 10 ** d;

export async function runGlyphs(
  o: GlyphRunOptions,
): Promise<{ sftAccuracy: number; finalAccuracy: number; recogniserHeldout: number }> {
  const defined = <T extends object>(x: T | undefined) =>
    Object.fromEntries(Object.entries(x ?? {}).filter(([, v]) => v !== undefined)) as Partial<T>;
  const d = { ...GLYPH_DEFAULTS, ...defined(o) };
  const m: GlyphModel = { ...GLYPH_DEFAULTS.model, ...defined(o.model) };
  mkdirSync(o.out, { recursive: true });
  const t0 = Date.now();
  const cpu0 = process.cpuUsage();
  const minutes = () => (Date.now() - t0) / 60000;
  const cpuMinutes = () => {
    const c = process.cpuUsage(cpu0);
    return (c.user + c.system) / 6e7;
  };
  const curve = join(o.out, 'curve.jsonl');
  writeFileSync(curve, '');
  const log = (line: Record<string, unknown>) => {
    const full = { ...line, cpu_min: round(cpuMinutes(), 2), wall_min: round(minutes(), 2), load1: os.loadavg()[0] };
    appendFileSync(curve, JSON.stringify(full) + '\n');
    o.log?.(full);
  };
  const K = o.chars,
    S = o.size;
  const train = await renderSet({ faces: TRAIN_FONTS, perChar: o.perChar, size: S, seed: 'glyphs-train', chars: K });
  const held = await renderSet({ faces: HELDOUT_FONTS, perChar: 6, size: S, seed: 'glyphs-heldout', chars: K });
  const recShape = { size: S, hidden: d.recogniserHidden, classes: K };
  const rec = await trainRecogniser(train, recShape, {
    steps: o.recogniserSteps,
    batch: 64,
    lr: 2e-3,
    seed: 'glyphs-rec',
  });
  writeFileSync(join(o.out, 'recogniser.onnx'), rec.toOnnx());
  // the judge reads only the held-out faces: generated glyphs that fool the recogniser without
  // looking like the character lose the judge's agreement
  const judgeSet = await renderSet({
    faces: HELDOUT_FONTS,
    perChar: o.perChar,
    size: S,
    seed: 'glyphs-judge',
    chars: K,
  });
  const judge = await trainRecogniser(judgeSet, recShape, {
    steps: o.recogniserSteps,
    batch: 64,
    lr: 2e-3,
    seed: 'glyphs-judge',
  });
  const recogniserHeldout = await rec.accuracy(held.images, held.labels);
  log({
    phase: 'recogniser',
    train_accuracy: await rec.accuracy(train.images, train.labels),
    heldout_accuracy: recogniserHeldout,
    judge_on_train_faces: await judge.accuracy(train.images, train.labels),
  });

  const cfg = ditConfig({
    numClasses: K,
    imageSize: S,
    patchSize: m.patch,
    hidden: m.hidden,
    depth: m.depth,
    heads: m.heads,
    timeFreqs: 32,
  });
  const adam = { betas: [0.9, 0.999] as [number, number], eps: 1e-8, weightDecay: 0, maxGradNorm: 1 };
  const tr = new ImageTrainer(
    cfg,
    initDitWeights(cfg, 'glyphs-dit'),
    { ...adam, lr: d.sftLr },
    { threads: o.threads, ...(d.emaDecay > 0 ? { emaDecay: d.emaDecay } : {}) },
  );
  const rng = Rng.fromSeed('glyphs-sft');
  const px = S * S,
    n = train.labels.length,
    B = d.sftBatch;
  const evalAndLog = async (
    phase: string,
    step: number,
    t: ImageTrainer,
    w: DitWeights,
    extra: Record<string, number> = {},
  ) => {
    const e = await evaluate(t, w, rec, judge, K, d.evalPerChar, d.evalCfg);
    writeFileSync(
      join(o.out, `${phase}-${String(step).padStart(5, '0')}.png`),
      await gridPng(e.images.subarray(0, K * px), 1, S, Math.min(K, 12)),
    );
    log({
      phase,
      step,
      accuracy: round(e.accuracy),
      ocr_confidence: round(e.ocr_confidence),
      judge_accuracy: round(e.judge_accuracy),
      ...extra,
    });
    return e.accuracy;
  };
  let sftAccuracy = 0;
  if (o.fromSft) {
    const st = decodeSafetensors(readFileSync(o.fromSft), o.fromSft).tensors;
    for (const k of tr.weights.keys()) tr.weights.set(k, toFloat32(st.get(k)!, k, o.fromSft));
    o.sftSteps = 0;
  }
  const warm = Math.max(1, Math.round(o.sftSteps * 0.05));
  const sftLr = (step: number) =>
    d.sftSchedule === 'constant'
      ? d.sftLr
      : step <= warm
        ? (d.sftLr * step) / warm
        : d.sftLr * (0.1 + 0.45 * (1 + Math.cos((Math.PI * (step - warm)) / Math.max(1, o.sftSteps - warm))));
  const sftWeights = () => tr.ema ?? tr.weights;
  for (let step = 1; step <= o.sftSteps; step++) {
    const idx = Array.from({ length: B }, () => rng.int(n));
    const x0 = new Float32Array(B * px);
    idx.forEach((k, i) => x0.set(train.images.subarray(k * px, (k + 1) * px), i * px));
    const r = await tr.step(
      { name: 'flow_matching' },
      {
        floats: { x0, noise: gaussian(rng, B * px), t: Array.from({ length: B }, () => rng.next()) },
        cls: idx.map((k) => (d.cfgDropout > 0 && rng.next() < d.cfgDropout ? K : train.labels[k])),
      },
      sftLr(step),
    );
    if (step % o.evalEvery === 0 || step === o.sftSteps)
      sftAccuracy = await evalAndLog('sft', step, tr, sftWeights(), { loss: round(r.loss) });
  }
  if (o.sftSteps === 0) sftAccuracy = await evalAndLog('sft', 0, tr, tr.weights);
  else
    writeFileSync(
      join(o.out, 'sft.safetensors'),
      encodeSafetensors(
        [...sftWeights()].map(([k, w]) => [
          k,
          { dtype: 'F32' as const, shape: tr.specs.find((s) => s.name === k)!.shape, data: w },
        ]),
      ),
    );
  // RL starts from the SFT weights (their EMA when kept) with fresh AdamW moments
  const rl = new ImageTrainer(cfg, sftWeights(), { ...adam, lr: o.rlLr ?? RL_LR[o.algo] }, { threads: o.threads });
  const loss: ImageLossConfig =
    o.algo === 'flow_grpo'
      ? { name: 'flow_grpo', clipLow: d.clip, clipHigh: d.clip, klCoef: d.klCoef, cfgScale: d.rlCfg }
      : {
          name: 'diffusion_nft',
          nftBeta: d.nftBeta,
          cfgScale: d.rlCfg,
          ...(d.nftAdaptive ? { nftAdaptiveWeight: true } : {}),
        };
  const reference = d.klCoef > 0 ? new Map([...rl.weights].map(([k, w]) => [k, Float32Array.from(w)])) : undefined;
  // DiffusionNFT's sampling policy θ_old, soft-updated towards the trained weights after each iteration
  const old =
    o.algo === 'diffusion_nft' ? new Map([...rl.weights].map(([k, w]) => [k, Float32Array.from(w)])) : undefined;
  const rlRng = Rng.fromSeed(o.rlSeed === undefined ? `glyphs-${o.algo}` : `glyphs-${o.algo}-${o.rlSeed}`);
  const reward = async (images: Float32Array, cls: number[]) =>
    (await rec.score(asSaved(images), cls)).map((r) => r.ocr_confidence);
  let finalAccuracy = sftAccuracy;
  const every = Math.max(1, Math.floor(o.evalEvery / 10));
  let it = 1;
  for (; it <= o.rlIters && minutes() < o.minutes && cpuMinutes() < (o.cpuMinutes ?? Infinity); it++) {
    const prompts = Array.from({ length: d.rlPrompts }, () => rlRng.int(K));
    const r = await rlIteration(rl, reward, {
      loss,
      prompts,
      groupSize: d.groupSize,
      steps: d.rlSteps,
      noiseLevel: d.noiseLevel,
      nftUpdates: d.nftUpdates,
      nftOptimality: { clip: d.nftAdvClip, std: d.nftStd },
      ...(reference ? { reference } : {}),
      ...(old ? { old } : {}),
      rng: rlRng,
    });
    if (old) softUpdate(old, rl.weights, nftOldDecay(it, d.nftEtaRate, d.nftEtaMax));
    if (it % every === 0 || it === o.rlIters)
      finalAccuracy = await evalAndLog(o.algo, it, rl, rl.weights, {
        ...Object.fromEntries(Object.entries(r.metrics).map(([k, x]) => [k, round(x)])),
        reward_mean: round(r.metrics.reward_mean),
        loss: round(r.metrics.loss),
      });
  }
  if (it > 1 && (it - 1) % every !== 0 && it - 1 !== o.rlIters)
    finalAccuracy = await evalAndLog(o.algo, it - 1, rl, rl.weights);
  // the final policy as a model directory: rlstream generate <out>/model --prompt A --image-out a.png
  saveDit(join(o.out, 'model'), { config: cfg, classNames: [...CHARS.slice(0, K)], weights: rl.weights });
  return { sftAccuracy, finalAccuracy, recogniserHeldout };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values: v } = parseArgs({
    options: {
      out: { type: 'string', default: '/tmp/rlstream-glyphs' },
      algo: { type: 'string', default: 'diffusion_nft' },
      chars: { type: 'string', default: String(CHARS.length) },
      size: { type: 'string', default: '32' },
      'sft-steps': { type: 'string', default: '6000' },
      'rl-iters': { type: 'string', default: '80' },
      'recogniser-steps': { type: 'string', default: '2000' },
      'per-char': { type: 'string', default: '100' },
      'eval-every': { type: 'string', default: '250' },
      minutes: { type: 'string', default: '60' },
      'cpu-minutes': { type: 'string', default: '30' },
      hidden: { type: 'string' },
      depth: { type: 'string' },
      heads: { type: 'string' },
      patch: { type: 'string' },
      'sft-batch': { type: 'string' },
      'sft-lr': { type: 'string' },
      'sft-schedule': { type: 'string' },
      ema: { type: 'string' },
      'rl-lr': { type: 'string' },
      'rl-prompts': { type: 'string' },
      'group-size': { type: 'string' },
      'rl-steps': { type: 'string' },
      'nft-beta': { type: 'string' },
      'nft-updates': { type: 'string' },
      'nft-adv-clip': { type: 'string' },
      'nft-std': { type: 'string' },
      'nft-adaptive': { type: 'string' },
      'noise-level': { type: 'string' },
      'rl-cfg': { type: 'string' },
      'nft-eta-rate': { type: 'string' },
      'nft-eta-max': { type: 'string' },
      clip: { type: 'string' },
      'kl-coef': { type: 'string' },
      'eval-per-char': { type: 'string' },
      'cfg-dropout': { type: 'string' },
      'eval-cfg': { type: 'string' },
      'recogniser-hidden': { type: 'string' },
      'from-sft': { type: 'string' },
      'rl-seed': { type: 'string' },
      threads: { type: 'string' },
    },
  });
  if (v.algo !== 'diffusion_nft' && v.algo !== 'flow_grpo') {
    console.error(`--algo must be diffusion_nft or flow_grpo, got ${v.algo}`);
    process.exit(2);
  }
  if (v['sft-schedule'] !== undefined && v['sft-schedule'] !== 'constant' && v['sft-schedule'] !== 'cosine') {
    console.error(`--sft-schedule must be constant or cosine, got ${v['sft-schedule']}`);
    process.exit(2);
  }
  if (v['nft-std'] !== undefined && v['nft-std'] !== 'centred' && v['nft-std'] !== 'global') {
    console.error(`--nft-std must be centred or global, got ${v['nft-std']}`);
    process.exit(2);
  }
  const num = (s: string | undefined) => (s === undefined ? undefined : Number(s));
  const res = await runGlyphs({
    out: v.out!,
    algo: v.algo,
    chars: Number(v.chars),
    size: Number(v.size),
    sftSteps: Number(v['sft-steps']),
    rlIters: Number(v['rl-iters']),
    recogniserSteps: Number(v['recogniser-steps']),
    perChar: Number(v['per-char']),
    evalEvery: Number(v['eval-every']),
    minutes: Number(v.minutes),
    cpuMinutes: Number(v['cpu-minutes']),
    model: { hidden: num(v.hidden), depth: num(v.depth), heads: num(v.heads), patch: num(v.patch) },
    sftBatch: num(v['sft-batch']),
    sftLr: num(v['sft-lr']),
    sftSchedule: v['sft-schedule'] as 'constant' | 'cosine' | undefined,
    emaDecay: num(v.ema),
    rlLr: num(v['rl-lr']),
    rlPrompts: num(v['rl-prompts']),
    groupSize: num(v['group-size']),
    rlSteps: num(v['rl-steps']),
    nftBeta: num(v['nft-beta']),
    nftUpdates: num(v['nft-updates']),
    nftAdvClip: num(v['nft-adv-clip']),
    nftStd: v['nft-std'] as 'centred' | 'global' | undefined,
    nftAdaptive: v['nft-adaptive'] === undefined ? undefined : v['nft-adaptive'] !== '0',
    noiseLevel: num(v['noise-level']),
    rlCfg: num(v['rl-cfg']),
    nftEtaRate: num(v['nft-eta-rate']),
    nftEtaMax: num(v['nft-eta-max']),
    clip: num(v.clip),
    klCoef: num(v['kl-coef']),
    evalPerChar: num(v['eval-per-char']),
    cfgDropout: num(v['cfg-dropout']),
    evalCfg: num(v['eval-cfg']),
    recogniserHidden: num(v['recogniser-hidden']),
    fromSft: v['from-sft'],
    rlSeed: v['rl-seed'],
    threads: num(v.threads),
    log: (l) => console.log(JSON.stringify(l)),
  });
  console.log(JSON.stringify(res));
}
