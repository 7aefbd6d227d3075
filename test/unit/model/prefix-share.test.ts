/**
 * Prefix sharing in generation: the n samples of a prompt are prefilled once and continue from one
 * KV cache expanded to n rows (decode-graph.ts `prompt_rows`). Each sample must be exactly what it
 * is when generated on its own (deterministic per sample id), whatever else is in the batch.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { initWeights, modelConfig } from '../../../lib/model/index.ts';
import { buildGenerateModel, GEN_IO } from '../../../lib/model/decode-graph.ts';
import { Sampler } from '../../../lib/model/sample.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { createSession } from '../../../lib/onnx/runtime.ts';
import { TINY_GQA_BIAS } from '../../support/tiny-models.ts';

const cfg = modelConfig(TINY_GQA_BIAS);
const W = initWeights(cfg, 7, { std: 0.3 });
const cache = new SessionCache();
const maxAbs = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
};

test('n samples of each prompt in one batch (shared prefill) equal each sample generated alone', async () => {
  const prompts = [
    [1, 5, 6, 7],
    [1, 9, 10, 11, 12, 13, 14],
    [1, 20],
  ];
  const reqs = prompts.flatMap((p, i) => Array.from({ length: 4 }, (_, k) => ({ id: `p${i}-s${k}`, prompt: p })));
  for (const params of [
    { maxNewTokens: 10, temperature: 1, seed: 3, eosTokenIds: [] },
    { maxNewTokens: 10, temperature: 0.8, topK: 5, topP: 0.9, seed: 4, eosTokenIds: [2] },
  ]) {
    const shared = await new Sampler(cfg, { threads: 1, cache }).generate(W, reqs, params);
    const alone = await new Sampler(cfg, { threads: 1, cache, maxBatchSize: 1 }).generate(W, reqs, params);
    shared.forEach((g, i) => {
      assert.equal(g.id, reqs[i].id);
      assert.deepEqual(Array.from(g.tokens), Array.from(alone[i].tokens), `${g.id}: tokens`);
      assert.ok(
        maxAbs(g.logprobs, alone[i].logprobs) < 1e-5,
        `${g.id}: log-probs differ by ${maxAbs(g.logprobs, alone[i].logprobs)}`,
      );
      assert.equal(g.finishReason, alone[i].finishReason);
    });
    // the samples of one prompt are not copies of each other (their ids draw different uniforms)
    assert.notDeepEqual(Array.from(shared[0].tokens), Array.from(shared[1].tokens));
  }
});

test('the generation graph prefills [U, P] distinct prompts and samples [B] rows', async () => {
  const s = await createSession(buildGenerateModel(cfg, { truncation: false }), { threads: 1 });
  assert.ok(s.inputNames.includes(GEN_IO.promptRows));
});
