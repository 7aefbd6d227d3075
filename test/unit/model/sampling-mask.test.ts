/**
 * Sampling never emits ids that cannot appear in text (specials other than the
 * stop ids, NUL for the byte tokenizer), the behaviour log-probs are those of the masked
 * distribution, and the scorer and the trainer compute that same distribution (ratio 1 on-policy).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  ByteTokenizer,
  initWeights,
  modelConfig,
  samplingMaskIds,
  type ModelConfig,
} from '../../../lib/model/index.ts';
import { Sampler } from '../../../lib/model/sample.ts';
import { Scorer } from '../../../lib/model/score.ts';
import { createTrainer } from '../../../lib/model/train.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { policyModelConfig, criticModelConfig, tokenizerFor } from '../../../lib/pipeline/policy.ts';
import { loadConfig } from '../../../lib/config/index.ts';

const tok = new ByteTokenizer();
const base = {
  hiddenSize: 32,
  intermediateSize: 48,
  numHiddenLayers: 2,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  vocabSize: tok.vocabSize,
  maxPositionEmbeddings: 96,
  bosTokenId: tok.bos,
  eosTokenId: tok.eos,
  padTokenId: tok.pad,
};
const masked: ModelConfig = modelConfig({ ...base, suppressTokenIds: Array.from(samplingMaskIds(tok, tok.vocabSize)) });
const plain: ModelConfig = modelConfig(base);
const W = initWeights(plain, 3); // an untrained policy: close to uniform over the 259 ids
const cache = new SessionCache();
const forbidden = new Set([0, tok.pad, tok.bos]);
const prompts = Array.from({ length: 48 }, (_, i) => ({
  id: `p${i}`,
  prompt: tok.encode(`question ${i}:`, { addSpecialTokens: true }),
}));

test('the byte tokenizer masks NUL, PAD and BOS but not EOS; padding rows of a larger model are masked too', () => {
  assert.deepEqual(Array.from(samplingMaskIds(tok)), [0, 256, 257]);
  assert.deepEqual(Array.from(samplingMaskIds(tok, 262)), [0, 256, 257, 259, 260, 261]);
  assert.deepEqual(Array.from(samplingMaskIds(tok, 259, [258, 257])), [0, 256]);
});

test("every stage's policy config (policyModelConfig) carries the mask; the critic's does not need one", () => {
  const cfg = loadConfig({
    env: {},
    onWarning: () => {},
    overrides: ['data.task=number_game', 'algorithm.adv_estimator=gae'],
  });
  const t = tokenizerFor(cfg);
  assert.deepEqual(policyModelConfig(cfg, t).suppressTokenIds, [0, 256, 257]);
  assert.equal(criticModelConfig(cfg, t).suppressTokenIds, undefined);
});

test('an untrained byte-tokenizer policy never samples NUL or a non-EOS special (and does without the mask)', async () => {
  const count = async (c: ModelConfig) => {
    const out = await new Sampler(c, { threads: 1, cache }).generate(W, prompts, {
      maxNewTokens: 48,
      temperature: 1,
      seed: 11,
      eosTokenIds: [tok.eos],
    });
    let bad = 0,
      total = 0;
    for (const g of out)
      for (const t of g.tokens) {
        total++;
        if (forbidden.has(t)) bad++;
      }
    return { bad, total };
  };
  const before = await count(plain);
  assert.ok(
    before.bad > 0,
    `without the mask the untrained policy emits forbidden ids (${before.bad} of ${before.total})`,
  );
  const after = await count(masked);
  assert.ok(after.total > 1000, `enough tokens sampled (${after.total})`);
  assert.equal(after.bad, 0, 'no NUL, PAD or BOS sampled');
  // greedy too
  const greedy = await new Sampler(masked, { threads: 1, cache }).generate(W, prompts.slice(0, 8), {
    maxNewTokens: 32,
    temperature: 0,
    eosTokenIds: [tok.eos],
  });
  for (const g of greedy) for (const t of g.tokens) assert.ok(!forbidden.has(t));
});

test('behaviour log-probs are those of the masked distribution, and the scorer and trainer agree with them', async () => {
  const T = 0.8;
  const gens = await new Sampler(masked, { threads: 1, cache }).generate(W, prompts.slice(0, 4), {
    maxNewTokens: 12,
    temperature: T,
    seed: 5,
    eosTokenIds: [tok.eos],
  });
  const plainScorer = new Scorer(plain, { threads: 1, cache });
  for (const [i, g] of gens.entries()) {
    const prompt = prompts[i].prompt;
    // reference: p_masked(t) = p(t) / (1 − Σ_{m ∈ masked} p(m)) under the unmasked softmax(logits / T)
    const reqs = [];
    for (let j = 0; j < g.tokens.length; j++)
      for (const m of [g.tokens[j], ...forbidden]) reqs.push({ prompt, response: [...g.tokens.subarray(0, j), m] });
    const sc = await plainScorer.score(W, reqs, { temperature: T });
    for (let j = 0; j < g.tokens.length; j++) {
      const lp = sc.slice(j * 4, j * 4 + 4).map((s) => s.logprobs[s.logprobs.length - 1]);
      const ref = lp[0] - Math.log(1 - Math.exp(lp[1]) - Math.exp(lp[2]) - Math.exp(lp[3]));
      assert.ok(
        Math.abs(g.logprobs[j] - ref) < 2e-4,
        `sample ${i} token ${j}: behaviour ${g.logprobs[j]} vs masked reference ${ref}`,
      );
      assert.ok(
        Math.abs(lp[0] - ref) > 1e-3,
        'the unmasked log-prob differs (what a trainer without the mask would compute)',
      );
    }
  }
  // the scorer (old / reference log-probs) on the masked config
  const maskedScorer = new Scorer(masked, { threads: 1, cache });
  const sc = await maskedScorer.score(
    W,
    gens.map((g, i) => ({ prompt: prompts[i].prompt, response: g.tokens })),
    { temperature: T },
  );
  for (const [i, g] of gens.entries())
    for (let j = 0; j < g.tokens.length; j++)
      assert.ok(
        Math.abs(sc[i].logprobs[j] - g.logprobs[j]) < 2e-4,
        `scorer ${sc[i].logprobs[j]} vs sampler ${g.logprobs[j]}`,
      );
  // the trainer's current log-probs on the same sequences (evaluate: no update)
  const L = Math.max(...gens.map((g, i) => prompts[i].prompt.length + g.tokens.length));
  const B = gens.length;
  const tokens = new Int32Array(B * L),
    attn = new Float32Array(B * L),
    resp = new Float32Array(B * L),
    old = new Float32Array(B * L);
  gens.forEach((g, i) => {
    const p = prompts[i].prompt;
    tokens.set(p, i * L);
    tokens.set(g.tokens, i * L + p.length);
    for (let t = 0; t < p.length + g.tokens.length; t++) attn[i * L + t] = 1;
    for (let j = 0; j < g.tokens.length; j++) {
      resp[i * L + p.length + j] = 1;
      old[i * L + p.length + j] = g.logprobs[j];
    }
  });
  const tr = createTrainer({ model: masked, loss: { type: 'policy', temperature: T }, weights: W, cache, threads: 1 });
  const ev = await tr.evaluate({
    batchSize: B,
    seqLen: L,
    tokens,
    attentionMask: attn,
    responseMask: resp,
    advantages: new Float32Array(B * L).fill(1),
    oldLogprobs: old,
    refLogprobs: old,
  });
  for (let k = 0; k < B * L; k++)
    if (resp[k])
      assert.ok(Math.abs(ev.perToken[k] - old[k]) < 2e-4, `trainer ${ev.perToken[k]} vs sampler ${old[k]} at ${k}`);
  assert.ok(Math.abs(ev.metrics.ppo_kl) < 1e-4, `ppo_kl on-policy ${ev.metrics.ppo_kl}`);
});
