/**
 * Reference vs fast: the three image losses of the training graph (flow-graph.ts) against a plain
 * float64 evaluation of their formulas from the velocity graph's output, at a tiny shape; and one
 * AdamW step of the trainer lowers the flow-matching loss on its batch.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ditConfig, initDitWeights } from '../../../lib/image/dit.ts';
import { IMAGE_LOSSES, type ImageLossConfig } from '../../../lib/image/flow-graph.ts';
import { gaussian, gaussianLogProb, guidedVelocity, sampleImages, sdeStepMean } from '../../../lib/image/sde.ts';
import { imageUpdate, lossVelocity, nftOldDecay, softUpdate } from '../../../lib/image/rl.ts';
import { generationRecords } from '../../../lib/image/trajectory.ts';
import { ImageTrainer } from '../../../lib/image/trainer.ts';
import { Rng } from '../../../lib/util/rng.ts';

const cfg = ditConfig({ numClasses: 2, imageSize: 4, patchSize: 2, hidden: 8, depth: 1, heads: 2, timeFreqs: 4 });
const B = 4,
  P = 16;
const optim = { betas: [0.9, 0.999] as [number, number], eps: 1e-8, weightDecay: 0, maxGradNorm: null, lr: 0 };

const pixMean = (a: ArrayLike<number>, b: number) => {
  let s = 0;
  for (let i = b * P; i < (b + 1) * P; i++) s += a[i];
  return s / P;
};

/** A loss test's batch: weights, clean images, noise, a sampling velocity, x_t at t, and a trainer at lr 0. */
function lossCase(seed: number, stream: string, cls: number[]) {
  const w = initDitWeights(cfg, seed, { zeroInit: false });
  const rng = Rng.fromSeed(stream);
  const t = [0.8, 0.6, 0.4, 0.2];
  const x0 = gaussian(rng, B * P),
    noise = gaussian(rng, B * P),
    vOld = gaussian(rng, B * P);
  const xt = Float32Array.from(x0, (x, i) => (1 - t[Math.floor(i / P)]) * x + t[Math.floor(i / P)] * noise[i]);
  // lr 0: the step leaves the weights, the metrics are the loss at them
  const tr = new ImageTrainer(cfg, w, optim, { threads: 1 });
  return { cls, t, x0, noise, vOld, xt, tr };
}

