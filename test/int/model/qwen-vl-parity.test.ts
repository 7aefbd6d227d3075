/**
 * Qwen2.5-VL and Qwen2-VL directories (test/support/qwen-vl-dir.ts: HF layout, bf16 shards, real
 * Qwen tokenizer) against the independent PyTorch reference (test/torch/qwen_vl_ref.py, from the
 * transformers definitions): preprocessed pixels, vision features, per-token log-probs of prompts
 * with images (M-RoPE positions, window attention), gradients of every weight through the tower
 * and the decoder, and greedy continuations from an image prompt. Skips only without PyTorch.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { GraphBuilder } from '../../../lib/onnx/builder.ts';
import { createSession } from '../../../lib/onnx/runtime.ts';
import { loadCheckpoint } from '../../../lib/model/checkpoint.ts';
import type { ModelConfig } from '../../../lib/model/config.ts';
import { paramSpecs, visionParamSpecs, type Weights } from '../../../lib/model/params.ts';
import { Sampler } from '../../../lib/model/sample.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { Trainer, type TrainBatch } from '../../../lib/model/train.ts';
import { expandImagePads, patchify, visionFeeds, visionTower, type ImagePixels } from '../../../lib/model/vision.ts';
import type { ParamVars } from '../../../lib/model/llama.ts';
import { Rng } from '../../../lib/util/rng.ts';
import { f32, i64, readTensors, runTorch, tempDir, torchPython, writeTensors } from '../../../devkit/torch-ref.ts';
import type { StTensor } from '../../../lib/model/safetensors.ts';
import { QWEN_VL_TOKENS, writeQwenVlDir } from '../../../devkit/qwen-vl-dir.ts';

const torch = torchPython();
const skip = torch.python ? false : torch.reason;
const cache = new SessionCache();
const { imagePad: IMG, visionStart: VS, visionEnd: VE } = QWEN_VL_TOKENS;
const SUPPRESS: number[] = [IMG, VS, VE];

let tmp: { dir: string; cleanup: () => void };
before(() => {
  tmp = tempDir('rlstream-qwenvl-');
});
after(() => tmp?.cleanup());

function image(w: number, h: number, seed: number): ImagePixels {
  const rng = Rng.fromSeed(`qimg:${seed}`);
  return { width: w, height: h, data: Uint8Array.from({ length: w * h * 3 }, () => Math.floor(rng.next() * 256)) };
}

/** Rows: two images (24×16: windows of 2×2 and 1×2 merged tokens; 8×8); none; one (16×24). Right-padded. */
function batchOf(c: ModelConfig): { batch: TrainBatch; torchIn: Record<string, StTensor>; images: ImagePixels[] } {
  const a = image(16, 24, 1),
    b = image(8, 8, 2),
    d = image(24, 16, 3);
  const rows = [
    {
      ids: expandImagePads(c, [151644, 872, 198, VS, IMG, VE, 3838, VS, IMG, VE, 374, 419, 30, 151645], [a, b]),
      images: [a, b],
    },
    { ids: [151644, 872, 198, 9707, 1879, 0, 151645], images: [] },
    { ids: expandImagePads(c, [151644, 872, VS, IMG, VE, 22, 23, 24, 25, 26, 27], [d]), images: [d] },
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
      resp[k * T + t] = t >= 2 && !SUPPRESS.includes(v) ? 1 : 0;
    }),
  );
  const lossMask = new Float32Array(B * (T - 1));
  for (let k = 0; k < B; k++) for (let t = 1; t < T; t++) lossMask[k * (T - 1) + t - 1] = resp[k * T + t];
  const images = rows.flatMap((r) => r.images);
  const torchIn: Record<string, StTensor> = {
    input_ids: i64(tokens, [B, T]),
    attention_mask: i64(attn, [B, T]),
    loss_mask: f32(lossMask, [B, T - 1]),
  };
  images.forEach((im, i) => (torchIn[`image.${i}`] = { dtype: 'U8', shape: [im.height, im.width, 3], data: im.data }));
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
    images,
  };
}

/** The vision tower alone on the images: merged tokens [Σ tokens, D] in order. */
async function towerFeatures(c: ModelConfig, w: Weights, images: ImagePixels[]): Promise<Float32Array> {
  const b = new GraphBuilder({ name: 'tower' });
  const p: ParamVars = new Map();
  for (const s of visionParamSpecs(c)) p.set(s.name, b.initializer(s.name, w.get(s.name)!, s.shape, 'float32'));
  b.output(visionTower(b, c, p), 'features');
  const sess = await createSession(b.toBytes(), { threads: 1 });
  const out: number[] = [];
  for (const im of images) {
    const n = patchify(c.vision!, im).count / 4;
    const f = visionFeeds(c, new Array(n).fill(IMG), 1, n, [[im]]);
    const feeds: Record<string, unknown> = {};
    for (const n of sess.inputNames) feeds[n] = f[n];
    const r = await sess.run(feeds as never);
    out.push(...(r.features.data as Float32Array).slice(0, n * c.hiddenSize));
  }
  return Float32Array.from(out);
}

