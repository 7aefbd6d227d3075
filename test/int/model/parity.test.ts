/**
 * ORT vs the PyTorch reference (test/torch/llama_ref.py) on the same safetensors weights:
 * forward log-probs/entropy/values, sampled tokens, training gradients (PPO and cross-entropy)
 * and three AdamW steps; one LoRA AdamW step (adapters trained, base frozen). Skips only when PyTorch is not installed.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import {
  initWeights,
  modelConfig,
  type ModelConfig,
  type ModelConfigInput,
  type Weights,
} from '../../../lib/model/index.ts';
import { loadCheckpoint, saveCheckpoint } from '../../../lib/model/checkpoint.ts';
import { stopTokenIds } from '../../../lib/model/config.ts';
import { paramSpecs } from '../../../lib/model/params.ts';
import { initLora, loraConfig, loraSpecs } from '../../../lib/model/lora.ts';
import { Sampler, sequenceUniforms } from '../../../lib/model/sample.ts';
import { Scorer } from '../../../lib/model/score.ts';
import { ValueScorer } from '../../../lib/model/value.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { Trainer, type TrainBatch } from '../../../lib/model/train.ts';
import { queryBlocksFor } from '../../../lib/model/llama.ts';
import { Rng } from '../../../lib/util/rng.ts';
import { f32, i64, readTensors, runTorch, tempDir, torchPython, writeTensors } from '../../../devkit/torch-ref.ts';
import { TINY_GQA_BIAS } from '../../support/tiny-models.ts';

const torch = torchPython();
const skip = torch.python ? false : torch.reason;
const cache = new SessionCache();

// Qwen2-like (the shared tiny GQA shape with q/k/v biases), tied embeddings; and a Llama-like untied one.
const qwenLike: ModelConfigInput = {
  ...TINY_GQA_BIAS,
  modelType: 'qwen2',
  tieWordEmbeddings: true,
  ropeTheta: 1e6,
  rmsNormEps: 1e-5,
};
const llamaLike: ModelConfigInput = {
  ...qwenLike,
  modelType: 'llama',
  attentionBias: false,
  tieWordEmbeddings: false,
  numKeyValueHeads: 4,
  ropeTheta: 10000,
  rmsNormEps: 1e-6,
};

let tmp: { dir: string; cleanup: () => void };
before(() => {
  tmp = tempDir();
});
after(() => tmp?.cleanup());

/**
 * Random weights with non-trivial norms and biases, saved as an HF checkpoint directory (stored as
 * `dtype`; `w` is then what that file holds, read back). `std` defaults to ≈ 1.13 / √hidden, the
 * scale the 32-wide models use (0.2), so wider models keep activations of the same size.
 */
async function model(
  name: string,
  input: ModelConfigInput,
  seed: number,
  opts: { dtype?: 'float32' | 'bfloat16'; std?: number } = {},
): Promise<{ c: ModelConfig; w: Weights; dir: string }> {
  let c = modelConfig(input);
  let w = initWeights(c, seed, { std: opts.std ?? 0.2 * Math.sqrt(32 / c.hiddenSize) });
  const rng = Rng.fromSeed(`parity:${seed}`);
  for (const s of paramSpecs(c)) {
    if (s.name.endsWith('norm.weight') || s.name.endsWith('.bias')) {
      const a = w.get(s.name)!;
      for (let i = 0; i < a.length; i++) a[i] = (s.name.endsWith('.bias') ? 0 : 1) + 0.2 * (rng.next() - 0.5);
    }
  }
  const dir = join(tmp.dir, name);
  await saveCheckpoint(dir, c, w, { dtype: opts.dtype ?? 'float32' });
  if (opts.dtype && opts.dtype !== 'float32')
    ({ config: c, weights: w } = await loadCheckpoint(dir, { optimizer: false }));
  return { c, w, dir };
}

const drv = (dir: string) => [
  '--config',
  join(dir, 'config.json'),
  '--weights',
  join(dir, 'model.safetensors'),
  '--threads',
  '1',
];

function maxAbs(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

/** ‖a − b‖ / ‖b‖ */
function relErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let d = 0,
    n = 0;
  for (let i = 0; i < a.length; i++) {
    d += (a[i] - b[i]) ** 2;
    n += b[i] ** 2;
  }
  return Math.sqrt(d) / Math.max(Math.sqrt(n), 1e-30);
}