test('the graph losses equal their float64 reference from the velocity', async () => {
  const { cls, t, x0, noise, vOld, xt, tr } = lossCase(3, 'losses', [0, 1, 2, 1]);
  const v = await tr.velocity(xt, t, cls);
  const sq = (a: number) => a * a;

  const fm = await tr.step({ name: 'flow_matching' }, { floats: { x0, noise, t }, cls });
  let ref = 0;
  for (let b = 0; b < B; b++)
    ref +=
      pixMean(
        Array.from({ length: B * P }, (_, i) => sq(v[i] - (noise[i] - x0[i]))),
        b,
      ) / B;
  assert.ok(Math.abs(fm.loss - ref) < 1e-5, `flow_matching ${fm.loss} vs ${ref}`);

  const r = [0.9, 0.2, 0.5, 0.0],
    beta = 0.7;
  const nft = await tr.step(
    { name: 'diffusion_nft', nftBeta: beta },
    { floats: { x0, noise, t, v_old: vOld, nft_r: r }, cls },
  );
  ref = 0;
  for (let b = 0; b < B; b++) {
    const pos = pixMean(
      Array.from({ length: B * P }, (_, i) => sq((1 - beta) * vOld[i] + beta * v[i] - (noise[i] - x0[i]))),
      b,
    );
    const neg = pixMean(
      Array.from({ length: B * P }, (_, i) => sq((1 + beta) * vOld[i] - beta * v[i] - (noise[i] - x0[i]))),
      b,
    );
    ref += (r[b] * pos + (1 - r[b]) * neg) / B;
  }
  assert.ok(Math.abs(nft.loss - ref) < 1e-5, `diffusion_nft ${nft.loss} vs ${ref}`);

  // Flow-GRPO: one step at a shared t (the sampler's layout), the reference from sde.ts's copy of the step
  const ts = Array(B).fill(0.6),
    sNext = 0.4,
    sigma = 0.5;
  const vs = await tr.velocity(x0, ts, cls);
  const { mean, std } = sdeStepMean(x0, vs, 0.6, sNext, sigma);
  const xNext = Float32Array.from(mean, (m, i) => m + std * noise[i]);
  const lp = gaussianLogProb(xNext, mean, std, B);
  const old = lp.map((l, b) => l + [0.3, -0.3, 0.05, 0][b]);
  const adv = [1, -1, 0.5, 2];
  const refMean = Float32Array.from(mean, (m, i) => m + 0.01 * vOld[i]);
  const loss: ImageLossConfig = { name: 'flow_grpo', clipLow: 0.2, clipHigh: 0.2, klCoef: 0.1 };
  const g = await tr.step(loss, {
    floats: {
      x_t: x0,
      x_next: xNext,
      t: ts,
      t_next: Array(B).fill(sNext),
      sigma: Array(B).fill(sigma),
      old_log_probs: old,
      advantages: adv,
      ref_mean: refMean,
    },
    cls,
  });
  ref = 0;
  let klRef = 0,
    clipped = 0;
  for (let b = 0; b < B; b++) {
    const ratio = Math.exp(lp[b] - old[b]);
    const c = Math.min(Math.max(ratio, 0.8), 1.2);
    if (c !== ratio) clipped++;
    const kl =
      pixMean(
        Array.from({ length: B * P }, (_, i) => sq(mean[i] - refMean[i])),
        b,
      ) /
      (2 * std * std);
    klRef += kl / B;
    ref += (-Math.min(ratio * adv[b], c * adv[b]) + 0.1 * kl) / B;
  }
  assert.ok(Math.abs(g.loss - ref) < 1e-4, `flow_grpo ${g.loss} vs ${ref}`);
  assert.ok(Math.abs(g.kl - klRef) < 1e-5, `kl ${g.kl} vs ${klRef}`);
  assert.equal(g.clipfrac, clipped / B);
  assert.ok(clipped > 0 && clipped < B);
  assert.deepEqual([...IMAGE_LOSSES], ['flow_matching', 'flow_grpo', 'diffusion_nft']);
});

test('an AdamW step of the trainer lowers the flow-matching loss; EMA follows the weights', async () => {
  const rng = Rng.fromSeed('step');
  const tr = new ImageTrainer(
    cfg,
    initDitWeights(cfg, 5, { zeroInit: false }),
    { ...optim, lr: 0.01 },
    { threads: 1, emaDecay: 0.5 },
  );
  const batch = {
    floats: { x0: gaussian(rng, B * P), noise: gaussian(rng, B * P), t: [0.3, 0.5, 0.7, 0.9] },
    cls: [0, 1, 0, 1],
  };
  const first = await tr.step({ name: 'flow_matching' }, batch);
  for (let i = 0; i < 5; i++) await tr.step({ name: 'flow_matching' }, batch);
  const last = await tr.step({ name: 'flow_matching' }, batch);
  assert.ok(last.loss < first.loss, `${last.loss} !< ${first.loss}`);
  const k = 'x_embed.weight';
  const e = tr.ema!.get(k)!,
    cur = tr.weights.get(k)!;
  assert.notDeepEqual(e, cur);
  await assert.rejects(
    tr.step({ name: 'flow_matching' }, { floats: { x0: batch.floats.x0 }, cls: batch.cls }),
    /input noise missing/,
  );
});

