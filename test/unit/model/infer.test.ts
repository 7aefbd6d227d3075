/**
 * Generation, scoring and values on tiny random models (no PyTorch needed; the torch parity tests
 * are in test/int/model/).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { initWeights, modelConfig } from '../../../lib/model/index.ts';
import {
  planBatches,
  Sampler,
  samplingParams,
  sequenceUniforms,
  STEP_DECODE_MIN_COLUMNS,
  type Generation,
} from '../../../lib/model/sample.ts';
import { Scorer } from '../../../lib/model/score.ts';
import { ValueScorer } from '../../../lib/model/value.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { TINY_GQA_BIAS } from '../../support/tiny-models.ts';

const cfg = modelConfig(TINY_GQA_BIAS);
// std 0.3 gives peaked, position-dependent distributions on a model this small
const W = initWeights(cfg, 7, { std: 0.3 });
const cache = new SessionCache();
// the generation graph's in-graph loop and the step graph over preallocated caches
const samplers = {
  loop: new Sampler(cfg, { threads: 1, cache, decode: 'loop' }),
  step: new Sampler(cfg, { threads: 1, cache, decode: 'step' }),
} as const;
const sampler = samplers.loop;
const scorer = new Scorer(cfg, { threads: 1, cache });

const prompts: Record<string, number[]> = {
  a: [1, 5, 6, 7],
  b: [1, 9, 10, 11, 12, 13, 14, 15, 16],
  c: [1, 20],
  d: [1, 30, 31, 32, 33, 34],
  e: [1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
};
const req = (id: string, key = id) => ({ id, prompt: prompts[key] });
const maxAbs = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
};

test('sequence uniforms: deterministic per (seed, id), in (0, 1), different across ids and seeds', () => {
  const u1 = sequenceUniforms(5, 'p0#1', 64),
    u2 = sequenceUniforms(5, 'p0#1', 64);
  assert.deepEqual(u1, u2);
  for (const v of u1) assert.ok(v > 0 && v < 1);
  assert.notDeepEqual(u1, sequenceUniforms(5, 'p0#2', 64));
  assert.notDeepEqual(u1, sequenceUniforms(6, 'p0#1', 64));
  // a prefix of a longer stream: the cap on new tokens does not change the draws
  assert.deepEqual(sequenceUniforms(5, 'p0#1', 8), u1.subarray(0, 8));
});

test('sampling params are validated with the field named', () => {
  assert.throws(() => samplingParams({ maxNewTokens: 4, topP: 0 }), /topP/);
  assert.throws(() => samplingParams({ maxNewTokens: 0 }), /maxNewTokens/);
  assert.throws(() => samplingParams({ maxNewTokens: 4, temperature: -1 }), /temperature/);
  assert.throws(() => samplingParams({ maxNewTokens: 4, tempreature: 1 } as never), /tempreature/);
  assert.equal(samplingParams({ maxNewTokens: 4 }).topK, 0);
});

test('planBatches respects the row and token caps and keeps the given order', () => {
  const widths = [10, 9, 8, 3, 2, 1];
  assert.deepEqual(planBatches(widths, [0, 1, 2, 3, 4, 5], 4, 1000), [
    [0, 1, 2, 3],
    [4, 5],
  ]);
  assert.deepEqual(planBatches(widths, [0, 1, 2, 3, 4, 5], 10, 25), [[0, 1], [2, 3, 4], [5]]);
  // a single row wider than the budget still gets its own batch
  assert.deepEqual(planBatches([50, 1], [0, 1], 10, 20), [[0], [1]]);
});

for (const decode of ['loop', 'step'] as const) {
  const sampler = samplers[decode];

  test(`a sequence's tokens do not depend on the other prompts in its batch or on the padding (decode: ${decode})`, async () => {
    const params = { maxNewTokens: 12, temperature: 1, seed: 11, eosTokenIds: [] };
    const alone = (await sampler.generate(W, [req('x', 'a')], params))[0];
    const withShort = (await sampler.generate(W, [req('y', 'c'), req('x', 'a')], params))[1];
    const withLong = (
      await sampler.generate(W, [req('z', 'e'), req('w', 'b'), req('x', 'a'), req('v', 'd')], params)
    )[2];
    const tinyBatches = new Sampler(cfg, { threads: 1, cache, maxBatchSize: 1, decode });
    const split = (await tinyBatches.generate(W, [req('z', 'e'), req('x', 'a')], params))[1];
    for (const g of [withShort, withLong, split]) {
      assert.deepEqual(Array.from(g.tokens), Array.from(alone.tokens));
      assert.ok(maxAbs(g.logprobs, alone.logprobs) < 1e-5, `logprobs differ by ${maxAbs(g.logprobs, alone.logprobs)}`);
    }
    // and the id matters: another id with the same prompt draws differently
    const other = (await sampler.generate(W, [req('x2', 'a')], params))[0];
    assert.notDeepEqual(Array.from(other.tokens), Array.from(alone.tokens));
  });

  test(`EOS stops each row at its first stop token; the rest of the stream is unchanged (decode: ${decode})`, async () => {
    const ids = Object.keys(prompts);
    const full = await sampler.generate(
      W,
      ids.map((k) => req(k)),
      { maxNewTokens: 16, seed: 3, eosTokenIds: [] },
    );
    for (const g of full) {
      assert.equal(g.finishReason, 'length');
      assert.equal(g.tokens.length, 16);
    }
    // stop tokens: the 4th token of row a and the 2nd of row b, so several rows stop early
    const stops = [full[0].tokens[3], full[1].tokens[1]];
    const cut = await sampler.generate(
      W,
      ids.map((k) => req(k)),
      { maxNewTokens: 16, seed: 3, eosTokenIds: stops },
    );
    let early = 0;
    cut.forEach((g, i) => {
      const f = Array.from(full[i].tokens);
      const first = f.findIndex((t) => stops.includes(t));
      const len = first < 0 ? 16 : first + 1;
      if (first >= 0) early++;
      assert.equal(g.finishReason, first < 0 ? 'length' : 'eos', `row ${g.id}`);
      assert.deepEqual(Array.from(g.tokens), f.slice(0, len), `row ${g.id}`);
      assert.ok(maxAbs(g.logprobs, full[i].logprobs.subarray(0, len)) < 1e-5);
    });
    assert.ok(early >= 2);
    // the model config's EOS is the default stop token
    const dflt = await sampler.generate(W, [req('a')], { maxNewTokens: 4, seed: 3 });
    const explicit = await sampler.generate(W, [req('a')], { maxNewTokens: 4, seed: 3, eosTokenIds: [cfg.eosTokenId] });
    assert.deepEqual(dflt, explicit);
  });

  test(`generation log-probs equal the scorer's (KV-cached left-padded loop vs right-padded full pass) (decode: ${decode})`, async () => {
    const ids = Object.keys(prompts);
    for (const temperature of [0, 0.7, 1.3]) {
      const gens = await sampler.generate(
        W,
        ids.map((k) => req(k)),
        { maxNewTokens: 10, temperature, seed: 5, eosTokenIds: [] },
      );
      const scores = await scorer.score(
        W,
        ids.map((k, i) => ({ prompt: prompts[k], response: gens[i].tokens })),
        { temperature: temperature || 1 },
      );
      gens.forEach((g, i) =>
        assert.ok(
          maxAbs(g.logprobs, scores[i].logprobs) < 2e-5,
          `T=${temperature} row ${g.id}: ${maxAbs(g.logprobs, scores[i].logprobs)}`,
        ),
      );
      if (temperature === 0) {
        // greedy picks the most likely token: its probability is at least 1/V and ≥ every other's,
        // so exp(logprob) ≥ exp(−entropy)… weaker but checkable: compare with top-k = 1 sampling
        const k1 = await sampler.generate(
          W,
          ids.map((k) => req(k)),
          { maxNewTokens: 10, temperature: 1, topK: 1, seed: 9, eosTokenIds: [] },
        );
        const p0 = await sampler.generate(
          W,
          ids.map((k) => req(k)),
          { maxNewTokens: 10, temperature: 1, topP: 1e-6, seed: 9, eosTokenIds: [] },
        );
        gens.forEach((g, i) => {
          assert.deepEqual(Array.from(k1[i].tokens), Array.from(g.tokens));
          assert.deepEqual(Array.from(p0[i].tokens), Array.from(g.tokens));
        });
      }
    }
  });

  test(`sampling follows the distribution; top-k and top-p restrict it to the top tokens (decode: ${decode})`, async () => {
    const n = 1200;
    const reqs = Array.from({ length: n }, (_, i) => ({ id: `s${i}`, prompt: prompts.b }));
    const one = async (p: object): Promise<Generation[]> =>
      sampler.generate(W, reqs, { maxNewTokens: 1, seed: 1, eosTokenIds: [], ...p });
    const plain = await one({ temperature: 1 });
    const prob = new Map<number, number>();
    const count = new Map<number, number>();
    for (const g of plain) {
      prob.set(g.tokens[0], Math.exp(g.logprobs[0]));
      count.set(g.tokens[0], (count.get(g.tokens[0]) ?? 0) + 1);
    }
    assert.ok(count.size >= 5, `only ${count.size} distinct tokens sampled`);
    for (const [tok, p] of prob) {
      const sd = Math.sqrt((p * (1 - p)) / n);
      assert.ok(
        Math.abs(count.get(tok)! / n - p) < 5 * sd + 1e-3,
        `token ${tok}: frequency ${count.get(tok)! / n} vs p ${p}`,
      );
    }
    const ranked = [...prob].sort((a, b) => b[1] - a[1]).map(([t]) => t);
    const topk = await one({ temperature: 1, topK: 3 });
    for (const g of topk) assert.ok(ranked.slice(0, 3).includes(g.tokens[0]), `top-k 3 sampled ${g.tokens[0]}`);
    assert.equal(new Set(topk.map((g) => g.tokens[0])).size, 3);
    // top-p: the smallest set of top tokens with mass ≥ 0.5
    let mass = 0,
      m = 0;
    while (mass < 0.5) mass += prob.get(ranked[m++])!;
    const topp = await one({ temperature: 1, topP: 0.5 });
    for (const g of topp)
      assert.ok(
        ranked.slice(0, m).includes(g.tokens[0]),
        `top-p 0.5 sampled ${g.tokens[0]} outside the nucleus of ${m}`,
      );
    // behaviour log-prob is the untruncated temperature-scaled one
    for (const g of topk) assert.ok(Math.abs(Math.exp(g.logprobs[0]) - prob.get(g.tokens[0])!) < 1e-5);
  });
}

test("step-graph decoding samples the loop's tokens and log-probs (shared prompts, EOS, top-k/top-p); auto picks it for long rows", async () => {
  const reqs = [...Object.keys(prompts).map((k) => req(k)), ...Array.from({ length: 4 }, (_, i) => req(`b#${i}`, 'b'))];
  for (const p of [
    { temperature: 1, eosTokenIds: [] },
    { temperature: 0.8, topK: 6, topP: 0.9, eosTokenIds: [cfg.eosTokenId, 7] },
    { temperature: 0 },
  ]) {
    const params = { maxNewTokens: 14, seed: 21, ...p };
    const [loop, step] = await Promise.all([
      samplers.loop.generate(W, reqs, params),
      samplers.step.generate(W, reqs, params),
    ]);
    loop.forEach((g, i) => {
      assert.deepEqual(Array.from(step[i].tokens), Array.from(g.tokens), `${JSON.stringify(p)} row ${g.id}`);
      assert.equal(step[i].finishReason, g.finishReason);
      assert.ok(maxAbs(step[i].logprobs, g.logprobs) < 1e-5);
    });
  }
  // 'auto': the loop below STEP_DECODE_MIN_COLUMNS prompt + new tokens, the step graph from there
  const auto = new Sampler(cfg, { threads: 1, cache });
  const used: string[] = [];
  const orig = cache.get.bind(cache);
  cache.get = (key, ...rest) => (used.push(key.split('|')[0]), orig(key, ...rest));
  try {
    await auto.generate(W, [req('a')], { maxNewTokens: 4, seed: 1 });
    assert.deepEqual(used, ['generate']);
    used.length = 0;
    const longCfg = { ...cfg, maxPositionEmbeddings: STEP_DECODE_MIN_COLUMNS };
    await new Sampler(longCfg, { threads: 1, cache }).generate(W, [req('a')], {
      maxNewTokens: STEP_DECODE_MIN_COLUMNS - prompts.a.length,
      seed: 1,
      eosTokenIds: [],
    });
    assert.deepEqual(used, ['prefill', 'step']);
    // on a GPU 'auto' keeps the loop (its caches stay on the device): the session asked for is the
    // generation graph's (stopped there: no GPU is needed to see the choice)
    used.length = 0;
    cache.get = (key) => (used.push(key.split('|')[0]), Promise.reject(new Error('stop')));
    await assert.rejects(
      new Sampler(longCfg, { threads: 1, cache, device: 'webgpu' }).generate(W, [req('a')], {
        maxNewTokens: STEP_DECODE_MIN_COLUMNS - prompts.a.length,
        seed: 1,
        eosTokenIds: [],
      }),
      /stop/,
    );
    assert.deepEqual(used, ['generate']);
  } finally {
    cache.get = orig;
  }
});

test('requests are checked: vocabulary, length, duplicate ids, empty prompt, model head', async () => {
  await assert.rejects(
    sampler.generate(W, [{ id: 'a', prompt: [1, 99] }], { maxNewTokens: 2 }),
    /outside the vocabulary/,
  );
  await assert.rejects(
    sampler.generate(W, [{ id: 'a', prompt: [1, 2] }], { maxNewTokens: 63 }),
    /maxPositionEmbeddings/,
  );
  await assert.rejects(sampler.generate(W, [req('a'), req('a', 'b')], { maxNewTokens: 2 }), /duplicate sequence id a/);
  await assert.rejects(sampler.generate(W, [{ id: 'a', prompt: [] }], { maxNewTokens: 2 }), /empty prompt/);
  await assert.rejects(scorer.score(W, [{ prompt: [1], response: [41] }]), /outside the vocabulary/);
  assert.throws(() => new ValueScorer(cfg), /value model/);
  assert.deepEqual(await sampler.generate(W, [], { maxNewTokens: 2 }), []);
});

test('scores do not depend on bucketing; prefixes score the same (causality); order is kept', async () => {
  const rs = [
    { prompt: prompts.a, response: [5, 6, 7, 8, 9, 10] },
    { prompt: prompts.e, response: [3, 3] },
    { prompt: prompts.c, response: [] },
    { prompt: prompts.b, response: [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22] },
    { prompt: prompts.a, response: [5, 6, 7] },
  ];
  const together = await scorer.score(W, rs);
  const tiny = new Scorer(cfg, { threads: 1, cache, maxBatchTokens: 20 });
  const apart = await tiny.score(W, rs);
  rs.forEach((r, i) => {
    assert.equal(together[i].logprobs.length, r.response.length);
    assert.ok(maxAbs(together[i].logprobs, apart[i].logprobs) < 1e-5);
    assert.ok(maxAbs(together[i].entropy!, apart[i].entropy!) < 1e-5);
    for (const v of together[i].entropy!) assert.ok(v >= 0 && v <= Math.log(cfg.vocabSize) + 1e-5);
    for (const v of together[i].logprobs) assert.ok(v <= 0);
  });
  assert.ok(maxAbs(together[4].logprobs, together[0].logprobs.subarray(0, 3)) < 1e-5);
  const noEnt = await scorer.score(W, rs.slice(0, 1), { entropy: false });
  assert.equal(noEnt[0].entropy, null);
  assert.ok(maxAbs(noEnt[0].logprobs, together[0].logprobs) < 1e-5);
});

test('values: one per response token, causal, independent of batching', async () => {
  const { headDim: _hd, ...rest } = cfg;
  const vcfg = modelConfig({ ...rest, head: 'value' });
  const vw = initWeights(vcfg, 3, { std: 0.3 });
  const vs = new ValueScorer(vcfg, { threads: 1, cache });
  const rs = [
    { prompt: prompts.a, response: [3, 4, 5, 6] },
    { prompt: prompts.b, response: [7] },
    { prompt: prompts.a, response: [3, 4] },
  ];
  const v = await vs.values(vw, rs);
  assert.deepEqual(
    v.map((x) => x.length),
    [4, 1, 2],
  );
  assert.ok(maxAbs(v[2], v[0].subarray(0, 2)) < 1e-5);
  const single = await vs.values(vw, [rs[1]]);
  assert.ok(maxAbs(single[0], v[1]) < 1e-5);
  assert.ok(new Set(Array.from(v[0])).size === 4, 'values vary along the response');
  assert.throws(() => new Scorer(vcfg), /policy/);
});

test('non-finite weights give a clear error instead of garbage tokens', async () => {
  const bad = new Map(W);
  const norm = Float32Array.from(W.get('model.norm.weight')!);
  norm[0] = Number.NaN;
  bad.set('model.norm.weight', norm);
  await assert.rejects(sampler.generate(bad, [req('a')], { maxNewTokens: 3, seed: 1 }), /not finite/);
});
