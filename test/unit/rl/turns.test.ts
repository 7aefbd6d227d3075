/**
 * GAE across the turns of an episode: per-turn rewards on each turn's last sampled token, the
 * recursion over policy tokens only (environment tokens skipped). Checked against a reference
 * (plain GAE on the policy tokens alone, scattered back), by hand, and through the advantage
 * stage from the reward details the episode backend writes.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { computeGaeAdvantageReturn, tensor2d, turnRewardDetails, turnRewardsOf } from '../../../lib/rl/index.ts';
import { episodeOutcome } from '../../../lib/reward/episode-backend.ts';
import { computeStep, type AdvantageSettings } from '../../../services/advantage/logic.ts';
import { groupId, hashId, sampleId, type ScoredGroup, type ScoredSample } from '../../../lib/contracts/index.ts';

/** Reference: textbook GAE on the policy tokens alone (float64), scattered back; NaN at env tokens. */
function gaeReference(r: number[], v: number[], m: number[], gamma: number, lam: number): number[] {
  const idx = m.flatMap((x, k) => (x ? [k] : []));
  const out = new Array<number>(m.length).fill(NaN);
  let next = 0,
    acc = 0;
  for (let j = idx.length - 1; j >= 0; j--) {
    const k = idx[j];
    // rewards on env tokens would be lost by the kernel too: none are placed there
    const delta = r[k] + gamma * next - v[k];
    acc = delta + gamma * lam * acc;
    out[k] = acc;
    next = v[k];
  }
  return out;
}

function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => ((s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32) * 2 - 1;
}

test('gae across turns: the masked kernel equals plain GAE over the policy tokens alone (random episodes)', () => {
  const rand = rng(7);
  for (let trial = 0; trial < 20; trial++) {
    const bs = 3,
      T = 17;
    const R = new Float64Array(bs * T),
      V = new Float64Array(bs * T),
      M = new Float64Array(bs * T);
    for (let i = 0; i < bs; i++) {
      // turns: 1–4 policy tokens, then 0–3 environment tokens, until T
      const L = T - Math.floor(Math.abs(rand()) * 4);
      let k = 0;
      while (k < L) {
        const pol = 1 + Math.floor(Math.abs(rand()) * 4);
        for (let j = 0; j < pol && k < L; j++, k++) M[i * T + k] = 1;
        R[i * T + k - 1] = rand(); // the turn's reward on its last sampled token
        k += Math.floor(Math.abs(rand()) * 4);
      }
      for (let t = 0; t < T; t++) V[i * T + t] = rand();
    }
    const gamma = 0.9,
      lam = 0.7;
    const out = computeGaeAdvantageReturn(
      { token_level_rewards: tensor2d(R, bs, T), response_mask: tensor2d(M, bs, T), values: tensor2d(V, bs, T) },
      { gamma, lam },
    );
    for (let i = 0; i < bs; i++) {
      const sl = (a: Float64Array) => Array.from(a.subarray(i * T, (i + 1) * T));
      const ref = gaeReference(sl(R), sl(V), sl(M), gamma, lam);
      for (let t = 0; t < T; t++) {
        if (!M[i * T + t]) continue;
        // returns = A + V (not whitened)
        const a = out.returns.data[i * T + t] - V[i * T + t];
        assert.ok(Math.abs(a - ref[t]) < 1e-12, `trial ${trial} row ${i} t ${t}: ${a} vs ${ref[t]}`);
      }
    }
  }
});

test('gae across turns, by hand: two turns with an environment segment between them', () => {
  // tokens:  a0 a1 | e e | b0 ;  r(a1) = 0.5 (turn 0), r(b0) = 1 (turn 1); V = 0.1, 0.2, -, -, 0.3
  // γ = 0.9, λ = 0.5 (γλ = 0.45):
  //   b0: δ = 1 − 0.3 = 0.7                        A = 0.7
  //   a1: δ = 0.5 + 0.9·0.3 − 0.2 = 0.57           A = 0.57 + 0.45·0.7 = 0.885
  //   a0: δ = 0 + 0.9·0.2 − 0.1 = 0.08             A = 0.08 + 0.45·0.885 = 0.47825
  const R = [0, 0.5, 0, 0, 1],
    V = [0.1, 0.2, 9, 9, 0.3],
    M = [1, 1, 0, 0, 1];
  const out = computeGaeAdvantageReturn(
    {
      token_level_rewards: tensor2d(Float64Array.from(R), 1, 5),
      response_mask: tensor2d(Float64Array.from(M), 1, 5),
      values: tensor2d(Float64Array.from(V), 1, 5),
    },
    { gamma: 0.9, lam: 0.5 },
  );
  const a = [0, 1, 4].map((t) => out.returns.data[t] - V[t]);
  const want = [0.47825, 0.885, 0.7];
  a.forEach((x, j) => assert.ok(Math.abs(x - want[j]) < 1e-12, `${x} vs ${want[j]}`));
});

