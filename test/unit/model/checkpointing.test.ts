/**
 * Gradient checkpointing (train-graph.ts gradientCheckpointing, builder.ts checkpoint): the
 * training graph that recomputes each decoder layer in the backward gives the same gradients as
 * the one that keeps the activations, for the llama (GQA), qwen2 (q/k/v biases) and qwen3 (q/k
 * norms) trunks, LoRA adapters and the value head; trainer steps (AdamW) give the same weights,
 * a vision-language model's (ViT blocks checkpointed too) included; onnxruntime's optimizer keeps the recomputation (no CSE back into the forward).
 *
 * "Same" is bit for bit: the recomputation reads x + 0·g₀ = x exactly, so it runs the same
 * kernels on the same bits as the forward, and the backward's accumulation order is unchanged.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import onnxProto from 'onnx-proto';
import { modelConfig, type ModelConfigInput } from '../../../lib/model/config.ts';
import { initWeights } from '../../../lib/model/init.ts';
import { lossConfig, type LossConfigInput } from '../../../lib/model/loss.ts';
import { loraConfig, loraSpecs, type LoraConfig } from '../../../lib/model/lora.ts';
import { paramSpecs } from '../../../lib/model/params.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { createTrainer, type TrainBatch } from '../../../lib/model/train.ts';
import { buildTrainGraph } from '../../../lib/model/train-graph.ts';
import { expandImagePads } from '../../../lib/model/vision.ts';
import { GraphBuilder, GraphError } from '../../../lib/onnx/builder.ts';
import { linear } from '../../../lib/onnx/nn.ts';
import { createSession, tensor } from '../../../lib/onnx/runtime.ts';
import { Rng } from '../../../lib/util/rng.ts';
import { randn } from '../onnx/gradcheck.ts';

const OPTIM = { betas: [0.9, 0.999] as [number, number], eps: 1e-8, weightDecay: 0.01, maxGradNorm: 1 };
const base = {
  hiddenSize: 32,
  intermediateSize: 48,
  numHiddenLayers: 3,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  vocabSize: 19,
  maxPositionEmbeddings: 16,
  bosTokenId: 1,
  eosTokenId: 2,
  padTokenId: 0,
};
const VARIANTS: [string, ModelConfigInput][] = [
  ['llama (GQA)', { ...base, modelType: 'llama' }],
  ['qwen2 (q/k/v biases, tied head)', { ...base, modelType: 'qwen2', attentionBias: true, tieWordEmbeddings: true }],
  ['qwen3 (q/k norms, head width ≠ d / heads)', { ...base, modelType: 'qwen3', headDim: 16 }],
];

/** Every grad.* output of the grad graph, with checkpointing off and on, on one random batch (left padding in row 1). */
async function gradsBoth(
  mc: ModelConfigInput,
  lc: LossConfigInput,
  lora?: LoraConfig,
): Promise<{ off: Map<string, Float32Array>; on: Map<string, Float32Array> }> {
  const model = modelConfig(mc);
  const loss = lossConfig(lc);
  const B = 2,
    T = 7,
    n = B * T;
  const rng = Rng.fromSeed('ckpt-test');
  const attn = Float32Array.from({ length: n }, (_, i) => (i === T ? 0 : 1));
  const pos: number[] = [];
  for (let r = 0; r < B; r++) {
    let c = 0;
    for (let t = 0; t < T; t++) {
      if (attn[r * T + t]) c++;
      pos.push(Math.max(c - 1, 0));
    }
  }
  const mask = Float32Array.from({ length: n }, (_, i) => (i % T >= 2 && i % T < T - 1 ? 1 : 0));
  const msum = mask.reduce((a, b) => a + b, 0);
  const r = randn(6 * n, 5);
  const batch: Record<string, Float32Array | number[]> = {
    input_ids: Array.from({ length: n }, () => rng.int(model.vocabSize)),
    position_ids: pos,
    attention_mask: attn,
    targets: Array.from({ length: n }, () => rng.int(model.vocabSize)),
    loss_mask: mask,
    agg_weights: mask.map((m) => m / msum),
    advantages: Float32Array.from(r.subarray(0, n), (v) => 2 * v),
    old_log_probs: Float32Array.from(r.subarray(n, 2 * n), (v) => -Math.log(model.vocabSize) + 0.3 * v),
    loss_weights: Float32Array.from(r.subarray(2 * n, 3 * n), (v) => 1 + 0.3 * v),
    values: Float32Array.from(r.subarray(3 * n, 4 * n), (v) => 0.05 * v),
    returns: Float32Array.from(r.subarray(4 * n, 5 * n)),
  };
  const w = initWeights(model, 3, { std: 0.3 });
  for (const s of paramSpecs(model))
    if (s.name.endsWith('norm.weight') || s.name.endsWith('.bias'))
      w.set(
        s.name,
        Float32Array.from(randn(s.shape[0], s.name.length), (v) => (s.name.endsWith('.bias') ? 0.3 * v : 1 + 0.2 * v)),
      );
  const all = [...paramSpecs(model), ...(lora ? loraSpecs(model, lora) : [])];
  if (lora)
    for (const s of loraSpecs(model, lora))
      w.set(
        s.name,
        Float32Array.from(randn(s.shape[0] * s.shape[1], s.name.length + 7), (v) => 0.3 * v),
      );
  const out: Map<string, Float32Array>[] = [];
  for (const ckpt of [false, true]) {
    const g = buildTrainGraph({
      model,
      loss,
      optim: OPTIM,
      mode: 'grad',
      lossWeights: loss.type === 'policy',
      gradientCheckpointing: ckpt,
      ...(lora ? { lora } : {}),
    });
    const sess = await createSession(g.builder.toBytes(), { threads: 2 });
    const feeds: Record<string, ReturnType<typeof tensor>> = {};
    for (const name of sess.inputNames) {
      const spec = all.find((s) => s.name === name);
      if (spec) feeds[name] = tensor('float32', w.get(name)!, spec.shape);
      else {
        const isInt = name === 'input_ids' || name === 'position_ids' || name === 'targets';
        feeds[name] = isInt
          ? tensor('int64', batch[name] as number[], [B, T])
          : tensor('float32', batch[name] as Float32Array, [B, T]);
      }
    }
    const res = await sess.run(feeds);
    out.push(
      new Map(
        Object.entries(res)
          .filter(([k]) => k.startsWith('grad.'))
          .map(([k, v]) => [k, Float32Array.from(v.data as Float32Array)]),
      ),
    );
    await sess.release();
  }
  return { off: out[0], on: out[1] };
}

