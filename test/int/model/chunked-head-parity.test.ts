/**
 * The chunked LM head (nn.ts chunkedLmHeadLogprob) against the PyTorch reference, which computes
 * the full [B, T, V] logits and log-softmax with eager autograd (test/torch/llama_ref.py): scorer
 * log-probs and entropies, training gradients (PPO, cross-entropy) and one AdamW step, with the
 * vocabulary cut into several uneven chunks (tied and untied heads). Skips only without PyTorch.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { initWeights, modelConfig, type ModelConfigInput } from '../../../lib/model/index.ts';
import { saveCheckpoint } from '../../../lib/model/checkpoint.ts';
import { paramSpecs } from '../../../lib/model/params.ts';
import { Scorer } from '../../../lib/model/score.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { Trainer, type TrainBatch } from '../../../lib/model/train.ts';
import { vocabChunks } from '../../../lib/onnx/nn.ts';
import { Rng } from '../../../lib/util/rng.ts';
import { f32, i64, readTensors, runTorch, tempDir, torchPython, writeTensors } from '../../../devkit/torch-ref.ts';

const torch = torchPython();
const skip = torch.python ? false : torch.reason;
const cache = new SessionCache();
const CHUNK = 7; // vocabulary 45 → 7 chunks of 6–7 rows

const base: ModelConfigInput = {
  modelType: 'qwen2',
  hiddenSize: 32,
  intermediateSize: 48,
  numHiddenLayers: 2,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  vocabSize: 45,
  maxPositionEmbeddings: 64,
  attentionBias: true,
  tieWordEmbeddings: true,
  ropeTheta: 1e6,
  rmsNormEps: 1e-5,
  bosTokenId: 1,
  eosTokenId: 2,
  padTokenId: 0,
};
const untied: ModelConfigInput = { ...base, modelType: 'llama', attentionBias: false, tieWordEmbeddings: false };

let tmp: { dir: string; cleanup: () => void };
before(() => {
  tmp = tempDir();
});
after(() => tmp?.cleanup());

const relErr = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let d = 0,
    n = 0;
  for (let i = 0; i < a.length; i++) {
    d += (a[i] - b[i]) ** 2;
    n += b[i] ** 2;
  }
  return Math.sqrt(d) / Math.max(Math.sqrt(n), 1e-30);
};
const maxAbs = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
};

async function setup(name: string, input: ModelConfigInput) {
  const c = modelConfig(input);
  const w = initWeights(c, 3, { std: 0.3 });
  const dir = join(tmp.dir, name);
  await saveCheckpoint(dir, c, w);
  return {
    c,
    w,
    dir,
    drv: ['--config', join(dir, 'config.json'), '--weights', join(dir, 'model.safetensors'), '--threads', '1'],
  };
}

test('the head is really cut into several chunks', () => {
  assert.equal(vocabChunks(45, CHUNK).length, 7);
});

test('scorer: chunked log-probs and entropies equal torch full-logits ones', { skip }, async () => {
  for (const [name, cfg] of [
    ['tied', base],
    ['untied', untied],
  ] as const) {
    const { c, w, dir, drv } = await setup(`s-${name}`, cfg);
    const prompts = [
        [1, 5, 6, 7],
        [1, 9],
        [1, 11, 12, 13, 14, 15],
      ],
      responses = [
        [3, 44, 5, 20, 7],
        [40, 41, 42, 43, 12, 13, 14],
        [22, 23],
      ];
    const T = Math.max(...prompts.map((p, i) => p.length + responses[i].length));
    const ids = new Array(prompts.length * T).fill(0),
      mask = new Array(prompts.length * T).fill(0);
    prompts.forEach((p, i) =>
      [...p, ...responses[i]].forEach((t, j) => {
        ids[i * T + j] = t;
        mask[i * T + j] = 1;
      }),
    );
    const inp = join(dir, 'in.safetensors'),
      out = join(dir, 'out.safetensors');
    writeTensors(inp, { input_ids: i64(ids, [prompts.length, T]), attention_mask: i64(mask, [prompts.length, T]) });
    for (const temperature of [1, 0.6]) {
      const got = await new Scorer(c, { threads: 1, cache, headChunk: CHUNK }).score(
        w,
        prompts.map((p, i) => ({ prompt: p, response: responses[i] })),
        { temperature },
      );
      await runTorch('forward.py', [...drv, '--inputs', inp, '--out', out, '--temperature', String(temperature)]);
      const ref = readTensors(out);
      const lp = ref.get('logprobs')!.data as Float32Array,
        ent = ref.get('entropy')!.data as Float32Array;
      prompts.forEach((p, i) => {
        const at = (j: number) => i * (T - 1) + p.length - 1 + j;
        assert.ok(
          maxAbs(
            got[i].logprobs,
            responses[i].map((_, j) => lp[at(j)]),
          ) < 2e-5,
          `${name} T=${temperature} row ${i} log-probs`,
        );
        assert.ok(
          maxAbs(
            got[i].entropy!,
            responses[i].map((_, j) => ent[at(j)]),
          ) < 2e-5,
          `${name} T=${temperature} row ${i} entropy`,
        );
      });
    }
  }
});

function batch(vocab: number): { b: TrainBatch; torchIn: Record<string, ReturnType<typeof f32>> } {
  const B = 3,
    T = 12,
    rng = Rng.fromSeed('chunked-parity');
  const tokens = new Int32Array(B * T),
    attn = new Float32Array(B * T).fill(1),
    resp = new Float32Array(B * T);
  for (let i = 0; i < B * T; i++) {
    tokens[i] = 1 + rng.int(vocab - 1);
    resp[i] = i % T >= 4 ? 1 : 0;
  }
  const adv = Float32Array.from({ length: B * T }, () => rng.next() * 2 - 1);
  const old = Float32Array.from({ length: B * T }, () => -Math.log(vocab) + 0.4 * (rng.next() - 0.5));
  const shift = (a: Float32Array) =>
    Float32Array.from({ length: B * (T - 1) }, (_, k) => a[Math.floor(k / (T - 1)) * T + (k % (T - 1)) + 1]);
  return {
    b: { batchSize: B, seqLen: T, tokens, attentionMask: attn, responseMask: resp, advantages: adv, oldLogprobs: old },
    torchIn: {
      input_ids: i64(tokens, [B, T]),
      attention_mask: i64(attn, [B, T]),
      loss_mask: f32(shift(resp), [B, T - 1]),
      advantages: f32(shift(adv), [B, T - 1]),
      old_logprobs: f32(shift(old), [B, T - 1]),
    },
  };
}

test(
  'trainer: chunked-head gradients (PPO and cross-entropy) equal torch autograd through full logits',
  { skip },
  async () => {
    for (const [name, cfg] of [
      ['tied', base],
      ['untied', untied],
    ] as const) {
      const { c, w, dir, drv } = await setup(`g-${name}`, cfg);
      const { b, torchIn } = batch(c.vocabSize);
      const inp = join(dir, 'g-in.safetensors');
      writeTensors(inp, torchIn);
      for (const loss of ['ppo', 'ce'] as const) {
        const tr = new Trainer({
          model: c,
          loss: loss === 'ppo' ? { type: 'policy' } : { type: 'sft' },
          weights: w,
          threads: 1,
          cache,
          headChunk: CHUNK,
        });
        const { grads, metrics } = await tr.computeGradients(b);
        const out = join(dir, `g-${loss}.safetensors`);
        const r = await runTorch('grads.py', [...drv, '--inputs', inp, '--out', out, '--loss', loss]);
        const ref = readTensors(out);
        assert.ok(
          Math.abs(metrics.loss - r.loss) < 1e-5 * Math.max(1, Math.abs(r.loss)),
          `${name} ${loss} loss ${metrics.loss} vs torch ${r.loss}`,
        );
        for (const s of paramSpecs(c)) {
          const e = relErr(grads.get(s.name)!, ref.get(`grad.${s.name}`)!.data as Float32Array);
          assert.ok(e < 1e-4, `${name} ${loss} grad ${s.name}: relative error ${e}`);
        }
      }
    }
  },
);

test("trainer: one in-place AdamW step with the chunked head gives torch's weights", { skip }, async () => {
  const { c, w, dir, drv } = await setup('adam', base);
  const { b, torchIn } = batch(c.vocabSize);
  const inp = join(dir, 'a-in.safetensors'),
    out = join(dir, 'a-out.safetensors');
  writeTensors(inp, torchIn);
  const optim = { betas: [0.9, 0.95] as [number, number], eps: 1e-8, weightDecay: 0.05, maxGradNorm: 0.5 };
  const tr = new Trainer({
    model: c,
    loss: { type: 'policy' },
    weights: w,
    threads: 1,
    optim,
    cache,
    headChunk: CHUNK,
  });
  const r = await tr.step(b, 1e-3);
  const ref = await runTorch('adamw.py', [
    ...drv,
    '--inputs',
    inp,
    '--out',
    out,
    '--loss',
    'ppo',
    '--steps',
    '1',
    '--lr',
    '1e-3',
    '--beta1',
    '0.9',
    '--beta2',
    '0.95',
    '--eps',
    '1e-8',
    '--weight-decay',
    '0.05',
    '--max-grad-norm',
    '0.5',
  ]);
  assert.ok(
    Math.abs(r.metrics.grad_norm - ref.grad_norms[0]) < 1e-4 * ref.grad_norms[0],
    `grad norm ${r.metrics.grad_norm} vs ${ref.grad_norms[0]}`,
  );
  const fin = readTensors(out);
  const nw = tr.getWeights();
  for (const s of paramSpecs(c)) {
    const w0 = w.get(s.name)!,
      a = nw.get(s.name)!,
      t = fin.get(s.name)!.data as Float32Array;
    // compare the updates Δw; Adam's sign-like first step amplifies the float error of elements whose
    // gradient is far below their tensor's norm (k_proj biases: only RoPE's position dependence gives them one)
    const e = relErr(
      a.map((v, i) => v - w0[i]),
      t.map((v, i) => v - w0[i]),
    );
    assert.ok(e < (s.name.endsWith('k_proj.bias') ? 1e-2 : 1e-3), `${s.name}: update relative error ${e}`);
  }
});