const prompts = [
  [1, 5, 6, 7, 8],
  [1, 9],
  [1, 11, 12, 13, 14, 15, 16, 17],
  [1, 20, 21],
];
const responses = [
  [3, 4, 5, 6, 7, 8, 9],
  [10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
  [22, 23],
  [24, 25, 26, 27, 28],
];

test('forward: scorer log-probs and entropy match torch (GQA + bias + tied, and untied MHA)', { skip }, async () => {
  for (const [name, cfgIn] of [
    ['qwen', qwenLike],
    ['llama', llamaLike],
  ] as const) {
    const { c, w, dir } = await model(name, cfgIn, 1);
    const scorer = new Scorer(c, { threads: 1, cache });
    for (const temperature of [1, 0.7]) {
      const ort = await scorer.score(
        w,
        prompts.map((p, i) => ({ prompt: p, response: responses[i] })),
        { temperature },
      );
      // torch: the same rows right-padded, with an attention mask
      const T = Math.max(...prompts.map((p, i) => p.length + responses[i].length));
      const ids = new Array(prompts.length * T).fill(0),
        mask = new Array(prompts.length * T).fill(0);
      prompts.forEach((p, i) =>
        [...p, ...responses[i]].forEach((t, j) => {
          ids[i * T + j] = t;
          mask[i * T + j] = 1;
        }),
      );
      const inp = join(dir, 'fwd-in.safetensors'),
        out = join(dir, 'fwd-out.safetensors');
      writeTensors(inp, { input_ids: i64(ids, [prompts.length, T]), attention_mask: i64(mask, [prompts.length, T]) });
      await runTorch('forward.py', [...drv(dir), '--inputs', inp, '--out', out, '--temperature', String(temperature)]);
      const ref = readTensors(out);
      const lp = ref.get('logprobs')!.data as Float32Array,
        ent = ref.get('entropy')!.data as Float32Array;
      prompts.forEach((p, i) => {
        const at = (j: number) => i * (T - 1) + p.length - 1 + j;
        const rl = responses[i].map((_, j) => lp[at(j)]),
          re = responses[i].map((_, j) => ent[at(j)]);
        assert.ok(
          maxAbs(ort[i].logprobs, rl) < 2e-5,
          `${name} T=${temperature} row ${i} logprobs: ${maxAbs(ort[i].logprobs, rl)}`,
        );
        assert.ok(
          maxAbs(ort[i].entropy!, re) < 2e-5,
          `${name} T=${temperature} row ${i} entropy: ${maxAbs(ort[i].entropy!, re)}`,
        );
      });
    }
  }
});

test('forward: value model values match torch', { skip }, async () => {
  const { c, w, dir } = await model('value', { ...llamaLike, head: 'value' }, 2);
  const vals = await new ValueScorer(c, { threads: 1, cache }).values(
    w,
    prompts.map((p, i) => ({ prompt: p, response: responses[i] })),
  );
  const T = Math.max(...prompts.map((p, i) => p.length + responses[i].length));
  const ids = new Array(prompts.length * T).fill(0),
    mask = new Array(prompts.length * T).fill(0);
  prompts.forEach((p, i) =>
    [...p, ...responses[i]].forEach((t, j) => {
      ids[i * T + j] = t;
      mask[i * T + j] = 1;
    }),
  );
  const inp = join(dir, 'v-in.safetensors'),
    out = join(dir, 'v-out.safetensors');
  writeTensors(inp, { input_ids: i64(ids, [prompts.length, T]), attention_mask: i64(mask, [prompts.length, T]) });
  await runTorch('forward.py', [...drv(dir), '--inputs', inp, '--out', out, '--value-head']);
  const v = readTensors(out).get('values')!.data as Float32Array;
  prompts.forEach((p, i) => {
    const rv = responses[i].map((_, j) => v[i * T + p.length - 1 + j]);
    assert.ok(maxAbs(vals[i], rv) < 2e-5, `row ${i}: ${maxAbs(vals[i], rv)}`);
  });
});

test('generation: sampled tokens and behaviour log-probs match torch KV-cache decoding', { skip }, async () => {
  const { c, w, dir } = await model('gen', qwenLike, 3);
  // both decode paths: the generation graph's in-graph loop and the step graph over preallocated caches
  const samplers = (['loop', 'step'] as const).map((decode) => new Sampler(c, { threads: 1, cache, decode }));
  const N = 12,
    seed = 17;
  const reqs = prompts.map((p, i) => ({ id: `g${i}`, prompt: p }));
  const P = Math.max(...prompts.map((p) => p.length));
  const ids = new Array(prompts.length * P).fill(c.padTokenId),
    mask = new Array(prompts.length * P).fill(0);
  prompts.forEach((p, i) =>
    p.forEach((t, j) => {
      ids[i * P + P - p.length + j] = t;
      mask[i * P + P - p.length + j] = 1;
    }),
  );
  const u = new Float32Array(prompts.length * N);
  reqs.forEach((r, i) => u.set(sequenceUniforms(seed, r.id, N), i * N));
  const inp = join(dir, 'gen-in.safetensors');
  writeTensors(inp, {
    prompt_ids: i64(ids, [prompts.length, P]),
    prompt_mask: i64(mask, [prompts.length, P]),
    uniforms: f32(u, [prompts.length, N]),
    eos_ids: i64([c.eosTokenId], [1]),
  });
  for (const s of [{ temperature: 0 }, { temperature: 1 }, { temperature: 0.8, topK: 6, topP: 0.9 }]) {
    const out = join(dir, 'gen-out.safetensors');
    await runTorch('generate.py', [
      ...drv(dir),
      '--inputs',
      inp,
      '--out',
      out,
      '--temperature',
      String(s.temperature),
      '--top-k',
      String(s.topK ?? 0),
      '--top-p',
      String(s.topP ?? 1),
    ]);
    const ref = readTensors(out);
    const rt = ref.get('tokens')!.data as BigInt64Array,
      rl = ref.get('logprobs')!.data as Float32Array,
      rlen = ref.get('lengths')!.data as BigInt64Array;
    for (const sampler of samplers)
      (await sampler.generate(w, reqs, { maxNewTokens: N, seed, ...s })).forEach((g, i) => {
        const len = Number(rlen[i]);
        assert.deepEqual(
          Array.from(g.tokens),
          Array.from(rt.subarray(i * N, i * N + len), Number),
          `${JSON.stringify(s)} row ${i}`,
        );
        assert.ok(maxAbs(g.logprobs, rl.subarray(i * N, i * N + len)) < 5e-5, `${JSON.stringify(s)} row ${i} logprobs`);
        assert.equal(g.finishReason, len < N || g.tokens[len - 1] === c.eosTokenId ? 'eos' : 'length');
      });
  }
});

test(
  'the fair decode anchor (bench_decode_fair.py: one prefill per prompt, preallocated cache, GQA by reshape) samples what llama_ref.generate samples',
  { skip },
  async () => {
    const { dir } = await model('fair-decode', qwenLike, 23);
    const r = await runTorch('bench_decode_fair.py', [
      ...drv(dir),
      '--prompts',
      '3',
      '--n',
      '4',
      '--prompt-len',
      '7',
      '--new',
      '9',
      '--warmup',
      '0',
      '--iters',
      '1',
      '--check',
    ]);
    assert.equal(r.checked, true);
  },
);

/** A PPO batch in token positions: row 0 left-padded, row 2 right-padded; T ≥ 14 stretches the layout. */
function ppoBatch(
  c: ModelConfig,
  seed: number,
  T = 14,
): { batch: TrainBatch; torchIn: Record<string, ReturnType<typeof f32>> } {
  const B = 4,
    rng = Rng.fromSeed(`ppo:${seed}`),
    k = Math.floor(T / 14);
  const tokens = new Int32Array(B * T),
    attn = new Float32Array(B * T),
    resp = new Float32Array(B * T);
  const layout = [
    { pad: 3, prompt: 4, right: 0 },
    { pad: 0, prompt: 5, right: 0 },
    { pad: 0, prompt: 3, right: 4 },
    { pad: 0, prompt: 6, right: 0 },
  ].map((l) => ({ pad: l.pad * k, prompt: l.prompt * k, right: l.right * k }));
  layout.forEach((l, r) => {
    for (let t = 0; t < T; t++) {
      const real = t >= l.pad && t < T - l.right;
      tokens[r * T + t] = real ? 1 + rng.int(c.vocabSize - 1) : c.padTokenId;
      attn[r * T + t] = real ? 1 : 0;
      resp[r * T + t] = real && t >= l.pad + l.prompt ? 1 : 0;
    }
  });
  const normal = () => Math.sqrt(-2 * Math.log(1 - rng.next())) * Math.cos(2 * Math.PI * rng.next());
  const adv = Float32Array.from({ length: B * T }, () => normal());
  // old log-probs ≈ current ones (≈ −log V) with noise, so some ratios fall outside the clip range
  const old = Float32Array.from({ length: B * T }, () => -Math.log(c.vocabSize) + 0.4 * normal());
  const batch: TrainBatch = {
    batchSize: B,
    seqLen: T,
    tokens,
    attentionMask: attn,
    responseMask: resp,
    advantages: adv,
    oldLogprobs: old,
  };
  // torch drivers take next-token positions [B, T−1]: position t scores token t + 1
  const shift = (a: Float32Array) =>
    Float32Array.from({ length: B * (T - 1) }, (_, k) => a[Math.floor(k / (T - 1)) * T + (k % (T - 1)) + 1]);
  return {
    batch,
    torchIn: {
      input_ids: i64(tokens, [B, T]),
      attention_mask: i64(attn, [B, T]),
      loss_mask: f32(shift(resp), [B, T - 1]),
      advantages: f32(shift(adv), [B, T - 1]),
      old_logprobs: f32(shift(old), [B, T - 1]),
    },
  };
}

test('training forward: trainer.evaluate log-probs match torch on left- and right-padded rows', { skip }, async () => {
  const { c, w, dir } = await model('evalfwd', qwenLike, 4);
  const { batch, torchIn } = ppoBatch(c, 1);
  const trainer = new Trainer({ model: c, loss: { type: 'policy' }, weights: w, threads: 1, cache });
  const { perToken } = await trainer.evaluate(batch);
  const inp = join(dir, 'e-in.safetensors'),
    out = join(dir, 'e-out.safetensors');
  writeTensors(inp, { input_ids: torchIn.input_ids, attention_mask: torchIn.attention_mask });
  await runTorch('forward.py', [...drv(dir), '--inputs', inp, '--out', out]);
  const lp = readTensors(out).get('logprobs')!.data as Float32Array;
  const { batchSize: B, seqLen: T } = batch;
  for (let r = 0; r < B; r++)
    for (let t = 1; t < T; t++) {
      if (!batch.attentionMask![r * T + t]) continue;
      if (t > 0 && !batch.attentionMask![r * T + t - 1]) continue; // first real token has no prediction
      assert.ok(
        Math.abs(perToken[r * T + t] - lp[r * (T - 1) + t - 1]) < 2e-5,
        `row ${r} pos ${t}: ${perToken[r * T + t]} vs ${lp[r * (T - 1) + t - 1]}`,
      );
    }
});

test(
  'gradients: PPO and cross-entropy training-graph gradients match torch within 1e-4 relative',
  { skip },
  async () => {
    const { c, w, dir } = await model('grad', qwenLike, 5);
    const { batch, torchIn } = ppoBatch(c, 2);
    const inp = join(dir, 'g-in.safetensors');
    writeTensors(inp, torchIn);
    for (const loss of ['ppo', 'ce'] as const) {
      const trainer = new Trainer({
        model: c,
        loss: loss === 'ppo' ? { type: 'policy' } : { type: 'sft' },
        weights: w,
        threads: 1,
        cache,
      });
      const { grads, metrics } = await trainer.computeGradients(batch);
      const out = join(dir, `g-${loss}.safetensors`);
      const r = await runTorch('grads.py', [...drv(dir), '--inputs', inp, '--out', out, '--loss', loss]);
      const ref = readTensors(out);
      assert.ok(
        Math.abs(metrics.loss - r.loss) < 1e-5 * Math.max(1, Math.abs(r.loss)),
        `${loss} loss ${metrics.loss} vs torch ${r.loss}`,
      );
      for (const s of paramSpecs(c)) {
        const g = grads.get(s.name)!,
          t = ref.get(`grad.${s.name}`)!.data as Float32Array;
        assert.equal(g.length, t.length);
        assert.ok(relErr(g, t) < 1e-4, `${loss} grad ${s.name}: relative error ${relErr(g, t)}`);
      }
    }
  },
);

test(
  'causal attention by query blocks (rows of 300 tokens: 4 blocks): PPO gradients and scorer log-probs match torch',
  { skip },
  async () => {
    const { c, w, dir } = await model('qblocks', { ...qwenLike, maxPositionEmbeddings: 512 }, 7);
    const T = 300;
    assert.equal(queryBlocksFor(T), 4, 'this length runs in query blocks');
    const { batch, torchIn } = ppoBatch(c, 4, T);
    const inp = join(dir, 'q-in.safetensors'),
      out = join(dir, 'q-grad.safetensors');
    writeTensors(inp, torchIn);
    const { grads, metrics } = await new Trainer({
      model: c,
      loss: { type: 'policy' },
      weights: w,
      threads: 1,
      cache,
    }).computeGradients(batch);
    const r = await runTorch('grads.py', [...drv(dir), '--inputs', inp, '--out', out, '--loss', 'ppo']);
    assert.ok(
      Math.abs(metrics.loss - r.loss) < 1e-5 * Math.max(1, Math.abs(r.loss)),
      `loss ${metrics.loss} vs torch ${r.loss}`,
    );
    const ref = readTensors(out);
    for (const s of paramSpecs(c))
      assert.ok(relErr(grads.get(s.name)!, ref.get(`grad.${s.name}`)!.data as Float32Array) < 1e-4, `grad ${s.name}`);
    // the scorer (right-padded rows, one block count per length bucket) against torch's forward
    const ps = [Array.from({ length: 120 }, (_, i) => 1 + ((i * 7) % 39)), [1, 5, 9]],
      rs = [
        Array.from({ length: 180 }, (_, i) => 1 + ((i * 11) % 39)),
        Array.from({ length: 290 }, (_, i) => 1 + ((i * 5) % 39)),
      ];
    const scores = await new Scorer(c, { threads: 1, cache }).score(
      w,
      ps.map((p, i) => ({ prompt: p, response: rs[i] })),
    );
    const rp = rightPadded(c, ps, rs);
    const fin = join(dir, 'q-fin.safetensors'),
      fout = join(dir, 'q-fout.safetensors');
    writeTensors(fin, { input_ids: i64(rp.ids, [ps.length, rp.T]), attention_mask: i64(rp.mask, [ps.length, rp.T]) });
    await runTorch('forward.py', [...drv(dir), '--inputs', fin, '--out', fout]);
    const lp = readTensors(fout).get('logprobs')!.data as Float32Array;
    ps.forEach((p, i) =>
      rs[i].forEach((_, j) => {
        const want = lp[i * (rp.T - 1) + p.length - 1 + j];
        assert.ok(
          Math.abs(scores[i].logprobs[j] - want) < 2e-5,
          `row ${i} response token ${j}: ${scores[i].logprobs[j]} vs torch ${want}`,
        );
      }),
    );
  },
);

test("AdamW: three clipped steps give torch's losses to 5 significant digits and its weights", { skip }, async () => {
  const { c, w, dir } = await model('adam', qwenLike, 6);
  const { batch, torchIn } = ppoBatch(c, 3);
  const inp = join(dir, 'a-in.safetensors'),
    out = join(dir, 'a-out.safetensors');
  writeTensors(inp, torchIn);
  const optim = { betas: [0.9, 0.95] as [number, number], eps: 1e-8, weightDecay: 0.05, maxGradNorm: 0.05 };
  const lr = 3e-3;
  const trainer = new Trainer({ model: c, loss: { type: 'policy' }, weights: w, threads: 1, optim, cache });
  const losses: number[] = [],
    norms: number[] = [];
  for (let k = 0; k < 3; k++) {
    const r = await trainer.step(batch, lr);
    losses.push(r.metrics.loss);
    norms.push(r.metrics.grad_norm);
  }
  const ref = await runTorch('adamw.py', [
    ...drv(dir),
    '--inputs',
    inp,
    '--out',
    out,
    '--loss',
    'ppo',
    '--steps',
    '3',
    '--lr',
    String(lr),
    '--beta1',
    '0.9',
    '--beta2',
    '0.95',
    '--eps',
    '1e-8',
    '--weight-decay',
    '0.05',
    '--max-grad-norm',
    '0.05',
  ]);
  assert.ok(ref.grad_norms[0] > 0.05, 'clipping is exercised');
  assert.ok(Math.abs(ref.losses[2] - ref.losses[0]) > 1e-4, 'the loss moves');
  for (let k = 0; k < 3; k++) {
    assert.equal(
      losses[k].toPrecision(5),
      ref.losses[k].toPrecision(5),
      `step ${k} loss ${losses[k]} vs ${ref.losses[k]}`,
    );
    assert.ok(
      Math.abs(norms[k] - ref.grad_norms[k]) < 1e-4 * ref.grad_norms[k],
      `step ${k} grad norm ${norms[k]} vs ${ref.grad_norms[k]}`,
    );
  }
  const final = readTensors(out);
  const nw = trainer.getWeights();
  // compare the 3-step updates Δw (most tensors agree to ~1e-5 relative). Adam divides by √v, so
  // elements with gradients far below their tensor's norm (k_proj biases: only RoPE's
  // position dependence gives them a gradient) carry their larger element-wise float error into
  // a full-size step; those tensors agree to ~2e-3.
  for (const s of paramSpecs(c)) {
    const w0 = w.get(s.name)!,
      a = nw.get(s.name)!,
      t = final.get(s.name)!.data as Float32Array;
    const da = a.map((v, i) => v - w0[i]),
      dt = t.map((v, i) => v - w0[i]);
    assert.ok(relErr(da, dt) < 5e-3, `${s.name}: 3-step update differs from torch's by ${relErr(da, dt)} (relative)`);
  }
});

// ── the architectures by model_type at the real shapes' widths (1–2 layers, a small vocabulary) ──
// SmolLM2-135M: hidden 576, 9 heads, 3 KV heads, ffn 1536, tied; Qwen2.5-0.5B: hidden 896, 14
// heads, 2 KV heads, ffn 4864, tied, q/k/v bias. Qwen3 with head_dim 128 ≠ hidden / heads and
// q/k norms; Mistral untied; rope_scaling llama3 and linear.
const smolWidth = { hiddenSize: 576, numAttentionHeads: 9, numKeyValueHeads: 3, intermediateSize: 1536 };
const qwen25Width = { hiddenSize: 896, numAttentionHeads: 14, numKeyValueHeads: 2, intermediateSize: 4864 };
const specials = { vocabSize: 64, maxPositionEmbeddings: 64, bosTokenId: 1, eosTokenId: 2, padTokenId: 0 };
const realWidth: Record<string, ModelConfigInput> = {
  'smollm2 (llama, llama3 rope scaling)': {
    ...smolWidth,
    ...specials,
    modelType: 'llama',
    numHiddenLayers: 2,
    tieWordEmbeddings: true,
    ropeTheta: 100000,
    rmsNormEps: 1e-5,
    ropeScaling: { type: 'llama3', factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 64 },
  }, // all three bands: wavelength < 16 kept, 16–64 interpolated, > 64 scaled
  'qwen2.5 (q/k/v bias)': {
    ...qwen25Width,
    ...specials,
    modelType: 'qwen2',
    numHiddenLayers: 1,
    attentionBias: true,
    tieWordEmbeddings: true,
    ropeTheta: 1e6,
    rmsNormEps: 1e-6,
  },
  'qwen3 (q/k norm, head_dim 128)': {
    ...smolWidth,
    ...specials,
    modelType: 'qwen3',
    headDim: 128,
    numHiddenLayers: 2,
    tieWordEmbeddings: true,
    ropeTheta: 1e6,
    rmsNormEps: 1e-6,
  },
  'mistral (linear rope scaling, untied)': {
    ...smolWidth,
    ...specials,
    modelType: 'mistral',
    numHiddenLayers: 2,
    tieWordEmbeddings: false,
    ropeTheta: 1e6,
    rmsNormEps: 1e-5,
    ropeScaling: { type: 'linear', factor: 4 },
  },
};
const rwPrompts = prompts.map((p) => p.map((t) => t + 30));
const rwResponses = responses.map((r) => r.map((t) => t + 30));

function rightPadded(c: ModelConfig, ps: number[][], rs: number[][]): { ids: number[]; mask: number[]; T: number } {
  const T = Math.max(...ps.map((p, i) => p.length + rs[i].length));
  const ids = new Array(ps.length * T).fill(c.padTokenId),
    mask = new Array(ps.length * T).fill(0);
  ps.forEach((p, i) =>
    [...p, ...rs[i]].forEach((t, j) => {
      ids[i * T + j] = t;
      mask[i * T + j] = 1;
    }),
  );
  return { ids, mask, T };
}

for (const [label, input] of Object.entries(realWidth)) {
  for (const dtype of ['float32', 'bfloat16'] as const) {
    test(`real width, ${label}, weights stored ${dtype}: log-probs and entropy match torch`, { skip }, async () => {
      const { c, w, dir } = await model(`rw-${input.modelType}-${dtype}`, input, 11, { dtype });
      const ort = await new Scorer(c, { threads: 1, cache }).score(
        w,
        rwPrompts.map((p, i) => ({ prompt: p, response: rwResponses[i] })),
      );
      const { ids, mask, T } = rightPadded(c, rwPrompts, rwResponses);
      const inp = join(dir, 'fwd-in.safetensors'),
        out = join(dir, 'fwd-out.safetensors');
      writeTensors(inp, {
        input_ids: i64(ids, [rwPrompts.length, T]),
        attention_mask: i64(mask, [rwPrompts.length, T]),
      });
      await runTorch('forward.py', [...drv(dir), '--inputs', inp, '--out', out]);
      const ref = readTensors(out);
      const lp = ref.get('logprobs')!.data as Float32Array,
        ent = ref.get('entropy')!.data as Float32Array;
      rwPrompts.forEach((p, i) => {
        const at = (j: number) => i * (T - 1) + p.length - 1 + j;
        const rl = rwResponses[i].map((_, j) => lp[at(j)]),
          re = rwResponses[i].map((_, j) => ent[at(j)]);
        assert.ok(maxAbs(ort[i].logprobs, rl) < 5e-5, `row ${i} logprobs: ${maxAbs(ort[i].logprobs, rl)}`);
        assert.ok(maxAbs(ort[i].entropy!, re) < 5e-5, `row ${i} entropy: ${maxAbs(ort[i].entropy!, re)}`);
      });
    });
  }

  test(`real width, ${label}: one clipped AdamW step gives torch's loss, grad norm and update`, { skip }, async () => {
    const { c, w, dir } = await model(`rwa-${input.modelType}`, input, 12);
    const { batch, torchIn } = ppoBatch(c, 4);
    const inp = join(dir, 'a-in.safetensors'),
      out = join(dir, 'a-out.safetensors');
    writeTensors(inp, torchIn);
    const optim = { betas: [0.9, 0.95] as [number, number], eps: 1e-8, weightDecay: 0.05, maxGradNorm: 0.05 };
    const lr = 1e-3;
    const trainer = new Trainer({ model: c, loss: { type: 'policy' }, weights: w, threads: 2, optim, cache });
    const r = await trainer.step(batch, lr);
    const ref = await runTorch('adamw.py', [
      ...drv(dir),
      '--inputs',
      inp,
      '--out',
      out,
      '--loss',
      'ppo',
      '--steps',
      '1',
      '--lr',
      String(lr),
      '--beta1',
      '0.9',
      '--beta2',
      '0.95',
      '--eps',
      '1e-8',
      '--weight-decay',
      '0.05',
      '--max-grad-norm',
      '0.05',
    ]);
    // the PPO loss is a mean of ±A·ratio terms that nearly cancel: compare with an absolute floor
    assert.ok(
      Math.abs(r.metrics.loss - ref.losses[0]) < 1e-6 + 1e-5 * Math.abs(ref.losses[0]),
      `loss ${r.metrics.loss} vs ${ref.losses[0]}`,
    );
    assert.ok(
      Math.abs(r.metrics.grad_norm - ref.grad_norms[0]) < 1e-4 * ref.grad_norms[0],
      `grad norm ${r.metrics.grad_norm} vs ${ref.grad_norms[0]}`,
    );
    const final = readTensors(out),
      nw = trainer.getWeights();
    for (const s of paramSpecs(c)) {
      const w0 = w.get(s.name)!,
        a = nw.get(s.name)!,
        t = final.get(s.name)!.data as Float32Array;
      const da = a.map((v, i) => v - w0[i]),
        dt = t.map((v, i) => v - w0[i]);
      assert.ok(relErr(da, dt) < 5e-3, `${s.name}: the update differs from torch's by ${relErr(da, dt)} (relative)`);
    }
  });
}

test(
  'generation at real width: qwen3 (q/k norm in the decode step) and llama3 rope scaling match torch KV-cache decoding',
  { skip },
  async () => {
    for (const key of ['qwen3 (q/k norm, head_dim 128)', 'smollm2 (llama, llama3 rope scaling)']) {
      const input = { ...realWidth[key], eosTokenIds: [2, 40] };
      const { c, w, dir } = await model(`rwg-${input.modelType}`, input, 13);
      const sampler = new Sampler(c, { threads: 1, cache });
      const N = 10,
        seed = 5;
      const reqs = rwPrompts.map((p, i) => ({ id: `g${i}`, prompt: p }));
      const P = Math.max(...rwPrompts.map((p) => p.length));
      const ids = new Array(rwPrompts.length * P).fill(c.padTokenId),
        mask = new Array(rwPrompts.length * P).fill(0);
      rwPrompts.forEach((p, i) =>
        p.forEach((t, j) => {
          ids[i * P + P - p.length + j] = t;
          mask[i * P + P - p.length + j] = 1;
        }),
      );
      const u = new Float32Array(rwPrompts.length * N);
      reqs.forEach((r, i) => u.set(sequenceUniforms(seed, r.id, N), i * N));
      const inp = join(dir, 'gen-in.safetensors'),
        out = join(dir, 'gen-out.safetensors');
      const eos = stopTokenIds(c);
      writeTensors(inp, {
        prompt_ids: i64(ids, [rwPrompts.length, P]),
        prompt_mask: i64(mask, [rwPrompts.length, P]),
        uniforms: f32(u, [rwPrompts.length, N]),
        eos_ids: i64(eos, [eos.length]),
      });
      const gens = await sampler.generate(w, reqs, { maxNewTokens: N, seed, temperature: 1, eosTokenIds: eos });
      await runTorch('generate.py', [...drv(dir), '--inputs', inp, '--out', out, '--temperature', '1']);
      const ref = readTensors(out);
      const rt = ref.get('tokens')!.data as BigInt64Array,
        rl = ref.get('logprobs')!.data as Float32Array,
        rlen = ref.get('lengths')!.data as BigInt64Array;
      gens.forEach((g, i) => {
        const len = Number(rlen[i]);
        assert.deepEqual(Array.from(g.tokens), Array.from(rt.subarray(i * N, i * N + len), Number), `${key} row ${i}`);
        assert.ok(maxAbs(g.logprobs, rl.subarray(i * N, i * N + len)) < 5e-5, `${key} row ${i} logprobs`);
      });
    }
  },
);

test(
  "LoRA: one clipped AdamW step on the adapters (base frozen, B ≠ 0) gives torch's loss, grad norm and adapter update",
  { skip },
  async () => {
    const { c, w, dir } = await model('lora', qwenLike, 8);
    const lora = loraConfig({ rank: 4, alpha: 8, targetModules: 'all-linear' });
    // a trained-looking adapter: B ≠ 0 so A gets a gradient too
    const adapter = initLora(c, lora, 2);
    const rng = Rng.fromSeed('lora-parity');
    for (const [k, a] of adapter)
      if (k.endsWith('lora_B.weight')) for (let i = 0; i < a.length; i++) a[i] = 0.1 * (rng.next() - 0.5);
    const { batch, torchIn } = ppoBatch(c, 5);
    const inp = join(dir, 'l-in.safetensors'),
      ad = join(dir, 'l-adapter.safetensors'),
      out = join(dir, 'l-out.safetensors');
    writeTensors(inp, torchIn);
    writeTensors(
      ad,
      Object.fromEntries(
        [...adapter].map(([k, v]) => [k, f32(v, loraSpecs(c, lora).find((s) => s.name === k)!.shape)]),
      ),
    );
    const optim = { betas: [0.9, 0.95] as [number, number], eps: 1e-8, weightDecay: 0.05, maxGradNorm: 0.05 };
    const lr = 3e-3;
    const trainer = new Trainer({
      model: c,
      loss: { type: 'policy' },
      weights: w,
      lora,
      adapter,
      threads: 1,
      optim,
      cache,
    });
    const r = await trainer.step(batch, lr);
    const ref = await runTorch('adamw.py', [
      ...drv(dir),
      '--inputs',
      inp,
      '--out',
      out,
      '--loss',
      'ppo',
      '--steps',
      '1',
      '--lr',
      String(lr),
      '--beta1',
      '0.9',
      '--beta2',
      '0.95',
      '--eps',
      '1e-8',
      '--weight-decay',
      '0.05',
      '--max-grad-norm',
      '0.05',
      '--adapter',
      ad,
      '--lora-alpha',
      '8',
    ]);
    assert.ok(ref.grad_norms[0] > 0.05, 'clipping is exercised');
    assert.equal(
      r.metrics.loss.toPrecision(5),
      ref.losses[0].toPrecision(5),
      `loss ${r.metrics.loss} vs ${ref.losses[0]}`,
    );
    assert.ok(
      Math.abs(r.metrics.grad_norm - ref.grad_norms[0]) < 1e-4 * ref.grad_norms[0],
      `grad norm ${r.metrics.grad_norm} vs ${ref.grad_norms[0]}`,
    );
    const final = readTensors(out),
      nw = trainer.getWeights();
    assert.equal(final.size, loraSpecs(c, lora).length, 'torch trained the adapters only');
    for (const s of loraSpecs(c, lora)) {
      const w0 = adapter.get(s.name)!,
        a = nw.get(s.name)!,
        t = final.get(s.name)!.data as Float32Array;
      const da = a.map((v, i) => v - w0[i]),
        dt = t.map((v, i) => v - w0[i]);
      assert.ok(relErr(da, dt) < 5e-3, `${s.name}: update differs from torch's by ${relErr(da, dt)} (relative)`);
    }
  },
);
