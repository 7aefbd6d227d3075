/**
 * Vision-language policy (lib/model/vision.ts): config round trip and refusals, the placeholder
 * expansion and patch layout, a float64 finite-difference check of the training graph through the
 * vision tower (every visual.* parameter, 2-D and 1-D RoPE, merge 2 and 1, two images of different
 * sizes plus a row without), images changing a row's log-probs and only that row's, sampler and
 * scorer agreeing on behaviour log-probs, and a frozen tower getting no update.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  fromHfConfig,
  modelConfig,
  toHfConfig,
  type ModelConfigInput,
  type VisionConfigInput,
} from '../../../lib/model/config.ts';
import { initWeights } from '../../../lib/model/init.ts';
import { lossConfig } from '../../../lib/model/loss.ts';
import { paramSpecs, visionParamSpecs } from '../../../lib/model/params.ts';
import { Sampler } from '../../../lib/model/sample.ts';
import { Scorer } from '../../../lib/model/score.ts';
import { ValueScorer } from '../../../lib/model/value.ts';
import { buildGenerateModel } from '../../../lib/model/decode-graph.ts';
import onnxProto from 'onnx-proto';
import { buildTrainGraph } from '../../../lib/model/train-graph.ts';
import { Trainer } from '../../../lib/model/train.ts';
import {
  expandImagePads,
  IMAGE_MEAN,
  IMAGE_STD,
  imageTokenCount,
  patchify,
  visionFeeds,
  type ImagePixels,
} from '../../../lib/model/vision.ts';
import { createSession, tensor } from '../../../lib/onnx/runtime.ts';
import { randn } from '../onnx/gradcheck.ts';

const IMG = 30,
  VS = 31,
  VE = 32;

function vlm(vision: Partial<VisionConfigInput> = {}, over: Partial<ModelConfigInput> = {}) {
  return modelConfig({
    hiddenSize: 16,
    intermediateSize: 24,
    numHiddenLayers: 1,
    numAttentionHeads: 2,
    numKeyValueHeads: 1,
    vocabSize: 40,
    maxPositionEmbeddings: 64,
    bosTokenId: 1,
    eosTokenId: 2,
    padTokenId: 0,
    modelType: 'qwen2',
    attentionBias: true,
    vision: {
      depth: 2,
      hiddenSize: 8,
      intermediateSize: 12,
      numHeads: 2,
      outHiddenSize: 16,
      patchSize: 2,
      imageTokenId: IMG,
      visionStartTokenId: VS,
      visionEndTokenId: VE,
      ...vision,
    },
    ...over,
  });
}

/** A w×h RGB image with pixel values from `seed`. */
function image(w: number, h: number, seed: number): ImagePixels {
  return {
    width: w,
    height: h,
    data: Uint8Array.from({ length: w * h * 3 }, (_, i) => (i * 37 + seed * 101 + ((i * seed) % 13)) % 256),
  };
}

