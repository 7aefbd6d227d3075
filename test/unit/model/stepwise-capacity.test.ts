import assert from 'node:assert/strict';
import { test } from 'node:test';
import { initWeights, modelConfig } from '../../../lib/model/index.ts';
import { Sampler, sequenceUniforms } from '../../../lib/model/sample.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { appendRows, columnCapacity, reservedState, StepDecoder } from '../../../lib/model/stepwise.ts';
import { TINY_GQA_BIAS } from '../../support/tiny-models.ts';

test('columnCapacity: room for the next column, spare columns within an eighth (≥ 16), multiples of 16', () => {
  for (let S = 0; S <= 4096; S++) {
    const cap = columnCapacity(S);
    assert.ok(cap > S, `S ${S}: capacity ${cap}`);
    assert.equal(cap % 16, 0);
    assert.ok(cap - S - 1 >= Math.max(16, Math.ceil(S / 8)), `S ${S}: spare ${cap - S - 1}`);
    assert.ok(cap - S - 1 < Math.max(16, Math.ceil(S / 8)) + 16, `S ${S}: spare ${cap - S - 1}`);
  }
  assert.equal(columnCapacity(256), 304);
});

test("a reserved state grows its column capacity inside its buffers (no new allocation), attends over at most an eighth more than it holds, and samples the loop's tokens", async () => {
  const c = modelConfig(TINY_GQA_BIAS);
  const W = initWeights(c, 7, { std: 0.3 });
  const cache = new SessionCache();
  const reqs = [
    { id: 'a', prompt: [1, 5, 6, 7] },
    { id: 'b', prompt: [1, 9, 10, 11, 12, 13, 14, 15, 16] },
    { id: 'c', prompt: [1, 20] },
  ];
  const N = 40,
    seed = 3,
    cols = 9 + N;
  const decoder = new StepDecoder(c, { threads: 1, cache });
  let state = reservedState(c, reqs.length, cols);
  const buffers = [state.keys[0], state.values[c.numHiddenLayers - 1], state.bias];
  state = appendRows(c, state, await decoder.prefill(W, reqs));
  assert.ok(state.colCap < cols, `starts below the reserved ${cols} columns (${state.colCap})`);
  // 40 steps in four calls of 10: the capacity after each
  const caps = [state.colCap];
  const tokens: number[][] = reqs.map(() => []);
  const params = reqs.map(() => ({ temperature: 1, topP: 1, topK: 0 }));
  const full = reqs.map((r) => sequenceUniforms(seed, r.id, N));
  for (let k = 0; k < N / 10; k++) {
    const u = new Float32Array(reqs.length * 10);
    full.forEach((f, b) => u.set(f.subarray(k * 10, k * 10 + 10), b * 10));
    const res = await decoder.step(W, state, u, 10, params, [], false);
    for (let t = 0; t < 10; t++) reqs.forEach((_, b) => tokens[b].push(Number(res.tokens[t * reqs.length + b])));
    caps.push(state.colCap);
    assert.ok(state.colCap - state.S <= Math.max(16, Math.ceil(state.S / 8)) + 16, `spare columns at S ${state.S}`);
  }
  assert.deepEqual([state.keys[0], state.values[c.numHiddenLayers - 1], state.bias], buffers, 'the same buffers');
  assert.deepEqual(caps, [32, 32, 32, 49, 49], 'grown once, to the reserved columns');
  assert.ok(state.colCap <= cols && state.S === cols);
  const loop = await new Sampler(c, { threads: 1, cache, decode: 'loop' }).generate(W, reqs, {
    maxNewTokens: N,
    seed,
    temperature: 1,
    eosTokenIds: [],
  });
  loop.forEach((g, b) => assert.deepEqual(tokens[b], Array.from(g.tokens), `row ${g.id}`));
});
