/**
 * LoRA on the DiT (lib/image/lora.ts), reference vs fast at a tiny shape: the training graph's
 * forward with adapters equals the plain model at W + (α/r)·B·A merged here in float64; its
 * gradients are the adapters' only and equal the chain rule through the merged weights
 * (∂L/∂A = s·Bᵀ·G, ∂L/∂B = s·G·Aᵀ with G = ∂L/∂W' of the full graph); a step leaves the base as it
 * is; gradient checkpointing gives the same gradients; bad target names list the valid ones.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ditConfig, ditParamSpecs, initDitWeights, type DitWeights } from '../../../lib/image/dit.ts';
import { buildImageTrainGraph } from '../../../lib/image/flow-graph.ts';
import { ditLoraConfig, ditLoraSites, ditLoraSpecs, type DitLora } from '../../../lib/image/lora.ts';
import { gaussian } from '../../../lib/image/sde.ts';
import { ImageTrainer } from '../../../lib/image/trainer.ts';
import { createSession, tensor } from '../../../lib/onnx/runtime.ts';
import { Rng } from '../../../lib/util/rng.ts';

const cfg = ditConfig({ numClasses: 2, imageSize: 4, patchSize: 2, hidden: 8, depth: 2, heads: 2, timeFreqs: 4 });
const B = 4,
  P = 16;
const optim = { betas: [0.9, 0.999] as [number, number], eps: 1e-8, weightDecay: 0, maxGradNorm: null, lr: 0 };
const lora: DitLora = ditLoraConfig({ rank: 2, alpha: 3, targetModules: ['qkv', 'fc2', 'ada'] });
const s = 3 / 2;
const rng = Rng.fromSeed('dit-lora');
const base = initDitWeights(cfg, 4, { zeroInit: false });
// an adapter with B ≠ 0 (a fresh one's B = 0 would hide the A-side of the product)
const adapter: DitWeights = new Map(
  ditLoraSpecs(cfg, lora).map((sp) => [
    sp.name,
    Float32Array.from(gaussian(rng, sp.shape[0] * sp.shape[1]), (x) => 0.3 * x),
  ]),
);
const batch = {
  floats: { x0: gaussian(rng, B * P), noise: gaussian(rng, B * P), t: [0.2, 0.4, 0.6, 0.8] },
  cls: [0, 1, 2, 1],
};

/** W + s·B·A in float64, written out here (not lib/image/lora.ts mergeDitLora). */
function mergedByHand(): DitWeights {
  const w: DitWeights = new Map(base);
  for (const site of ditLoraSites(cfg, lora)) {
    const W = base.get(`${site.path}.weight`)!,
      A = adapter.get(`${site.path}.lora_A.weight`)!,
      Bm = adapter.get(`${site.path}.lora_B.weight`)!;
    const M = new Float32Array(W.length);
    for (let o = 0; o < site.out; o++)
      for (let i = 0; i < site.in; i++) {
        let acc = 0;
        for (let k = 0; k < lora.rank; k++) acc += Bm[o * lora.rank + k] * A[k * site.in + i];
        M[o * site.in + i] = W[o * site.in + i] + s * acc;
      }
    w.set(`${site.path}.weight`, M);
  }
  return w;
}

/** The packed gradients of the flow-matching loss (grad mode) for `weights` (+ `adapter` with LoRA). */
async function grads(opts: { lora: DitLora | null; checkpoint: boolean; weights: DitWeights }): Promise<Float32Array> {
  const g = buildImageTrainGraph({
    dit: cfg,
    loss: { name: 'flow_matching' },
    optim: { ...optim },
    mode: 'grad',
    gradientCheckpointing: opts.checkpoint,
    lora: opts.lora,
  });
  const sess = await createSession(g.builder.toBytes(), { threads: 1 });
  const feeds: Record<string, ReturnType<typeof tensor>> = {};
  for (const sp of ditParamSpecs(cfg)) feeds[sp.name] = tensor('float32', opts.weights.get(sp.name)!, sp.shape);
  if (opts.lora)
    for (const sp of ditLoraSpecs(cfg, opts.lora)) feeds[sp.name] = tensor('float32', adapter.get(sp.name)!, sp.shape);
  feeds.x0 = tensor('float32', batch.floats.x0, [B, 1, 4, 4]);
  feeds.noise = tensor('float32', batch.floats.noise, [B, 1, 4, 4]);
  feeds.t = tensor('float32', Float32Array.from(batch.floats.t), [B]);
  feeds.cls = tensor('int64', batch.cls, [B]);
  return (await sess.run(feeds))['grad.packed'].data as Float32Array;
}

const close = (a: number, b: number, tol: number) => Math.abs(a - b) <= tol * (1 + Math.abs(b));