test('gradient checkpointing gives the same step', async () => {
  const rng = Rng.fromSeed('ckpt');
  const c2 = ditConfig({ ...cfg, depth: 2 });
  const w = initDitWeights(c2, 9, { zeroInit: false });
  const batch = {
    floats: { x0: gaussian(rng, B * P), noise: gaussian(rng, B * P), t: [0.3, 0.5, 0.7, 0.9] },
    cls: [0, 1, 0, 1],
  };
  const a = new ImageTrainer(c2, w, { ...optim, lr: 0.01 }, { threads: 1 });
  const b = new ImageTrainer(c2, w, { ...optim, lr: 0.01 }, { threads: 1, gradientCheckpointing: true });
  const ma = await a.step({ name: 'flow_matching' }, batch);
  const mb = await b.step({ name: 'flow_matching' }, batch);
  assert.ok(Math.abs(ma.grad_norm - mb.grad_norm) < 1e-5 * ma.grad_norm, `${ma.grad_norm} vs ${mb.grad_norm}`);
  for (const [k, v] of a.weights) {
    const u = b.weights.get(k)!;
    for (let i = 0; i < v.length; i++) assert.ok(Math.abs(v[i] - u[i]) < 1e-6, k);
  }
});

test('guided RL losses train v_∅ + w·(v_c − v_∅): equal to the reference from the guided velocity, and a guided SDE rollout reads back at ratio 1', async () => {
  const { cls, t, x0, noise, vOld, xt, tr } = lossCase(4, 'guided', [0, 1, 1, 0]);
  const scale = 3;
  const vc = await tr.velocity(xt, t, cls);
  const vn = await tr.velocity(xt, t, [2, 2, 2, 2]);
  const vg = await guidedVelocity((x, tt, c) => tr.velocity(x, tt, c), scale, cfg.numClasses)(xt, t, cls);
  for (let i = 0; i < vg.length; i++) assert.ok(Math.abs(vg[i] - (vn[i] + scale * (vc[i] - vn[i]))) < 1e-5);
  const r = [0.9, 0.2, 0.5, 0.0],
    beta = 1;
  const nft = await tr.step(
    { name: 'diffusion_nft', nftBeta: beta, cfgScale: scale },
    { floats: { x0, noise, t, v_old: vOld, nft_r: r }, cls },
  );
  let ref = 0;
  for (let b = 0; b < B; b++) {
    let pos = 0,
      neg = 0;
    for (let i = b * P; i < (b + 1) * P; i++) {
      const u = noise[i] - x0[i];
      pos += ((1 - beta) * vOld[i] + beta * vg[i] - u) ** 2 / P;
      neg += ((1 + beta) * vOld[i] - beta * vg[i] - u) ** 2 / P;
    }
    ref += (r[b] * pos + (1 - r[b]) * neg) / B;
  }
  assert.ok(Math.abs(nft.loss - ref) < 1e-4 * ref, `guided diffusion_nft ${nft.loss} vs ${ref}`);
  const unguided = await tr.step(
    { name: 'diffusion_nft', nftBeta: beta },
    { floats: { x0, noise, t, v_old: vOld, nft_r: r }, cls },
  );
  assert.ok(Math.abs(unguided.loss - nft.loss) > 1e-3, 'the guidance changes the loss');

  // Flow-GRPO: a guided SDE rollout's records through the update at the weights that sampled them
  const loss: ImageLossConfig = { name: 'flow_grpo', clipLow: 1e-4, clipHigh: 1e-4, cfgScale: scale };
  const sample = await sampleImages(lossVelocity(tr, loss), {
    cls,
    pixels: P,
    steps: 4,
    noiseLevel: 0.7,
    rng: Rng.fromSeed('guided-sde'),
  });
  const samples = await generationRecords(sample, 1, 4);
  const recorded = sample.steps.map((s) => s.logProbs.reduce((a, b) => a + b, 0) / B);
  const m = await imageUpdate(tr, { cls, samples, weights: [1, -1, 0.5, -0.5] }, { loss, rng: Rng.fromSeed('unused') });
  assert.equal(m.clipfrac, 0);
  const meanRecorded = recorded.reduce((a, b) => a + b, 0) / recorded.length;
  assert.ok(Math.abs(m.log_prob - meanRecorded) < 1e-4, `recomputed ${m.log_prob} vs stored ${meanRecorded}`);
  // the same records under the unguided loss are another policy's: their ratio leaves the clip range
  const off = await imageUpdate(
    tr,
    { cls, samples, weights: [1, -1, 0.5, -0.5] },
    { loss: { ...loss, cfgScale: 1 }, rng: Rng.fromSeed('unused') },
  );
  assert.ok(off.clipfrac > 0, 'unguided log-probs of guided samples differ');
});

