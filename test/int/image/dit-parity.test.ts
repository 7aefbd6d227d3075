/**
 * The DiT image policy in ORT vs the PyTorch reference (test/torch/dit.py) at a tiny shape: the
 * velocity, Flow-GRPO's per-step log-probability, and the gradient of every parameter under the
 * flow-matching, Flow-GRPO (clipped ratio + KL) and DiffusionNFT losses, the RL ones also guided
 * (cfgScale: the trained velocity v_null + w·(v_c − v_null)). Skips only when PyTorch
 * is not installed.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { ditConfig, ditParamSpecs, initDitWeights, buildVelocityGraph } from '../../../lib/image/dit.ts';
import { buildImageTrainGraph, imageLossInputs, type ImageLossConfig } from '../../../lib/image/flow-graph.ts';
import { gaussian } from '../../../lib/image/sde.ts';
import { createSession, tensor } from '../../../lib/onnx/runtime.ts';
import { Rng } from '../../../lib/util/rng.ts';
import { f32, i64, readTensors, runTorch, tempDir, torchPython, writeTensors } from '../../../devkit/torch-ref.ts';
import type { StTensor } from '../../../lib/model/safetensors.ts';

const torch = torchPython();
const skip = torch.python ? false : torch.reason;
const cfg = ditConfig({
  numClasses: 3,
  imageSize: 8,
  channels: 1,
  patchSize: 2,
  hidden: 16,
  depth: 2,
  heads: 2,
  timeFreqs: 8,
});
const B = 3,
  PIX = 64;
const img = [B, 1, 8, 8];

let tmp: { dir: string; cleanup: () => void };
before(() => {
  tmp = tempDir('rlstream-dit-');
});
after(() => tmp?.cleanup());

function close(a: ArrayLike<number>, b: ArrayLike<number>, tol: number, what: string): void {
  assert.equal(a.length, b.length, `${what}: lengths`);
  let worst = 0,
    scale = 0;
  for (let i = 0; i < a.length; i++) {
    worst = Math.max(worst, Math.abs(a[i] - b[i]));
    scale = Math.max(scale, Math.abs(b[i]));
  }
  assert.ok(worst <= tol * Math.max(1, scale), `${what}: max |diff| ${worst} (scale ${scale})`);
}

async function check(loss: ImageLossConfig): Promise<void> {
  const rng = Rng.fromSeed(`dit-${loss.name}`);
  const w = initDitWeights(cfg, 7, { zeroInit: false });
  const specs = ditParamSpecs(cfg);
  const x = gaussian(rng, B * PIX),
    t = [0.9, 0.5, 0.2],
    cls = [0, 2, 3];
  const batch: Record<string, Float32Array> = {};
  for (const n of imageLossInputs(loss)) {
    if (n === 'cls') continue;
    if (['x0', 'noise', 'x_t', 'x_next', 'v_old', 'ref_mean'].includes(n)) batch[n] = gaussian(rng, B * PIX);
  }
  if (loss.name === 'flow_grpo') {
    Object.assign(batch, {
      t: Float32Array.from([0.9, 0.6, 0.3]),
      t_next: Float32Array.from([0.6, 0.3, 0.1]),
      sigma: Float32Array.from([0.7, 0.5, 0.4]),
      advantages: Float32Array.from([1.2, -0.7, 0.4]),
    });
    // x_next near the step's mean, so the ratio is near 1 and some rows clip
    for (let i = 0; i < B * PIX; i++) batch.x_next[i] = batch.x_t[i] * 0.8 + 0.2 * batch.x_next[i];
    batch.old_log_probs = Float32Array.from([0, 0, 0]);
  } else {
    batch.t = Float32Array.from(t);
    if (loss.name === 'diffusion_nft') batch.nft_r = Float32Array.from([0.9, 0.1, 0.6]);
  }
  // the graph side: velocity and the gradients
  const vs = await createSession(buildVelocityGraph(cfg), { threads: 1 });
  const pf: Record<string, ReturnType<typeof tensor>> = {};
  for (const s of specs) pf[s.name] = tensor('float32', w.get(s.name)!, s.shape);
  const vel = (
    await vs.run({ ...pf, x: tensor('float32', x, img), t: tensor('float32', t, [B]), cls: tensor('int64', cls, [B]) })
  ).velocity.data as Float32Array;
  const g = buildImageTrainGraph({
    dit: cfg,
    loss,
    optim: { betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0, maxGradNorm: null },
    mode: 'grad',
  });
  const gs = await createSession(g.builder.toBytes(), { threads: 1 });
  const feeds: Record<string, ReturnType<typeof tensor>> = { ...pf, cls: tensor('int64', cls, [B]) };
  for (const [n, a] of Object.entries(batch)) feeds[n] = tensor('float32', a, a.length === B ? [B] : img);
  const out = await gs.run(feeds);
  const grads = out['grad.packed'].data as Float32Array;
  // the reference
  const tensors: Record<string, StTensor> = {
    x: f32(x, img),
    t: f32(t, [B]),
    cls: i64(cls, [B]),
    'b.cls': i64(cls, [B]),
  };
  for (const s of specs) tensors[s.name] = f32(w.get(s.name)!, s.shape);
  for (const [n, a] of Object.entries(batch)) tensors[`b.${n}`] = f32(a, a.length === B ? [B] : img);
  const inPath = join(tmp.dir, `${loss.name}.in.safetensors`),
    outPath = join(tmp.dir, `${loss.name}.out.safetensors`);
  writeTensors(inPath, tensors);
  const res = await runTorch('dit.py', [
    '--config',
    JSON.stringify(cfg),
    '--loss',
    JSON.stringify(loss),
    '--inputs',
    inPath,
    '--out',
    outPath,
  ]);
  const ref = readTensors(outPath);
  close(vel, ref.get('velocity')!.data as Float32Array, 1e-4, 'velocity');
  const metrics = out.metrics.data as Float32Array;
  assert.ok(
    Math.abs(metrics[0] - res.loss) <= 1e-4 * Math.max(1, Math.abs(res.loss)),
    `loss ${metrics[0]} vs ${res.loss}`,
  );
  if (loss.name === 'flow_grpo')
    assert.ok(Math.abs(metrics[3] - mean(ref.get('log_probs')!.data as Float32Array)) < 1e-4, 'log-prob');
  let off = 0;
  for (const s of specs) {
    const n = s.shape.reduce((a, b) => a * b, 1);
    close(
      grads.subarray(off, off + n),
      ref.get(`grad.${s.name}`)!.data as Float32Array,
      2e-4,
      `grad ${s.name} (${loss.name})`,
    );
    off += n;
  }
}

const mean = (a: ArrayLike<number>) => Array.from(a).reduce((s, v) => s + v, 0) / a.length;

test('DiT velocity and flow-matching gradients match PyTorch', { skip }, () => check({ name: 'flow_matching' }));
test('Flow-GRPO step log-prob, clipped ratio and KL gradients match PyTorch', { skip }, () =>
  check({ name: 'flow_grpo', clipLow: 0.2, clipHigh: 0.28, klCoef: 0.05 }),
);
test('DiffusionNFT gradients match PyTorch', { skip }, () => check({ name: 'diffusion_nft', nftBeta: 0.5 }));
test('guided (CFG) Flow-GRPO and DiffusionNFT log-probs and gradients match PyTorch', { skip }, async () => {
  await check({ name: 'flow_grpo', clipLow: 0.2, clipHigh: 0.28, klCoef: 0.05, cfgScale: 3 });
  await check({ name: 'diffusion_nft', nftBeta: 0.5, cfgScale: 3 });
});
