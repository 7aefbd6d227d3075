/**
 * Continuous batching (lib/inference/batcher.ts over lib/model/stepwise.ts): a request that arrives
 * while others decode joins the running batch at the next decode step, every sequence is the one
 * `Sampler.generate` draws for its (seed, id) alone, tokens reach `onToken` as they are sampled, and
 * the reported top log-probs are those a full forward (the Scorer) recomputes.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { initWeights, modelConfig } from '../../../lib/model/index.ts';
import { Sampler, type SamplingParamsInput } from '../../../lib/model/sample.ts';
import { Scorer } from '../../../lib/model/score.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { StepDecoder, appendRows, emptyState, keepRows } from '../../../lib/model/stepwise.ts';
import { GenerationBatcher, type BatchResult } from '../../../lib/inference/batcher.ts';
import { ConfigError } from '../../../lib/errors.ts';
import { TINY_GQA_BIAS } from '../../support/tiny-models.ts';

const cfg = modelConfig(TINY_GQA_BIAS);
const W = initWeights(cfg, 7, { std: 0.3 });
const cache = new SessionCache();
const policy = { version: 4, weights: W, dir: '/x' };
const decoder = new StepDecoder(cfg, { threads: 1, cache });
const sampler = new Sampler(cfg, { threads: 1, cache });

async function alone(id: string, prompt: number[], p: SamplingParamsInput) {
  const [g] = await sampler.generate(W, [{ id, prompt }], p);
  return g;
}

test('a request arriving mid-decode joins the running batch and every sequence equals its solo generation', async () => {
  const pA: SamplingParamsInput = { maxNewTokens: 12, temperature: 1, seed: 3, eosTokenIds: [] };
  const pB: SamplingParamsInput = { maxNewTokens: 6, temperature: 0.7, topK: 5, topP: 0.9, seed: 5, eosTokenIds: [2] };
  const batcher = new GenerationBatcher(decoder, () => policy, { windowMs: 0 });
  const seen: string[] = [];
  let bDone: Promise<BatchResult> | null = null;
  let aTokensWhenBJoined = -1;
  const a = batcher.submit(
    [
      { id: 'a0', prompt: [1, 5, 6, 7] },
      { id: 'a1', prompt: [1, 5, 6, 7] },
    ],
    pA,
    {
      onToken: (seq, t) => {
        seen.push(`a${seq}:${t.token}`);
        if (seq === 0 && !bDone && seen.filter((s) => s.startsWith('a0')).length === 3)
          bDone = batcher.submit([{ id: 'b0', prompt: [1, 9, 10, 11, 12, 13, 14] }], pB, {
            onToken: () => {
              if (aTokensWhenBJoined < 0) aTokensWhenBJoined = seen.filter((s) => s.startsWith('a0')).length;
            },
          });
      },
    },
  );
  const ra = await a;
  const rb = await bDone!;
  // b's first token came while a was still decoding, one step after it was submitted
  assert.equal(aTokensWhenBJoined, 4);
  assert.equal(ra.version, 4);
  for (const [r, p, prompt] of [
    [ra, pA, [1, 5, 6, 7]],
    [rb, pB, [1, 9, 10, 11, 12, 13, 14]],
  ] as const)
    for (const g of r.generations) {
      const ref = await alone(g.id, [...prompt], p);
      assert.deepEqual(g.tokens, Array.from(ref.tokens), g.id);
      assert.equal(g.finishReason, ref.finishReason);
      g.logprobs.forEach((lp, t) => assert.ok(Math.abs(lp - ref.logprobs[t]) < 1e-4, `${g.id} logprob ${t}`));
    }
  assert.equal(batcher.active + batcher.pending, 0);
});

test('top log-probs are the most likely tokens of the sampled distribution, as the Scorer recomputes them', async () => {
  const T = 0.8;
  const batcher = new GenerationBatcher(decoder, () => policy, { windowMs: 0, stepsPerRun: 3 });
  const prompt = [1, 20, 21];
  const r = await batcher.submit(
    [{ id: 'x', prompt }],
    { maxNewTokens: 5, temperature: T, seed: 1, eosTokenIds: [] },
    {
      topLogprobs: 4,
    },
  );
  const g = r.generations[0];
  assert.equal(g.top.length, g.tokens.length);
  const scorer = new Scorer(cfg, { threads: 1, cache });
  for (let t = 0; t < g.tokens.length; t++) {
    // every candidate token scored as the response's t-th token
    const cands = Array.from({ length: cfg.vocabSize }, (_, v) => ({ prompt, response: [...g.tokens.slice(0, t), v] }));
    const scores = await scorer.score(W, cands, { temperature: T, entropy: false });
    const lp = scores.map((s) => s.logprobs[t]);
    const want = lp
      .map((l, v) => ({ token: v, logprob: l }))
      .sort((x, y) => y.logprob - x.logprob)
      .slice(0, 4);
    assert.deepEqual(
      g.top[t].map((x) => x.token),
      want.map((x) => x.token),
      `step ${t}`,
    );
    g.top[t].forEach((x, k) => assert.ok(Math.abs(x.logprob - want[k].logprob) < 1e-4, `step ${t} rank ${k}`));
    assert.ok(Math.abs(g.logprobs[t] - lp[g.tokens[t]]) < 1e-4);
  }
});

test('bad requests are refused before they join; a newer policy waits for the batch to drain', async () => {
  let cur = policy;
  const batcher = new GenerationBatcher(decoder, () => cur, { windowMs: 0 });
  await assert.rejects(
    batcher.submit([{ id: 'z', prompt: [1, 2] }], { maxNewTokens: 2 }, { topLogprobs: 21 }),
    ConfigError,
  );
  await assert.rejects(batcher.submit([{ id: 'z', prompt: [1, 99] }], { maxNewTokens: 2 }), /outside the vocabulary/);
  await assert.rejects(batcher.submit([{ id: 'z', prompt: [1, 2] }], { maxNewTokens: 63 }), /exceeds the context/);
  let late: Promise<BatchResult> | null = null;
  const first = batcher.submit(
    [{ id: 'p', prompt: [1, 3] }],
    { maxNewTokens: 6, eosTokenIds: [] },
    {
      onToken: () => {
        if (late) return;
        cur = { ...policy, version: 5 };
        late = batcher.submit([{ id: 'q', prompt: [1, 3] }], { maxNewTokens: 2, eosTokenIds: [] });
      },
    },
  );
  assert.equal((await first).version, 4);
  assert.equal((await late!).version, 5);
});

test('appendRows right-aligns rows of different lengths at one column; keepRows fills dropped slots in place', async () => {
  const a = await decoder.prefill(W, [{ prompt: [1, 5] }, { prompt: [1, 5, 6, 7, 8] }]);
  const b = await decoder.prefill(W, [{ prompt: [1, 9, 9] }, { prompt: [1, 9, 9, 9, 9, 9, 9] }]);
  assert.equal(a.S, 5);
  let st = appendRows(cfg, emptyState(cfg), a);
  assert.equal(st.S, 5);
  const buffer = st.keys[0];
  st = appendRows(cfg, st, b); // longer: the running rows shift right by 2
  assert.equal(st.B, 4);
  assert.equal(st.S, 7);
  assert.ok(st.colCap > st.S && st.rowCap >= 4);
  const kv = cfg.numKeyValueHeads,
    hd = cfg.headDim,
    W2 = st.colCap;
  // the last column of every row is its last prompt token's K: row 1's is a's row 1's column 4
  const col = (s: typeof st, row: number, h: number, j: number) =>
    Array.from(s.keys[0].subarray(((row * kv + h) * s.colCap + j) * hd, ((row * kv + h) * s.colCap + j + 1) * hd));
  const preCol = (p: typeof a, row: number, h: number, j: number) =>
    Array.from(p.keys[0].subarray(((row * kv + h) * p.S + j) * hd, ((row * kv + h) * p.S + j + 1) * hd));
  assert.deepEqual(col(st, 1, 1, 6), preCol(a, 1, 1, 4));
  assert.deepEqual(col(st, 2, 0, 6), preCol(b, 0, 0, 6));
  // row 0 (prompt of 2) uses columns 5..6 only
  assert.deepEqual(
    Array.from(st.bias.subarray(0, 7)).map((x) => x === 0),
    [false, false, false, false, false, true, true],
  );
  assert.ok(st.bias.subarray(7, W2).every((x) => x < -1e8));
  const order = keepRows(cfg, st, [1, 3]); // row 3 moves into dropped slot 0
  assert.deepEqual(order, [3, 1]);
  assert.equal(st.B, 2);
  assert.deepEqual(col(st, 0, 1, 3), preCol(b, 1, 1, 3));
  assert.deepEqual(Array.from(st.pos.subarray(0, 2)), [7n, 5n]);
  assert.notEqual(buffer, st.keys[0]); // grown once, then kept in place
});