describe('vision config', () => {
  it('round-trips through config.json and refuses what it does not compute', () => {
    const c = vlm({ rope: '1d', spatialMergeSize: 1 });
    const j = toHfConfig(c);
    assert.equal(j.image_token_id, IMG);
    assert.equal((j.vision_config as Record<string, unknown>).spatial_merge_size, 1);
    assert.deepEqual(fromHfConfig(j), c);
    assert.throws(
      () => fromHfConfig({ ...j, vision_config: { ...(j.vision_config as object), window_size: 112 } }),
      /vision_config window_size=112 is not supported/,
    );
    assert.throws(
      () => fromHfConfig({ ...j, vision_config: { ...(j.vision_config as object), hidden_act: 'silu' } }),
      /vision_config hidden_act="silu" is not supported/,
    );
    assert.throws(
      () => fromHfConfig({ ...j, model_type: 'qwen2_vl' }),
      /model_type qwen2_vl needs rope_scaling.mrope_section \[t, h, w\], got undefined/,
    );
    assert.throws(() => vlm({ outHiddenSize: 8 }), /vision.outHiddenSize 8 must equal the decoder hiddenSize 16/);
    assert.throws(() => vlm({ numHeads: 4 }), /vision head dim 2 must be a multiple of 4/);
    assert.throws(() => vlm({ imageTokenId: 50 }), /vision.imageTokenId 50 is outside the vocabulary/);
    const names = visionParamSpecs(c).map((s) => s.name);
    assert.ok(
      names.includes('visual.patch_embed.proj.weight') &&
        names.includes('visual.blocks.1.attn.qkv.bias') &&
        names.includes('visual.merger.mlp.2.weight'),
    );
    assert.deepEqual(paramSpecs(c).find((s) => s.name === 'visual.patch_embed.proj.weight')!.shape, [8, 3, 2, 2, 2]);
    const w = initWeights(c, 1);
    assert.ok(
      w.get('visual.blocks.0.norm1.weight')!.every((v) => v === 1) &&
        w.get('visual.merger.ln_q.weight')!.every((v) => v === 1),
    );
    assert.ok(w.get('visual.blocks.0.attn.qkv.bias')!.every((v) => v === 0));
    // visionStd scales the tower's draws only (same streams): the decoder's weights stay as they were
    const wide = initWeights(c, 1, { visionStd: 0.3 });
    for (const [name, a] of w) {
      const b = wide.get(name)!;
      if (!name.startsWith('visual.') || /norm\d?\.weight$|ln_q\.weight$|\.bias$/.test(name))
        assert.deepEqual(b, a, name);
      else
        b.forEach((v, i) =>
          assert.ok(
            Math.abs(v - 15 * a[i]!) <= 1e-6 * Math.abs(v) + 1e-7,
            `${name}[${i}]: 0.3 / 0.02 = 15 × the default draw`,
          ),
        );
    }
  });

  it('expands one <|image_pad|> per image to its merged patch count', () => {
    const c = vlm();
    const a = image(4, 4, 1),
      b = image(8, 4, 2); // 2×2 → 1 token; 2×4 patches → 2 tokens
    assert.equal(imageTokenCount(c.vision!, a), 1);
    assert.equal(imageTokenCount(c.vision!, b), 2);
    assert.deepEqual(expandImagePads(c, [1, VS, IMG, VE, 5, VS, IMG, VE], [a, b]), [
      1,
      VS,
      IMG,
      VE,
      5,
      VS,
      IMG,
      IMG,
      VE,
    ]);
    assert.throws(() => expandImagePads(c, [1, VS, IMG, VE], [a, b]), /2 images but 1 <\|image_pad\|>/);
    assert.throws(
      () => expandImagePads(c, [1, IMG], [image(6, 4, 1)]),
      /multiples of patchSize × spatialMergeSize = 4/,
    );
    assert.throws(
      () => visionFeeds(c, [1, IMG, IMG, 5], 1, 4, [[a]]),
      /row 0 has more <\|image_pad\|> tokens than its 1 image/,
    );
  });

  it("lays patches out as Qwen2-VL's processor: merge windows, channel-major, normalised", () => {
    const c = vlm();
    const img = image(8, 4, 3);
    const { patches, pos, count } = patchify(c.vision!, img);
    assert.equal(count, 8);
    // merge window 0 holds patches (0,0) (0,1) (1,0) (1,1); window 1 starts at (0,2)
    assert.deepEqual(Array.from(pos.subarray(0, 10)), [0, 0, 0, 1, 1, 0, 1, 1, 0, 2]);
    const C = 3 * 2 * 2;
    assert.equal(patches.length, 8 * C, 'one frame per patch (the temporal repeat is folded into the kernel)');
    // row 5 = window 1, patch (0, 3); value at channel 2, y 1, x 0 = pixel (row 1, col 6)
    const px = img.data[(1 * 8 + 6) * 3 + 2];
    assert.ok(Math.abs(patches[5 * C + (2 * 2 + 1) * 2 + 0] - (px / 255 - IMAGE_MEAN[2]) / IMAGE_STD[2]) < 1e-6);
  });
});

