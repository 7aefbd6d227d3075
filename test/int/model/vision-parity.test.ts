/**
 * A vision-language policy in ORT vs the PyTorch reference (test/torch/vision_ref.py, from raw
 * 8-bit pixels, so the patch layout, normalisation and 2-D positions are checked too): per-token
 * log-probs with images (2-D RoPE with a 2×2 merge, and 1-D RoPE without), one clipped AdamW step
 * with weight decay over every weight (the tower included), and the HF checkpoint directory
 * round trip of the VLM (config.json vision_config, visual.* safetensors names). Skips only when
 * PyTorch is not installed.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { initWeights, modelConfig, type ModelConfig, type Weights } from '../../../lib/model/index.ts';
import { loadCheckpoint, saveCheckpoint } from '../../../lib/model/checkpoint.ts';
import type { VisionConfigInput } from '../../../lib/model/config.ts';
import { paramSpecs } from '../../../lib/model/params.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { Trainer, type TrainBatch } from '../../../lib/model/train.ts';
import { expandImagePads, type ImagePixels } from '../../../lib/model/vision.ts';
import { Rng } from '../../../lib/util/rng.ts';
import { f32, i64, readTensors, runTorch, tempDir, torchPython, writeTensors } from '../../../devkit/torch-ref.ts';
import type { StTensor } from '../../../lib/model/safetensors.ts';

const torch = torchPython();
const skip = torch.python ? false : torch.reason;
const cache = new SessionCache();
const IMG = 40,
  VS = 41,
  VE = 42;

let tmp: { dir: string; cleanup: () => void };
before(() => {
  tmp = tempDir('rlstream-vlm-');
});
after(() => tmp?.cleanup());

function vlm(vision: Partial<VisionConfigInput> = {}): ModelConfig {
  return modelConfig({
    modelType: 'qwen2',
    hiddenSize: 32,
    intermediateSize: 48,
    numHiddenLayers: 2,
    numAttentionHeads: 4,
    numKeyValueHeads: 2,
    vocabSize: 48,
    maxPositionEmbeddings: 64,
    attentionBias: true,
    tieWordEmbeddings: true,
    ropeTheta: 1e6,
    rmsNormEps: 1e-5,
    bosTokenId: 1,
    eosTokenId: 2,
    padTokenId: 0,
    vision: {
      depth: 2,
      hiddenSize: 16,
      intermediateSize: 32,
      numHeads: 2,
      outHiddenSize: 32,
      patchSize: 4,
      imageTokenId: IMG,
      visionStartTokenId: VS,
      visionEndTokenId: VE,
      ...vision,
    },
  });
}

async function model(name: string, c: ModelConfig, seed: number): Promise<{ w: Weights; dir: string }> {
  const w = initWeights(c, seed, { std: 0.2 });
  const rng = Rng.fromSeed(`vparity:${seed}`);
  for (const s of paramSpecs(c)) {
    if (/norm\d?\.weight$|ln_q\.weight$|\.bias$/.test(s.name)) {
      const a = w.get(s.name)!;
      for (let i = 0; i < a.length; i++) a[i] = (s.name.endsWith('.bias') ? 0 : 1) + 0.2 * (rng.next() - 0.5);
    }
  }
  const dir = join(tmp.dir, name);
  await saveCheckpoint(dir, c, w, { dtype: 'float32' });
  return { w, dir };
}

function image(w: number, h: number, seed: number): ImagePixels {
  const rng = Rng.fromSeed(`vimg:${seed}`);
  return { width: w, height: h, data: Uint8Array.from({ length: w * h * 3 }, () => Math.floor(rng.next() * 256)) };
}

/** Three rows: two images of different sizes; none; one. Right-padded to one length. */
function batchOf(c: ModelConfig): { batch: TrainBatch; torchIn: Record<string, StTensor> } {
  const a = image(16, 8, 1),
    b = image(8, 8, 2),
    d = image(8, 16, 3);
  const rows = [
    { ids: expandImagePads(c, [1, VS, IMG, VE, 5, VS, IMG, VE, 6, 7, 8, 9, 10], [a, b]), images: [a, b] },
    { ids: [1, 11, 12, 13, 14, 15, 16], images: [] },
    { ids: expandImagePads(c, [1, 17, VS, IMG, VE, 18, 19, 20, 21], [d]), images: [d] },
  ];
  const T = Math.max(...rows.map((r) => r.ids.length)),
    B = rows.length;
  const tokens = new Int32Array(B * T),
    attn = new Float32Array(B * T),
    resp = new Float32Array(B * T);
  rows.forEach((r, k) =>
    r.ids.forEach((v, t) => {
      tokens[k * T + t] = v;
      attn[k * T + t] = 1;
      resp[k * T + t] = t >= 3 && v !== IMG && v !== VS && v !== VE ? 1 : 0;
    }),
  );
  const lossMask = new Float32Array(B * (T - 1));
  for (let k = 0; k < B; k++)
    for (let t = 1; t < T; t++) lossMask[k * (T - 1) + t - 1] = resp[k * T + t] && attn[k * T + t] ? 1 : 0;
  const torchIn: Record<string, StTensor> = {
    input_ids: i64(tokens, [B, T]),
    attention_mask: i64(attn, [B, T]),
    loss_mask: f32(lossMask, [B, T - 1]),
  };
  rows
    .flatMap((r) => r.images)
    .forEach((im, i) => {
      torchIn[`image.${i}`] = { dtype: 'U8', shape: [im.height, im.width, 3], data: im.data };
    });
  return {
    batch: {
      batchSize: B,
      seqLen: T,
      tokens,
      attentionMask: attn,
      responseMask: resp,
      images: rows.map((r) => r.images),
    },
    torchIn,
  };
}