function assertSameGrads(off: Map<string, Float32Array>, on: Map<string, Float32Array>, what: string): void {
  assert.deepEqual([...on.keys()].sort(), [...off.keys()].sort(), `${what}: the same gradient outputs`);
  let nonZero = 0;
  for (const [k, a] of off) {
    const b = on.get(k)!;
    let diff = 0;
    for (let i = 0; i < a.length; i++) if (!Object.is(a[i] + 0, b[i] + 0)) diff++;
    assert.equal(diff, 0, `${what} ${k}: ${diff} of ${a.length} elements differ with checkpointing`);
    if (a.some((v) => v !== 0)) nonZero++;
  }
  assert.ok(nonZero >= off.size - 1, `${what}: ${off.size - nonZero} of ${off.size} gradients are all zero`);
}

describe('gradient checkpointing: the same gradients, bit for bit', () => {
  for (const [name, mc] of VARIANTS) {
    it(`${name}, PPO loss with KL and entropy`, async () => {
      const { off, on } = await gradsBoth(mc, { type: 'policy', useKlLoss: false, entropyCoeff: 0.01 });
      assertSameGrads(off, on, name);
    });
  }
  it("LoRA rank 4 on all linear layers (qwen2): the adapters' gradients", async () => {
    const lora = loraConfig({ rank: 4, alpha: 8, targetModules: 'all-linear' });
    const { off, on } = await gradsBoth(VARIANTS[1][1], { type: 'policy' }, lora);
    assert.equal(off.size, loraSpecs(modelConfig(VARIANTS[1][1]), lora).length);
    assertSameGrads(off, on, 'lora');
  });
  it('value head (critic)', async () => {
    const { off, on } = await gradsBoth({ ...VARIANTS[0][1], head: 'value' }, { type: 'value' });
    assertSameGrads(off, on, 'value');
  });
});

describe('gradient checkpointing in the trainer', () => {
  const model = modelConfig(VARIANTS[1][1]);
  const batch = (): TrainBatch => {
    const rng = Rng.fromSeed('ckpt-step');
    const B = 3,
      T = 9,
      n = B * T;
    return {
      batchSize: B,
      seqLen: T,
      tokens: Int32Array.from({ length: n }, () => 3 + rng.int(model.vocabSize - 3)),
      responseMask: Float32Array.from({ length: n }, (_, i) => (i % T >= 3 ? 1 : 0)),
      advantages: Float32Array.from({ length: n }, () => rng.next() * 2 - 1),
      oldLogprobs: Float32Array.from({ length: n }, () => -2.9 + 0.2 * rng.next()),
    };
  };
  for (const micro of [undefined, 1]) {
    it(`two AdamW steps give the same weights and metrics${micro ? ' (micro-batches of 1 row)' : ''}`, async () => {
      const run = async (ckpt: boolean) => {
        const tr = createTrainer({
          model,
          loss: { type: 'policy' },
          threads: 2,
          seed: 4,
          cache: new SessionCache(),
          gradientCheckpointing: ckpt,
          ...(micro ? { microBatchSize: micro } : {}),
        });
        const m1 = await tr.step(batch(), 1e-3);
        const m2 = await tr.step(batch(), 1e-3);
        return { w: tr.getWeights(), metrics: [m1.metrics, m2.metrics] };
      };
      const off = await run(false),
        on = await run(true);
      assert.deepEqual(on.metrics, off.metrics);
      for (const [k, a] of off.w) assert.deepEqual(on.w.get(k), a, `${k} after two steps`);
    });
  }
});