test("DiffusionNFT's sampling policy: η_i = min(rate·i, max), θ_old ← η·θ_old + (1 − η)·θ", () => {
  assert.deepEqual(
    [1, 250, 500, 900].map((i) => nftOldDecay(i, 0.001, 0.5)),
    [0.001, 0.25, 0.5, 0.5],
  );
  const old = new Map([['w', Float32Array.from([1, 2])]]);
  softUpdate(old, new Map([['w', Float32Array.from([3, -2])]]), 0.25);
  assert.deepEqual([...old.get('w')!], [2.5, -1]);
  softUpdate(old, new Map([['w', Float32Array.from([7, 7])]]), 0);
  assert.deepEqual([...old.get('w')!], [7, 7], 'η = 0 is the trained weights (on-policy)');
  assert.throws(() => softUpdate(old, new Map([['v', Float32Array.from([1])]]), 0.5), /weight v missing/);
});

test("diffusion_nft's adaptive weighting: t²·‖v± − u‖² / sg(t·|v± − u|‾), the weight without gradient", async () => {
  const { cls, t, x0, noise, vOld, xt, tr } = lossCase(5, 'adaptive', [0, 1, 1, 0]);
  const v = await tr.velocity(xt, t, cls);
  const r = [0.9, 0.2, 0.5, 0.0],
    beta = 0.5;
  const loss: ImageLossConfig = { name: 'diffusion_nft', nftBeta: beta, nftAdaptiveWeight: true };
  const m = await tr.step(loss, { floats: { x0, noise, t, v_old: vOld, nft_r: r }, cls });
  let ref = 0;
  for (let b = 0; b < B; b++) {
    const term = (sign: 1 | -1) => {
      let sq = 0,
        ab = 0;
      for (let i = b * P; i < (b + 1) * P; i++) {
        const vv = sign > 0 ? (1 - beta) * vOld[i] + beta * v[i] : (1 + beta) * vOld[i] - beta * v[i];
        const e = t[b] * (noise[i] - x0[i] - vv);
        sq += (e * e) / P;
        ab += Math.abs(e) / P;
      }
      return sq / Math.max(ab, 1e-5);
    };
    ref += (r[b] * term(1) + (1 - r[b]) * term(-1)) / B;
  }
  assert.ok(Math.abs(m.loss - ref) < 1e-5 * Math.max(1, ref), `adaptive diffusion_nft ${m.loss} vs ${ref}`);

  // one image, r = 1, β = 1 (the loss is the positive term of v_θ alone): the weight has no gradient,
  // so the gradient is the plain loss's times t/|v − u|‾ (a gradient through the weight would not be)
  const one = { x0: x0.slice(0, P), noise: noise.slice(0, P), t: [t[0]], v_old: vOld.slice(0, P), nft_r: [1] };
  const plain = await tr.step({ name: 'diffusion_nft', nftBeta: 1 }, { floats: one, cls: [cls[0]] });
  const adaptive = await tr.step({ ...loss, nftBeta: 1 }, { floats: one, cls: [cls[0]] });
  let mae = 0;
  for (let i = 0; i < P; i++) mae += Math.abs(v[i] - (noise[i] - x0[i])) / P;
  const want = (plain.grad_norm * t[0]) / mae;
  assert.ok(Math.abs(adaptive.grad_norm - want) < 1e-4 * want, `grad norm ${adaptive.grad_norm} vs ${want}`);
});
