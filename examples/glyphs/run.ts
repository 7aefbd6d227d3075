/**
 * The glyphs example end to end: render glyphs, train the recogniser (the reward model), learn a
 * DiT by flow matching on renders (SFT), then RL with DiffusionNFT or Flow-GRPO on the
 * recogniser's reward. Writes to --out: recogniser.onnx, curve.jsonl (one line per evaluation:
 * phase, step, wall minutes, accuracy of generated glyphs, mean ocr_confidence), and a PNG grid of
 * samples per evaluation, and the final policy as a model directory (model/).
 *
 *   node --import tsx examples/glyphs/run.ts --out /tmp/glyphs --algo diffusion_nft \
 *     [--sft-steps 1500] [--rl-iters 60] [--chars 36] [--size 32] [--minutes 15]
 */
import { mkdirSync, writeFileSync, appendFileSync, readFileSync } from 'node:fs';
import { decodeSafetensors, encodeSafetensors, toFloat32 } from '../../lib/model/safetensors.ts';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import os from 'node:os';
import { ditConfig, initDitWeights } from '../../lib/image/dit.ts';
import { gridPng } from '../../lib/image/png.ts';
import { saveDit } from '../../lib/image/checkpoint.ts';
import { rlIteration } from '../../lib/image/rl.ts';
import { gaussian, sampleImages } from '../../lib/image/sde.ts';
import { ImageTrainer } from '../../lib/image/trainer.ts';
import type { ImageLossConfig } from '../../lib/image/flow-graph.ts';
import { Rng } from '../../lib/util/rng.ts';
import { CHARS, HELDOUT_FONTS, TRAIN_FONTS, renderSet } from './glyphs.ts';
import { trainRecogniser, type Recogniser } from './recogniser.ts';

export interface GlyphRunOptions {
  out: string;
  algo: 'diffusion_nft' | 'flow_grpo';
  chars: number;
  size: number;
  sftSteps: number;
  rlIters: number;
  recogniserSteps: number;
  perChar: number;
  evalEvery: number;
  minutes: number;
  /** Start RL from these SFT weights (a previous run's sft.safetensors) instead of running SFT. */
  fromSft?: string;
  threads?: number;
  log?: (line: Record<string, unknown>) => void;
}

/** Accuracy and mean ocr_confidence of `perClass` ODE samples (10 steps, the current weights) of every class. */
async function evaluate(tr: ImageTrainer, rec: Recogniser, K: number, perClass: number, seed: number) {
  const cls = Array.from({ length: K * perClass }, (_, i) => i % K);
  const s = await sampleImages((x, t, c) => tr.velocity(x, t, c), {
    cls,
    pixels: tr.config.imageSize ** 2,
    steps: 10,
    rng: Rng.fromSeed(seed),
  });
  const sc = await rec.score(s.x0, cls);
  return {
    accuracy: sc.filter((r) => r.correct).length / sc.length,
    ocr_confidence: sc.reduce((a, r) => a + r.ocr_confidence, 0) / sc.length,
    images: s.x0,
  };
}