test('turn rewards: each answer’s reward goes to the last sampled token of the turn it answers', () => {
  const turns = [
    { role: 'assistant', start: 0, end: 3, reward: 0 },
    { role: 'user', start: 3, end: 6, reward: 0.25 },
    { role: 'assistant', start: 6, end: 8, reward: 0 },
    { role: 'tool', start: 8, end: 9, reward: 0 },
    { role: 'assistant', start: 9, end: 11, reward: 0 },
    { role: 'user', start: 11, end: 11, reward: 1 }, // the last answer adds no tokens
  ];
  assert.deepEqual(turnRewardDetails(turns), { 'turn_reward/2': 0.25, 'turn_reward/10': 1 });
  assert.deepEqual(turnRewardsOf({ turns: 3, 'turn_reward/2': 0.25, 'turn_reward/10': 1 }, 11), [
    [2, 0.25],
    [10, 1],
  ]);
  assert.throws(() => turnRewardsOf({ 'turn_reward/11': 1 }, 11), /token index outside the response \(length 11\)/);
  // the episode backend reports them with the episode's reward
  const o = episodeOutcome({
    id: 'x',
    episode: {
      turns: turns.map((t) => ({ ...t, text: '', tool_name: null, arguments: null, latency_ms: 0, error: null })),
      assistant_turns: 3,
      reward: 1.25,
      done: true,
      failure: null,
      timed_out: false,
      tool_calls: 0,
      tool_errors: 0,
      metrics: {},
    },
  } as never);
  assert.ok(o.ok);
  assert.deepEqual(o.details, { turns: 3, done: 1, 'turn_reward/2': 0.25, 'turn_reward/10': 1 });
});

const settings: AdvantageSettings = {
  rolloutBatchSize: 1,
  estimator: 'gae',
  gamma: 1,
  lam: 1,
  normAdvByStd: true,
  groupStd: 'unbiased',
  onlineFiltering: false,
  filterSemantics: 'easyr1',
  filterKey: 'overall',
  filterLow: 0.01,
  filterHigh: 0.99,
  overlong: { enable: false, maxLength: 8, bufferLength: 2, penaltyFactor: 1 },
  useKlInReward: false,
  klPenalty: 'kl',
  klType: 'fixed',
  klCoef: 0,
  klTarget: 0.1,
  klHorizon: 10000,
};

function episodeGroup(): ScoredGroup {
  const id = groupId('r', 1, 0);
  const sample: ScoredSample = {
    id: sampleId('r', 1, 0, 0),
    sample_index: 0,
    prompt_index: 0,
    response_ids: Int32Array.from([5, 6, 7, 8, 9, 10]),
    response_text: 'x',
    behaviour_logprobs: new Float32Array(6).fill(-1),
    response_mask: Buffer.from([1, 1, 0, 0, 1, 1]),
    finish_reason: 'stop',
    reward: 1.5,
    reward_details: { turns: 2, 'turn_reward/1': 0.5, 'turn_reward/5': 1 },
    reward_text: {},
    failure: null,
    generated: null,
  };
  return {
    run_id: 'r',
    id,
    step: 1,
    policy_version: 0,
    group_uid: hashId(id),
    kind: 'train',
    epoch: 0,
    attempt: 0,
    prompt_index: 0,
    dataset_index: 0,
    prompt_ids: Int32Array.from([1]),
    prompt_text: 'q',
    images: [],
    data_source: 't',
    ground_truth: '1',
    extra_info: '{}',
    reward_fn: 'env:episode',
    samples: [sample],
    baseline: null,
  };
}

test('advantage stage, gae: turn rewards placed per turn (returns = rewards to go over policy tokens); outcome estimators use the episode reward', () => {
  const g = episodeGroup();
  const values = new Map([[g.samples[0].id, new Float32Array(6)]]);
  const res = computeStep([g], [], null, settings, null, values);
  const x = res.updates[0].samples[0];
  // V = 0, γ = λ = 1: A at a policy token = the rewards from its turn on; env tokens carry the next one's
  assert.deepEqual(Array.from(x.returns), [1.5, 1.5, 1, 1, 1, 1]);
  assert.deepEqual(Array.from(x.loss_weights), [1, 1, 0, 0, 1, 1]);
  // advantages whitened over the policy tokens; environment tokens get none
  assert.deepEqual(Array.from(x.advantages.slice(2, 4)), [0, 0]);
  const pol = [0, 1, 4, 5].map((t) => x.advantages[t]);
  assert.ok(Math.abs(pol.reduce((a, b) => a + b, 0)) < 1e-5, `whitened: ${pol}`);
  assert.ok(pol[0] > pol[2], 'the first turn’s tokens see both rewards');
  assert.equal(res.metrics['reward/turns'], 2);
  assert.equal(
    Object.keys(res.metrics).some((k) => k.includes('turn_reward')),
    false,
    'placements are not metrics',
  );
  // γ = 0.9: only policy tokens are steps (a0 → a1 → b0 → b1); env tokens carry b0’s value
  const d = computeStep([episodeGroup()], [], null, { ...settings, gamma: 0.9 }, null, values);
  const ret = Array.from(d.updates[0].samples[0].returns);
  const want = [0.9 * (0.5 + 0.9 * 0.9 * 1), 0.5 + 0.9 * 0.9 * 1, 0.9, 0.9, 0.9, 1];
  ret.forEach((v, t) => assert.ok(Math.abs(v - want[t]) < 1e-6, `t ${t}: ${v} vs ${want[t]}`));
  // grpo: the episode's reward (a singleton group: mean 0, std 1) on every policy token
  const o = computeStep([episodeGroup()], [], null, { ...settings, estimator: 'grpo' }, null);
  const adv = Array.from(o.updates[0].samples[0].advantages);
  [1.5, 1.5, 0, 0, 1.5, 1.5].forEach((v, t) => assert.ok(Math.abs(adv[t] - v) < 1e-5, `t ${t}: ${adv[t]}`));
});
