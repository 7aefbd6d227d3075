/**
 * The decode thread (lib/inference/decode-thread.ts): sequences batched on the worker are the ones
 * `Sampler.generate` draws for their (seed, id) alone, a sequence ends at the token whose onToken
 * returned true (tokens the worker decoded after it are dropped), top log-probs come across, bad
 * requests are ConfigErrors, and a new policy version reaches the worker.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { initWeights, modelConfig } from '../../../lib/model/index.ts';
import { Sampler, type SamplingParamsInput } from '../../../lib/model/sample.ts';
import { ThreadedBatcher } from '../../../lib/inference/decode-thread.ts';
import { ConfigError } from '../../../lib/errors.ts';
import { TINY_GQA_BIAS } from '../../support/tiny-models.ts';

const cfg = modelConfig(TINY_GQA_BIAS);
const W = initWeights(cfg, 7, { std: 0.3 });
const W2 = initWeights(cfg, 8, { std: 0.3 });
const sampler = new Sampler(cfg, { threads: 1 });

test('the decode thread samples what Sampler.generate does, stops where onToken says, and follows a new version', async () => {
  const b = new ThreadedBatcher(cfg, { threads: 1, windowMs: 0 });
  try {
    b.setPolicy({ version: 1, weights: W, dir: '/a' });
    const p: SamplingParamsInput = { maxNewTokens: 10, temperature: 1, seed: 3, eosTokenIds: [] };
    const seqs = [
      { id: 'x0', prompt: [1, 5, 6, 7] },
      { id: 'x1', prompt: [1, 9, 10] },
    ];
    const streamed: number[][] = [[], []];
    let yTokens = 0;
    const [whole, stopped] = await Promise.all([
      b.submit(seqs, p, { topLogprobs: 2, onToken: (s, t) => void streamed[s].push(t.token) }),
      b.submit([{ id: 'y0', prompt: [1, 4] }], p, { onToken: () => ++yTokens === 3 }),
    ]);
    const solo = await sampler.generate(W, [...seqs, { id: 'y0', prompt: [1, 4] }], p);
    assert.equal(whole.version, 1);
    whole.generations.forEach((g, i) => {
      assert.deepEqual(g.tokens, Array.from(solo[i].tokens), `${g.id}: the sampler's own draw`);
      assert.deepEqual(g.tokens, streamed[i], 'onToken saw every token in order');
      assert.equal(g.top.length, g.tokens.length);
      assert.ok(g.top.every((t) => t.length === 2 && t[0].logprob >= t[1].logprob));
      assert.equal(g.finishReason, 'length');
    });
    const y = stopped.generations[0];
    assert.equal(y.finishReason, 'stopped');
    assert.equal(y.tokens.length, 3, 'the sequence ends at the token whose onToken returned true');
    assert.deepEqual(y.tokens, Array.from(solo[2].tokens.slice(0, 3)));

    await assert.rejects(b.submit([{ id: 'z', prompt: [cfg.vocabSize] }], p), ConfigError);

    b.setPolicy({ version: 2, weights: W2, dir: '/b' });
    const after = await b.submit([seqs[0]], p);
    assert.equal(after.version, 2);
    assert.deepEqual(after.generations[0].tokens, Array.from((await sampler.generate(W2, [seqs[0]], p))[0].tokens));
  } finally {
    await b.close();
  }
});