test('LoRA forward = the model at W + (α/r)·B·A; gradients only on A and B, by the chain rule', async () => {
  const merged = mergedByHand();
  const withLora = new ImageTrainer(cfg, base, optim, { threads: 1, lora, adapter });
  const plain = new ImageTrainer(cfg, merged, optim, { threads: 1 });
  // the training graph's loss (lr 0: the metrics are at these weights) runs the adapter path
  const [l1, l2] = [
    await withLora.step({ name: 'flow_matching' }, batch),
    await plain.step({ name: 'flow_matching' }, batch),
  ];
  assert.ok(close(l1.loss, l2.loss, 1e-5), `loss ${l1.loss} vs ${l2.loss}`);
  // sampling uses the merged weights
  const x = batch.floats.x0;
  const [v1, v2] = [
    await withLora.velocity(x, batch.floats.t, batch.cls),
    await plain.velocity(x, batch.floats.t, batch.cls),
  ];
  for (let i = 0; i < v1.length; i++) assert.ok(close(v1[i], v2[i], 1e-5), `velocity ${i}: ${v1[i]} vs ${v2[i]}`);

  const gl = await grads({ lora, checkpoint: false, weights: base });
  const specs = ditLoraSpecs(cfg, lora);
  assert.equal(
    gl.length,
    specs.reduce((n, sp) => n + sp.shape[0] * sp.shape[1], 0),
    'gradients of the adapters only',
  );
  const gFull = await grads({ lora: null, checkpoint: false, weights: merged });
  const fullOff = new Map<string, number>();
  let off = 0;
  for (const sp of ditParamSpecs(cfg)) {
    fullOff.set(sp.name, off);
    off += sp.shape.reduce((a, b) => a * b, 1);
  }
  off = 0;
  const r = lora.rank;
  for (const site of ditLoraSites(cfg, lora)) {
    const G = gFull.subarray(fullOff.get(`${site.path}.weight`)!); // [out, in]
    const A = adapter.get(`${site.path}.lora_A.weight`)!,
      Bm = adapter.get(`${site.path}.lora_B.weight`)!;
    for (let k = 0; k < r; k++)
      for (let i = 0; i < site.in; i++) {
        let ref = 0; // s·Σ_o B[o, k]·G[o, i]
        for (let o = 0; o < site.out; o++) ref += s * Bm[o * r + k] * G[o * site.in + i];
        assert.ok(
          close(gl[off + k * site.in + i], ref, 1e-4),
          `${site.path} dA[${k},${i}] ${gl[off + k * site.in + i]} vs ${ref}`,
        );
      }
    off += r * site.in;
    for (let o = 0; o < site.out; o++)
      for (let k = 0; k < r; k++) {
        let ref = 0; // s·Σ_i G[o, i]·A[k, i]
        for (let i = 0; i < site.in; i++) ref += s * G[o * site.in + i] * A[k * site.in + i];
        assert.ok(close(gl[off + o * r + k], ref, 1e-4), `${site.path} dB[${o},${k}] ${gl[off + o * r + k]} vs ${ref}`);
      }
    off += site.out * r;
  }

  // gradient checkpointing with LoRA: the same gradients
  const gc = await grads({ lora, checkpoint: true, weights: base });
  for (let i = 0; i < gl.length; i++)
    assert.ok(close(gc[i], gl[i], 1e-6), `checkpointed grad ${i}: ${gc[i]} vs ${gl[i]}`);

  // a step moves the adapters; the base (every tensor but the adapted weights) stays bit-equal
  const tr = new ImageTrainer(cfg, base, { ...optim, lr: 0.01 }, { threads: 1, lora, loraSeed: 1 });
  const a0 = new Map([...tr.adapter!].map(([k, v]) => [k, Float32Array.from(v)]));
  assert.ok(
    [...a0].filter(([k]) => k.endsWith('lora_B.weight')).every(([, v]) => v.every((x) => x === 0)),
    'B = 0 at init',
  );
  await tr.step({ name: 'flow_matching' }, batch);
  await tr.step({ name: 'flow_matching' }, batch);
  assert.ok(
    [...a0].every(([k, v]) => tr.adapter!.get(k)!.some((x, i) => x !== v[i])),
    'every adapter tensor moved',
  );
  const adapted = new Set(ditLoraSites(cfg, lora).map((x) => `${x.path}.weight`));
  for (const sp of ditParamSpecs(cfg)) {
    if (adapted.has(sp.name)) assert.notDeepEqual(tr.weights.get(sp.name), base.get(sp.name), sp.name);
    else assert.deepEqual(tr.weights.get(sp.name), base.get(sp.name), `${sp.name} is frozen`);
  }
  assert.equal(tr.optimizerState().expAvg.size, specs.length, 'AdamW state of the adapters only');
});

test('actor.model.lora target names: unknown ones list the valid ones', () => {
  assert.deepEqual(ditLoraConfig({ rank: 4, alpha: 8, targetModules: 'all-linear' }).modules, [
    'ada',
    'qkv',
    'proj',
    'fc1',
    'fc2',
  ]);
  assert.throws(
    () => ditLoraConfig({ rank: 4, alpha: 8, targetModules: ['q_proj'] }),
    /target_modules: "q_proj" is no linear layer .*valid: ada, qkv, proj, fc1, fc2 \(or all-linear\)/,
  );
  assert.throws(() => ditLoraConfig({ rank: 0, alpha: 8, targetModules: ['qkv'] }), /rank must be an integer ≥ 1/);
});