describe('gradient checkpointing of a vision-language model (ViT blocks and decoder layers)', () => {
  it('two SFT steps with an image give the same weights', async () => {
    const IMG = 30;
    const c = modelConfig({
      hiddenSize: 16,
      intermediateSize: 24,
      numHiddenLayers: 2,
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
        visionStartTokenId: 31,
        visionEndTokenId: 32,
      },
    });
    const img = { width: 4, height: 4, data: Uint8Array.from({ length: 48 }, (_, i) => (i * 37 + 11) % 256) };
    const row = expandImagePads(c, [1, 31, IMG, 32, 7, 8, 9, 10], [img]);
    const T = row.length;
    const tokens = Int32Array.from([...row, ...Array.from({ length: T }, (_, t) => 3 + ((t * 5) % 20))]);
    const responseMask = Float32Array.from({ length: 2 * T }, (_, i) => (i % T >= T - 4 ? 1 : 0));
    const run = async (ckpt: boolean) => {
      const tr = createTrainer({
        model: c,
        loss: { type: 'sft' },
        seed: 2,
        threads: 1,
        cache: new SessionCache(),
        gradientCheckpointing: ckpt,
      });
      for (let k = 0; k < 2; k++)
        await tr.step({ batchSize: 2, seqLen: T, tokens, responseMask, images: [[img], undefined] }, 1e-2);
      return tr.getWeights();
    };
    const off = await run(false),
      on = await run(true);
    assert.ok(
      off
        .get('visual.blocks.0.mlp.fc1.weight')!
        .some((v, i) => v !== initWeights(c, 2).get('visual.blocks.0.mlp.fc1.weight')![i]),
      'the tower is trained',
    );
    for (const [k, a] of off) assert.deepEqual(on.get(k), a, `${k} after two steps`);
  });
});

describe('builder.checkpoint', () => {
  /** y = Σ tanh(tanh(x·W₁ᵀ)·W₂ᵀ) with the two layers checkpointed. */
  const build = (ckpt: boolean) => {
    const b = new GraphBuilder({ name: 'ckpt' });
    const x = b.input('x', 'float32', ['N', 8]);
    const w1 = b.input('w1', 'float32', [8, 8]),
      w2 = b.input('w2', 'float32', [8, 8]);
    const layer = (h: Var0, w: Var0) => b.tanh(linear(b, b.tanh(linear(b, h, w)), w));
    let h = x;
    for (const w of [w1, w2]) h = ckpt ? b.checkpoint([h, w], ([h0, w0]) => [layer(h0, w0)])[0] : layer(h, w);
    const loss = b.reduceSum(h, [0, 1]);
    const [g1, g2] = b.grad(loss, [w1, w2]);
    b.output(loss, 'loss');
    b.output(g1, 'g1');
    b.output(g2, 'g2');
    return b;
  };
  type Var0 = ReturnType<GraphBuilder['input']>;

  it('onnxruntime keeps the recomputation: its optimizer does not merge it back into the forward', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rlstream-ckpt-'));
    try {
      const gemms: number[] = [];
      for (const ckpt of [false, true]) {
        const path = join(dir, `${ckpt}.onnx`);
        await createSession(build(ckpt).toBytes(), { threads: 1, optimizedModelFilePath: path });
        const m = onnxProto.onnx.ModelProto.decode(readFileSync(path));
        gemms.push(
          m.graph!.node!.filter(
            (nd) =>
              nd.opType === 'Gemm' ||
              nd.opType === 'FusedGemm' ||
              nd.opType === 'MatMul' ||
              nd.opType === 'FusedMatMul',
          ).length,
        );
      }
      // forward 4 products, backward 2 per product (the first layer's input gradient is unused), recomputation 4 more
      assert.equal(gemms[1], gemms[0] + 4, `products in the optimized graphs: ${gemms}`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a graph input read inside but not passed in is an error naming it', () => {
    const b = new GraphBuilder({ name: 'bad' });
    const x = b.input('x', 'float32', [2, 4]),
      w = b.input('w', 'float32', [4, 4]);
    assert.throws(
      () => b.checkpoint([x], ([x0]) => [linear(b, x0, w)]),
      (e: Error) => e instanceof GraphError && /reads graph input w that is not among its inputs/.test(e.message),
    );
  });
});