function maxAbs(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

for (const modelType of ['qwen2_5_vl', 'qwen2_vl'] as const) {
  test(
    `${modelType}: pixels, vision features, log-probs, gradients and greedy continuation match torch`,
    { skip },
    async () => {
      const dir = join(tmp.dir, modelType);
      const written = writeQwenVlDir(dir, { modelType, seed: 3 });
      const ck = await loadCheckpoint(dir, { optimizer: false });
      const c = ck.config;
      assert.equal(c.modelType, modelType);
      assert.deepEqual(c.mropeSection, [2, 3, 3]);
      for (const s of paramSpecs(c)) assert.deepEqual(ck.weights.get(s.name), written.weights.get(s.name), s.name);
      const { batch, torchIn, images } = batchOf(c);
      // greedy: row 0's prompt up to its last image block and one text token
      const P = 1 + Array.from(batch.tokens.slice(0, batch.seqLen)).lastIndexOf(VE) + 1;
      const prompt = Array.from(batch.tokens.slice(0, P));
      torchIn.greedy_prompt = i64(prompt, [1, P]);
      torchIn.greedy_images = i64([0, 1], [2]);
      const inp = join(dir, 'in.safetensors'),
        out = join(dir, 'out.safetensors');
      writeTensors(inp, torchIn);
      await runTorch('qwen_vl.py', [
        '--model',
        dir,
        '--inputs',
        inp,
        '--out',
        out,
        '--suppress',
        SUPPRESS.join(','),
        '--grads',
        '--greedy',
        '8',
      ]);
      const ref = readTensors(out);

      // pixels: torch's [P, 3·tp·ps²] (channel, frame, y, x); ours one frame [P, 3·ps²]
      const v = c.vision!;
      const pix = ref.get('pixel_values')!.data as Float32Array;
      const C1 = 3 * v.patchSize ** 2,
        pp = v.patchSize ** 2;
      let row = 0,
        dPix = 0;
      for (const im of images) {
        const { patches, count } = patchify(v, im);
        for (let r = 0; r < count; r++, row++)
          for (let ch = 0; ch < 3; ch++)
            for (let t = 0; t < v.temporalPatchSize; t++)
              for (let q = 0; q < pp; q++)
                dPix = Math.max(
                  dPix,
                  Math.abs(
                    patches[r * C1 + ch * pp + q] -
                      pix[row * C1 * v.temporalPatchSize + (ch * v.temporalPatchSize + t) * pp + q],
                  ),
                );
      }
      assert.equal(row * C1 * v.temporalPatchSize, pix.length, 'every patch compared');
      assert.ok(dPix < 1e-5, `pixels differ by ${dPix}`);

      const feats = await towerFeatures(c, ck.weights, images);
      const refFeats = ref.get('features')!.data as Float32Array;
      assert.equal(feats.length, refFeats.length);
      assert.ok(maxAbs(feats, refFeats) < 1e-4, `vision features differ by ${maxAbs(feats, refFeats)}`);

      const trainer = new Trainer({ model: c, loss: { type: 'sft' }, weights: ck.weights, threads: 1, cache });
      const { perToken } = await trainer.evaluate(batch);
      const lp = ref.get('logprobs')!.data as Float32Array;
      const B = batch.batchSize,
        T = batch.seqLen;
      let n = 0,
        dLp = 0;
      for (let r = 0; r < B; r++)
        for (let t = 1; t < T; t++) {
          if (!batch.responseMask![r * T + t]) continue;
          dLp = Math.max(dLp, Math.abs(perToken[r * T + t] - lp[r * (T - 1) + t - 1]));
          n++;
        }
      assert.equal(n, 17, 'every response position compared');
      assert.ok(dLp < 1e-4, `log-probs differ by ${dLp}`);

      const { grads } = await trainer.computeGradients(batch);
      for (const s of paramSpecs(c)) {
        const g = grads.get(s.name)!,
          t = ref.get(`grad.${s.name}`)!.data as Float32Array;
        let scale = 0;
        for (const x of t) scale = Math.max(scale, Math.abs(x));
        assert.ok(scale > 0, `${s.name}: torch gradient is zero`);
        assert.ok(
          maxAbs(g, t) <= 1e-4 * Math.max(1, scale),
          `${s.name}: gradient differs by ${maxAbs(g, t)} (max |g| ${scale})`,
        );
      }

      const [gen] = await new Sampler(c, { threads: 1 }).generate(
        ck.weights,
        [{ id: 'g', prompt, images: [images[0], images[1]] }],
        { maxNewTokens: 8, seed: 0, temperature: 0, topP: 1, topK: 0, eosTokenIds: [] },
      );
      assert.deepEqual(Array.from(gen.tokens), Array.from(ref.get('greedy')!.data as BigInt64Array, Number));
    },
  );
}