/** Directional derivative of the SFT loss vs central differences, for every vision parameter (float64). */
async function fdCheck(vision: Partial<VisionConfigInput>): Promise<void> {
  const c = vlm(vision);
  const loss = lossConfig({ type: 'sft' });
  const optim = { betas: [0.9, 0.999] as [number, number], eps: 1e-8, weightDecay: 0, maxGradNorm: 1 };
  const ev = buildTrainGraph({ model: c, loss, optim, mode: 'eval', float: 'float64' });
  const gr = buildTrainGraph({ model: c, loss, optim, mode: 'grad', float: 'float64' });
  const opts = { threads: 1, graphOptimizationLevel: 'basic' as const };
  const se = await createSession(ev.builder.toBytes(), opts),
    sg = await createSession(gr.builder.toBytes(), opts);
  // row 0: two images of different sizes (padding patches in the smaller); row 1: none
  const imgs = [image(4, 4, 5), image(8, 4, 6)];
  const row0 = expandImagePads(c, [1, VS, IMG, VE, VS, IMG, VE, 7, 8, 9], imgs);
  const T = row0.length,
    B = 2,
    n = B * T;
  const ids = [...row0, ...Array.from({ length: T }, (_, t) => 3 + ((t * 5) % 20))];
  const vf = visionFeeds(c, ids, B, T, [imgs, undefined]);
  const mask = Float64Array.from({ length: n }, (_, i) => (i % T >= 3 && i % T < T - 1 ? 1 : 0));
  const msum = mask.reduce((a, v) => a + v, 0);
  const batch: Record<string, ArrayLike<number>> = {
    input_ids: ids,
    position_ids: Array.from({ length: n }, (_, i) => i % T),
    attention_mask: new Float64Array(n).fill(1),
    // targets below the vision tokens: those carry the −1e9 logit bias (never sampled), whose log-prob would swamp the loss
    targets: Array.from({ length: n }, (_, i) => (i * 11 + 4) % IMG),
    loss_mask: mask,
    agg_weights: mask.map((m) => m / msum),
  };
  const w = initWeights(c, 4, { std: 0.3 });
  const specs = paramSpecs(c);
  for (const s of specs)
    if (/norm\d?\.weight$|ln_q\.weight$|\.bias$/.test(s.name))
      w.set(
        s.name,
        Float32Array.from(randn(s.shape[0], s.name.length), (v) => (s.name.endsWith('.bias') ? 0.3 * v : 1 + 0.2 * v)),
      );
  const feeds = (sess: { inputNames: readonly string[] }, over?: { name: string; data: Float64Array }) => {
    const f: Record<string, ReturnType<typeof tensor>> = {};
    for (const name of sess.inputNames) {
      const spec = specs.find((s) => s.name === name);
      if (spec)
        f[name] = tensor('float64', over?.name === name ? over.data : Float64Array.from(w.get(name)!), spec.shape);
      else if (vf[name])
        f[name] =
          vf[name].type === 'float32'
            ? tensor('float64', Float64Array.from(vf[name].data as Float32Array), vf[name].dims as number[])
            : vf[name];
      else {
        const isInt = name === 'input_ids' || name === 'position_ids' || name === 'targets';
        f[name] = tensor(
          isInt ? 'int64' : 'float64',
          isInt ? Array.from(batch[name]) : Float64Array.from(batch[name]),
          [B, T],
        );
      }
    }
    return f;
  };
  const li = ev.metricNames.indexOf('loss');
  const lossAt = async (over?: { name: string; data: Float64Array }) =>
    ((await se.run(feeds(se, over))).metrics.data as Float64Array)[li];
  const g = await sg.run(feeds(sg));
  assert.ok(Number.isFinite(await lossAt()));
  for (const s of specs) {
    if (!s.name.startsWith('visual.') && s.name !== 'model.embed_tokens.weight') continue;
    const x0 = Float64Array.from(w.get(s.name)!);
    const u = randn(x0.length, s.name.length * 31 + x0.length);
    const grad = g[`grad.${s.name}`].data as Float64Array;
    let analytic = 0;
    for (let i = 0; i < x0.length; i++) analytic += grad[i] * u[i];
    assert.ok(analytic !== 0, `${s.name}: gradient is zero`);
    const h = 1e-5;
    const fd =
      ((await lossAt({ name: s.name, data: x0.map((v, i) => v + h * u[i]) })) -
        (await lossAt({ name: s.name, data: x0.map((v, i) => v - h * u[i]) }))) /
      (2 * h);
    assert.ok(
      Math.abs(fd - analytic) <= 1e-8 + 1e-5 * Math.abs(fd),
      `${s.name}: directional derivative autodiff ${analytic} vs finite difference ${fd}`,
    );
  }
}