export async function runGlyphs(
  o: GlyphRunOptions,
): Promise<{ sftAccuracy: number; finalAccuracy: number; recogniserHeldout: number }> {
  mkdirSync(o.out, { recursive: true });
  const t0 = Date.now();
  const minutes = () => (Date.now() - t0) / 60000;
  const curve = join(o.out, 'curve.jsonl');
  writeFileSync(curve, '');
  const log = (line: Record<string, unknown>) => {
    const full = { ...line, wall_min: Math.round(minutes() * 100) / 100, load1: os.loadavg()[0] };
    appendFileSync(curve, JSON.stringify(full) + '\n');
    o.log?.(full);
  };
  const K = o.chars,
    S = o.size;
  const train = await renderSet({ faces: TRAIN_FONTS, perChar: o.perChar, size: S, seed: 'glyphs-train', chars: K });
  const held = await renderSet({ faces: HELDOUT_FONTS, perChar: 6, size: S, seed: 'glyphs-heldout', chars: K });
  const rec = await trainRecogniser(
    train,
    { size: S, hidden: 128, classes: K },
    { steps: o.recogniserSteps, batch: 64, lr: 2e-3, seed: 'glyphs-rec' },
  );
  writeFileSync(join(o.out, 'recogniser.onnx'), rec.toOnnx());
  const recogniserHeldout = await rec.accuracy(held.images, held.labels);
  log({
    phase: 'recogniser',
    train_accuracy: await rec.accuracy(train.images, train.labels),
    heldout_accuracy: recogniserHeldout,
  });

  const cfg = ditConfig({ numClasses: K, imageSize: S, patchSize: 4, hidden: 64, depth: 2, heads: 4, timeFreqs: 32 });
  const tr = new ImageTrainer(
    cfg,
    initDitWeights(cfg, 'glyphs-dit'),
    { betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0, maxGradNorm: 1, lr: 2e-3 },
    { threads: o.threads },
  );
  const rng = Rng.fromSeed('glyphs-sft');
  const px = S * S,
    n = train.labels.length,
    B = 64;
  const evalAndLog = async (phase: string, step: number, extra: Record<string, number> = {}) => {
    const e = await evaluate(tr, rec, K, 2, 1234);
    writeFileSync(
      join(o.out, `${phase}-${String(step).padStart(5, '0')}.png`),
      await gridPng(e.images.subarray(0, K * px), 1, S, Math.min(K, 12)),
    );
    log({ phase, step, accuracy: e.accuracy, ocr_confidence: e.ocr_confidence, ...extra });
    return e.accuracy;
  };
  let sftAccuracy = 0;
  if (o.fromSft) {
    const st = decodeSafetensors(readFileSync(o.fromSft), o.fromSft).tensors;
    for (const k of tr.weights.keys()) tr.weights.set(k, toFloat32(st.get(k)!, k, o.fromSft));
    o.sftSteps = 0;
  }
  for (let step = 1; step <= o.sftSteps; step++) {
    const idx = Array.from({ length: B }, () => rng.int(n));
    const x0 = new Float32Array(B * px);
    idx.forEach((k, i) => x0.set(train.images.subarray(k * px, (k + 1) * px), i * px));
    const m = await tr.step(
      { name: 'flow_matching' },
      {
        floats: { x0, noise: gaussian(rng, B * px), t: Array.from({ length: B }, () => rng.next()) },
        cls: idx.map((k) => train.labels[k]),
      },
    );
    if (step % o.evalEvery === 0 || step === o.sftSteps) sftAccuracy = await evalAndLog('sft', step, { loss: m.loss });
  }
  if (o.sftSteps === 0) sftAccuracy = await evalAndLog('sft', 0);
  else
    writeFileSync(
      join(o.out, 'sft.safetensors'),
      encodeSafetensors(
        [...tr.weights].map(([k, w]) => [
          k,
          { dtype: 'F32' as const, shape: tr.specs.find((s) => s.name === k)!.shape, data: w },
        ]),
      ),
    );
  const loss: ImageLossConfig =
    o.algo === 'flow_grpo'
      ? { name: 'flow_grpo', clipLow: 1e-3, clipHigh: 1e-3, klCoef: 0 }
      : { name: 'diffusion_nft', nftBeta: 1 };
  const rlRng = Rng.fromSeed(`glyphs-${o.algo}`);
  const reward = async (images: Float32Array, cls: number[]) =>
    (await rec.score(images, cls)).map((r) => r.ocr_confidence);
  let finalAccuracy = sftAccuracy;
  for (let it = 1; it <= o.rlIters && minutes() < o.minutes; it++) {
    const prompts = Array.from({ length: 8 }, () => rlRng.int(K));
    const r = await rlIteration(tr, reward, {
      loss,
      prompts,
      groupSize: 8,
      steps: 10,
      noiseLevel: 0.7,
      nftUpdates: 2,
      rng: rlRng,
    });
    if (it % Math.max(1, Math.floor(o.evalEvery / 10)) === 0 || it === o.rlIters)
      finalAccuracy = await evalAndLog(o.algo, it, { reward_mean: r.metrics.reward_mean, loss: r.metrics.loss });
  }
  // the final policy as a model directory: rlstream generate <out>/model --prompt A --image-out a.png
  saveDit(join(o.out, 'model'), { config: cfg, classNames: [...CHARS.slice(0, K)], weights: tr.weights });
  return { sftAccuracy, finalAccuracy, recogniserHeldout };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values: v } = parseArgs({
    options: {
      out: { type: 'string', default: '/tmp/rlstream-glyphs' },
      algo: { type: 'string', default: 'diffusion_nft' },
      chars: { type: 'string', default: String(CHARS.length) },
      size: { type: 'string', default: '32' },
      'sft-steps': { type: 'string', default: '1500' },
      'rl-iters': { type: 'string', default: '60' },
      'recogniser-steps': { type: 'string', default: '600' },
      'per-char': { type: 'string', default: '40' },
      'eval-every': { type: 'string', default: '250' },
      minutes: { type: 'string', default: '15' },
      'from-sft': { type: 'string' },
    },
  });
  if (v.algo !== 'diffusion_nft' && v.algo !== 'flow_grpo') {
    console.error(`--algo must be diffusion_nft or flow_grpo, got ${v.algo}`);
    process.exit(2);
  }
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
    fromSft: v['from-sft'],
    log: (l) => console.log(JSON.stringify(l)),
  });
  console.log(JSON.stringify(res));
}