const drv = (dir: string) => [
  '--config',
  join(dir, 'config.json'),
  '--weights',
  join(dir, 'model.safetensors'),
  '--threads',
  '1',
  '--suppress',
  `${IMG},${VS},${VE}`,
];

function relErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let d = 0,
    n = 0;
  for (let i = 0; i < a.length; i++) {
    d += (a[i] - b[i]) ** 2;
    n += b[i] ** 2;
  }
  return Math.sqrt(d) / Math.max(Math.sqrt(n), 1e-30);
}

for (const [name, vision] of [
  ['2d-merge2', {}],
  ['1d-merge1', { rope: '1d', spatialMergeSize: 1, temporalPatchSize: 1 }],
] as const) {
  test(`log-probs with images match torch (${name})`, { skip }, async () => {
    const c = vlm(vision);
    const { w, dir } = await model(name, c, 7);
    const { batch, torchIn } = batchOf(c);
    const inp = join(dir, 'in.safetensors'),
      out = join(dir, 'out.safetensors');
    writeTensors(inp, torchIn);
    await runTorch('vision.py', [...drv(dir), '--inputs', inp, '--out', out]);
    const ref = readTensors(out).get('logprobs')!.data as Float32Array;
    const trainer = new Trainer({ model: c, loss: { type: 'sft' }, weights: w, threads: 1, cache });
    const { perToken } = await trainer.evaluate(batch);
    const B = batch.batchSize,
      T = batch.seqLen;
    let n = 0;
    for (let r = 0; r < B; r++)
      for (let t = 1; t < T; t++) {
        if (!batch.attentionMask![r * T + t] || [IMG, VS, VE].includes(batch.tokens[r * T + t])) continue;
        const want = ref[r * (T - 1) + t - 1];
        assert.ok(
          Math.abs(perToken[r * T + t] - want) < 2e-5,
          `row ${r} pos ${t}: ${perToken[r * T + t]} vs torch ${want}`,
        );
        n++;
      }
    assert.equal(n, 17, 'every real non-vision position compared');
  });
}

test(
  'one clipped AdamW step with weight decay matches torch on every weight, the tower included',
  { skip },
  async () => {
    const c = vlm();
    const { w, dir } = await model('adam', c, 8);
    const { batch, torchIn } = batchOf(c);
    const inp = join(dir, 'a-in.safetensors'),
      out = join(dir, 'a-out.safetensors');
    writeTensors(inp, torchIn);
    const lr = 3e-3;
    const ref = await runTorch('vision.py', [
      ...drv(dir),
      '--inputs',
      inp,
      '--out',
      out,
      '--steps',
      '1',
      '--lr',
      String(lr),
      '--weight-decay',
      '0.05',
      '--max-grad-norm',
      '0.5',
    ]);
    const trainer = new Trainer({
      model: c,
      loss: { type: 'sft' },
      weights: w,
      threads: 1,
      cache,
      optim: { betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0.05, maxGradNorm: 0.5 },
    });
    const r = await trainer.step(batch, lr);
    assert.ok(ref.grad_norms[0] > 0.5, 'clipping is exercised');
    assert.ok(
      Math.abs(r.metrics.loss - ref.losses[0]) < 1e-5 * Math.abs(ref.losses[0]),
      `loss ${r.metrics.loss} vs torch ${ref.losses[0]}`,
    );
    assert.ok(
      Math.abs(r.metrics.grad_norm - ref.grad_norms[0]) < 1e-4 * ref.grad_norms[0],
      `grad norm ${r.metrics.grad_norm} vs torch ${ref.grad_norms[0]}`,
    );
    const final = readTensors(out);
    const nw = trainer.getWeights();
    for (const s of paramSpecs(c)) {
      const w0 = w.get(s.name)!,
        a = nw.get(s.name)!,
        t = final.get(s.name)!.data as Float32Array;
      const da = a.map((v, i) => v - w0[i]),
        dt = t.map((v, i) => v - w0[i]);
      assert.ok(relErr(da, dt) < 5e-3, `${s.name}: update differs from torch's by ${relErr(da, dt)} (relative)`);
    }
  },
);

test('checkpoint directory round trip keeps the VLM config and visual.* weights', async () => {
  const c = vlm({ rope: '1d' });
  const { w, dir } = await model('ckpt', c, 9);
  const j = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
  assert.equal(j.image_token_id, IMG);
  assert.equal((j.vision_config as Record<string, unknown>).rope, '1d');
  const ck = await loadCheckpoint(dir, { optimizer: false });
  assert.deepEqual(ck.config, c);
  for (const s of paramSpecs(c)) assert.deepEqual(ck.weights.get(s.name), w.get(s.name), s.name);
  assert.ok([...ck.weights.keys()].includes('visual.blocks.1.mlp.fc2.weight'));
});