describe('vision tower gradients (float64 finite differences)', () => {
  it('2-D RoPE, 2×2 merge', async () => {
    await fdCheck({});
  });
  it('1-D RoPE, no merge, one frame per patch', async () => {
    await fdCheck({ rope: '1d', spatialMergeSize: 1, temporalPatchSize: 1, depth: 1 });
  });
});

describe('images in scoring, sampling and training', () => {
  const c = vlm();
  const w = initWeights(c, 2, { std: 0.3 });
  const a = image(8, 4, 1),
    b = image(8, 4, 2);
  const prompt = expandImagePads(c, [1, VS, IMG, VE, 5, 6], [a]);

  it("a row's log-probs follow its own image only; a row without images scores as alone", async () => {
    const sc = new Scorer(c, { threads: 1 });
    const text = { prompt: [1, 5, 6], response: [7, 8] };
    const [ra, rb, rt] = await sc.score(w, [
      { prompt, response: [7, 8, 9], images: [a] },
      { prompt, response: [7, 8, 9], images: [b] },
      text,
    ]);
    const [ra2] = await sc.score(w, [{ prompt, response: [7, 8, 9], images: [a] }]);
    const [rt2] = await sc.score(w, [text]);
    assert.ok(
      ra.logprobs.some((v, i) => Math.abs(v - rb.logprobs[i]) > 1e-4),
      'changing the image changes the log-probs',
    );
    for (let i = 0; i < 3; i++)
      assert.ok(Math.abs(ra.logprobs[i] - ra2.logprobs[i]) < 1e-5, 'a row does not depend on its batch');
    for (let i = 0; i < 2; i++)
      assert.ok(Math.abs(rt.logprobs[i] - rt2.logprobs[i]) < 1e-5, 'a text row in a mixed batch scores as alone');
    await assert.rejects(sc.score(w, [{ prompt, response: [7], images: [a, b] }]), /2 image\(s\) give 4/);
    const text1 = modelConfig({ ...c, vision: undefined });
    await assert.rejects(
      new Scorer(text1).score(initWeights(text1, 1), [{ prompt, response: [7], images: [a] }]),
      /text-only/,
    );
  });

  it("a value model with a vision tower: a row's values follow its image", async () => {
    const vc = modelConfig({ ...c, head: 'value', tieWordEmbeddings: false });
    const vw = initWeights(vc, 6, { std: 0.3 });
    const vs = new ValueScorer(vc, { threads: 1 });
    const [va, vb, vt] = await vs.values(vw, [
      { prompt, response: [7, 8], images: [a] },
      { prompt, response: [7, 8], images: [b] },
      { prompt: [1, 5], response: [7, 8] },
    ]);
    const [vt2] = await vs.values(vw, [{ prompt: [1, 5], response: [7, 8] }]);
    assert.ok(
      va.some((v, i) => Math.abs(v - vb[i]) > 1e-4),
      'changing the image changes the values',
    );
    for (let i = 0; i < 2; i++) assert.ok(Math.abs(vt[i] - vt2[i]) < 1e-5);
  });

  it('sampler behaviour log-probs match the scorer with images (loop and step decoding); vision tokens are never sampled', async () => {
    for (const decode of ['loop', 'step'] as const) {
      const sm = new Sampler(c, { threads: 1, decode });
      const gens = await sm.generate(
        w,
        [
          { id: 'x', prompt, images: [a] },
          { id: 'y', prompt, images: [b] },
          { id: 'z', prompt: [1, 5] },
        ],
        { maxNewTokens: 6, eosTokenIds: [], temperature: 1.5 },
      );
      const sc = new Scorer(c, { threads: 1 });
      const scores = await sc.score(
        w,
        gens.map((g, i) => ({
          prompt: i === 2 ? [1, 5] : prompt,
          response: g.tokens,
          images: i === 2 ? undefined : [[a], [b]][i],
        })),
        { temperature: 1.5 },
      );
      gens.forEach((g, i) => {
        for (let t = 0; t < g.tokens.length; t++) {
          assert.ok(![IMG, VS, VE].includes(g.tokens[t]), 'a vision token was sampled');
          assert.ok(
            Math.abs(g.logprobs[t] - scores[i].logprobs[t]) < 1e-4,
            `row ${i} token ${t}: sampler ${g.logprobs[t]} vs scorer ${scores[i].logprobs[t]}`,
          );
        }
      });
    }
  });

  it('the generation graph runs the tower in the prefill only, never in the decode loop', () => {
    const m = onnxProto.onnx.ModelProto.decode(buildGenerateModel(c, { truncation: false }));
    const outer = m.graph!.node!;
    assert.ok(
      outer.some((n) => n.name!.startsWith('visual/')),
      'the prefill has the tower',
    );
    const loop = outer.find((n) => n.opType === 'Loop')!;
    const body = loop.attribute!.find((a) => a.name === 'body')!.g!;
    assert.ok(body.node!.length > 0);
    assert.ok(
      !body.node!.some(
        (n) => n.name!.startsWith('visual/') || n.input!.some((i) => i.startsWith('visual.') || i === 'pixel_patches'),
      ),
      'the decode step does not touch the tower',
    );
  });

  /** Two SFT rows: the image prompt with a 3-token answer, and a text row of 6 tokens with the last 3 trained. */
  const sftRows = () => {
    const T = prompt.length + 3;
    const tokens = Int32Array.from([...prompt, 7, 8, 9, 1, 5, 6, 7, 8, 9, ...new Array(T - 6).fill(0)]);
    const responseMask = new Float32Array(2 * T);
    for (let t = prompt.length; t < T; t++) responseMask[t] = 1;
    responseMask[T + 3] = responseMask[T + 4] = responseMask[T + 5] = 1;
    const attentionMask = Float32Array.from({ length: 2 * T }, (_, i) => (i >= T + 6 ? 0 : 1));
    return { T, tokens, responseMask, attentionMask };
  };

  it('training updates the tower unless freezeVisionTower', async () => {
    const { T, tokens, responseMask, attentionMask } = sftRows();
    for (const packOutputs of [false, true]) {
      for (const freeze of [false, true]) {
        const tr = new Trainer({
          model: c,
          loss: { type: 'sft' },
          weights: w,
          threads: 1,
          freezeVisionTower: freeze,
          packOutputs,
          optim: { weightDecay: 0.1 },
        });
        await tr.step({ batchSize: 2, seqLen: T, tokens, responseMask, attentionMask, images: [[a], undefined] }, 1e-2);
        const nw = tr.getWeights();
        const st = tr.getOptimizerState();
        for (const s of paramSpecs(c)) {
          const changed = nw.get(s.name)!.some((v, i) => v !== w.get(s.name)![i]);
          if (s.name.startsWith('visual.')) {
            assert.equal(changed, !freeze, `${s.name} (packed ${packOutputs}, frozen ${freeze})`);
            if (freeze)
              assert.ok(
                st.expAvg.get(s.name)!.every((v) => v === 0),
                `${s.name}: frozen moments stay zero`,
              );
          } else if (s.name === 'model.embed_tokens.weight') assert.ok(changed);
        }
      }
    }
  });

  it('optim.visionLrScale = k moves the tower k times as far (AdamW step and decay at lr·k), the decoder as at k = 1', async () => {
    const { T, tokens, responseMask, attentionMask } = sftRows();
    for (const packOutputs of [false, true]) {
      const moved = async (k: number | undefined) => {
        const tr = new Trainer({
          model: c,
          loss: { type: 'sft' },
          weights: w,
          threads: 1,
          packOutputs,
          optim: { weightDecay: 0.1, ...(k === undefined ? {} : { visionLrScale: k }) },
        });
        await tr.step({ batchSize: 2, seqLen: T, tokens, responseMask, attentionMask, images: [[a], undefined] }, 1e-2);
        const nw = tr.getWeights();
        return new Map(paramSpecs(c).map((s) => [s.name, nw.get(s.name)!.map((v, i) => v - w.get(s.name)![i])]));
      };
      const d1 = await moved(undefined),
        d4 = await moved(4),
        same = await moved(1);
      let vision = 0;
      for (const s of paramSpecs(c)) {
        const a1 = d1.get(s.name)!,
          a4 = d4.get(s.name)!;
        assert.deepEqual(same.get(s.name), a1, `${s.name}: visionLrScale 1 is the default`);
        if (!s.name.startsWith('visual.')) {
          assert.deepEqual(a4, a1, `${s.name} (packed ${packOutputs}): the decoder's update does not change`);
          continue;
        }
        for (let i = 0; i < a1.length; i++) {
          if (a1[i] === 0) {
            assert.equal(a4[i], 0);
            continue;
          }
          // the first AdamW step: Δ = −lr·(m̂/(√v̂+ε) + λ·w), linear in lr
          assert.ok(
            Math.abs(a4[i] - 4 * a1[i]) <= 1e-4 * Math.abs(a1[i]) + 3e-7,
            `${s.name}[${i}] (packed ${packOutputs}): ${a4[i]} vs 4 × ${a1[i]}`,
          );
          vision++;
        }
      }
      assert.ok(vision > 100, 'the tower was updated');
    }
    assert.throws(
      () => new Trainer({ model: c, loss: { type: 'sft' }, weights: w, optim: { visionLrScale: 0 } }),
      /visionLrScale must be > 0, got 0/,
    );
  });

  it('learns to answer from the picture: two prompts identical but for their image, told apart after training', async () => {
    const red: ImagePixels = {
      width: 4,
      height: 4,
      data: Uint8Array.from({ length: 48 }, (_, i) => (i % 3 === 0 ? 230 : 20)),
    };
    const blue: ImagePixels = {
      width: 4,
      height: 4,
      data: Uint8Array.from({ length: 48 }, (_, i) => (i % 3 === 2 ? 230 : 20)),
    };
    const p0 = expandImagePads(c, [1, VS, IMG, VE, 5], [red]);
    const T = p0.length + 1;
    const tokens = Int32Array.from([...p0, 10, ...p0, 11]); // red → 10, blue → 11
    const responseMask = Float32Array.from({ length: 2 * T }, (_, i) => (i % T === T - 1 ? 1 : 0));
    const tr = new Trainer({ model: c, loss: { type: 'sft' }, seed: 3, threads: 1, optim: { weightDecay: 0 } });
    const margin = async () => {
      const sc = new Scorer(c, { threads: 1 });
      const [r10, r11, b10, b11] = await sc.score(
        tr.getWeights(),
        [
          [red, 10],
          [red, 11],
          [blue, 10],
          [blue, 11],
        ].map(([im, t]) => ({ prompt: p0, response: [t as number], images: [im as ImagePixels] })),
      );
      return Math.min(r10.logprobs[0] - r11.logprobs[0], b11.logprobs[0] - b10.logprobs[0]);
    };
    assert.ok(Math.abs(await margin()) < 0.5, 'untrained: no preference');
    for (let k = 0; k < 40; k++)
      await tr.step({ batchSize: 2, seqLen: T, tokens, responseMask, images: [[red], [blue]] }, 1e-2);
    assert.ok((await margin()) > 2, "each image's answer is > e² times likelier than the other");
  });
});
