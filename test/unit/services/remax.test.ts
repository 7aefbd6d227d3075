/**
 * ReMax in the pipeline (pure logic): the rollout adds one greedy request per training group, the
 * reward stage scores it like any sample, and the advantage stage subtracts its reward and leaves
 * it out of the update batch.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  generationRequests,
  requestSampling,
  trajectoryGroups,
  type GenResult,
} from '../../../services/rollout/logic.ts';
import { rewardItems, scoredGroup } from '../../../services/reward/logic.ts';
import { computeStep, filterReason, remaxBaselines, settle } from '../../../services/advantage/logic.ts';
import {
  groupId,
  hashId,
  sampleId,
  valGroupId,
  type PromptBatch,
  type ScoredGroup,
  type ScoredSample,
} from '../../../lib/contracts/index.ts';
import { recordProblems } from '../../../lib/contracts/invariants.ts';
import { advantageSettings, scoredGroup as fixtureGroup, scoredSample } from './advantage-fixtures.ts';
import { ConfigError } from '../../../lib/errors.ts';

function batch(kind: 'train' | 'val', n: number, prompts = 1): PromptBatch {
  const gid = (p: number) => (kind === 'train' ? groupId('r', 1, p) : valGroupId('r', 1, p));
  return {
    run_id: 'r',
    id: prompts === 1 ? gid(0) : `${gid(0)}+${prompts}`,
    step: 1,
    policy_version: 0,
    kind,
    epoch: 0,
    attempt: 0,
    sampling: { temperature: 0.7, top_p: 0.9, top_k: 5, max_new_tokens: 3 },
    groups: Array.from({ length: prompts }, (_, p) => ({
      id: gid(p),
      group_uid: hashId(gid(p)),
      n,
      prompt_index: p,
      dataset_index: p,
      prompt_ids: Int32Array.from([1, 2]),
      prompt_text: 'q',
      images: [],
      image_refs: [],
      data_source: 't',
      ground_truth: '1',
      extra_info: '{}',
    })),
  };
}

test('rollout: remax adds one greedy request per training group (sample index n, temperature 0); validation and other estimators get none', () => {
  const b = batch('train', 3, 2);
  const plain = generationRequests([b]);
  assert.equal(plain.requests.length, 6);
  assert.ok(plain.requests.every((r) => !r.greedy));
  const { requests, groups } = generationRequests([b, batch('val', 2)], { greedyBaseline: true });
  assert.deepEqual(
    requests.map((r) => `${r.groupIndex}:${r.sampleIndex}${r.greedy ? 'g' : ''}`),
    ['0:0', '0:1', '0:2', '0:3g', '1:0', '1:1', '1:2', '1:3g', '2:0', '2:1'],
  );
  assert.deepEqual(
    plain.requests.map((r) => r.id),
    requests.filter((r) => !r.greedy && groups[r.groupIndex].batch.kind === 'train').map((r) => r.id),
    'the sampled requests are unchanged',
  );
  const greedy = requests[3];
  assert.equal(greedy.id, sampleId('r', 1, 0, 3));
  assert.deepEqual(requestSampling(b, greedy), { temperature: 0, top_p: 1, top_k: 0, max_new_tokens: 3 });
  assert.deepEqual(requestSampling(b, requests[0]), b.sampling);

  const results: GenResult[] = requests.map((r, i) => ({
    id: r.id,
    tokens: Int32Array.from([i]),
    logprobs: Float32Array.from([-0.5]),
    finishReason: 'length',
  }));
  const trajs = trajectoryGroups(groups, requests, results, (ids) => `t${ids[0]}`, 99);
  assert.deepEqual(
    trajs.map((g) => g.samples.map((s) => s.response_text)),
    [
      ['t0', 't1', 't2'],
      ['t4', 't5', 't6'],
      ['t8', 't9'],
    ],
  );
  assert.deepEqual(
    trajs.map((g) => g.baseline?.response_text ?? null),
    ['t3', 't7', null],
  );
  assert.equal(trajs[0].baseline!.sample_index, 3);
  for (const g of trajs) assert.deepEqual(recordProblems('trajectories', g), [], 'valid trajectories.v2 records');
});

const settings = advantageSettings({ estimator: 'remax' });

function sample(p: number, i: number, reward: number | null, len = 2): ScoredSample {
  return scoredSample(p, i, reward, {
    responseIds: new Int32Array(len).fill(3),
    logprobs: new Float32Array(len).fill(-1),
  });
}

function group(p: number, rewards: number[], baseline: number | null | undefined, baselineLen = 2): ScoredGroup {
  return fixtureGroup(
    p,
    rewards.map((r, i) => sample(p, i, r)),
    { baseline: baseline === undefined ? null : sample(p, rewards.length, baseline, baselineLen) },
  );
}

test('reward: the greedy baseline is scored like any sample (a failure stays a failure)', () => {
  const b = batch('train', 2);
  const { requests, groups } = generationRequests([b], { greedyBaseline: true });
  const [t] = trajectoryGroups(
    groups,
    requests,
    requests.map((r) => ({
      id: r.id,
      tokens: Int32Array.from([5]),
      logprobs: Float32Array.from([0]),
      finishReason: 'length',
    })),
    () => 'x',
    99,
  );
  const items = rewardItems(t);
  assert.deepEqual(
    items.map((x) => x.id),
    [sampleId('r', 1, 0, 0), sampleId('r', 1, 0, 1), sampleId('r', 1, 0, 2)],
  );
  const sg = scoredGroup(
    t,
    [
      { id: items[0].id, ok: true, reward: 1, details: {}, server: 's' },
      { id: items[1].id, ok: true, reward: 0, details: {}, server: 's' },
      { id: items[2].id, ok: true, reward: 0.5, details: { acc: 1 }, server: 's' },
    ],
    'fn:t',
    1,
  );
  assert.equal(sg.samples.length, 2);
  assert.equal(sg.baseline!.reward, 0.5);
  assert.deepEqual(sg.baseline!.reward_details, { acc: 1 });
  assert.deepEqual(recordProblems('scored', sg), []);
  const failed = scoredGroup(
    t,
    [
      { id: items[0].id, ok: true, reward: 1, details: {}, server: 's' },
      { id: items[1].id, ok: true, reward: 0, details: {}, server: 's' },
    ],
    'fn:t',
    1,
  );
  assert.equal(failed.baseline!.reward, null);
  assert.equal(failed.baseline!.failure!.code, 'ERR_REWARD_MISSING');
});

test('advantage: remax advantages are reward − the greedy reward of the prompt on every token; the baseline is not in the update batch', () => {
  const kept = [group(0, [1, 0, 0.25], 0.5), group(1, [1, 1, 0], 1)];
  const res = computeStep(kept, [], null, settings, null);
  assert.equal(res.updates.length, 2);
  for (const [gi, u] of res.updates.entries()) {
    assert.equal('baseline' in u, false, 'no baseline field in the update group');
    assert.deepEqual(
      u.samples.map((x) => x.sample_index),
      [0, 1, 2],
      'the n sampled responses only',
    );
    const b = kept[gi].baseline!.reward!;
    for (const x of u.samples) assert.deepEqual(Array.from(x.advantages), [x.reward! - b, x.reward! - b]);
    assert.deepEqual(recordProblems('updates', u), []);
  }
  assert.equal(res.metrics['reward/baseline_mean'], 0.75);
  assert.equal(res.metrics['reward/mean'], 3.25 / 6, 'reward/mean is over the sampled responses');
  assert.ok(Math.abs(res.metrics['reward/minus_baseline_mean'] - (1.25 - 1.5 + 2 - 3) / 6) < 1e-12);
  // other estimators ignore a baseline they do not need
  const grpo = computeStep(kept, [], null, { ...settings, estimator: 'grpo' }, null);
  assert.equal(grpo.metrics['reward/baseline_mean'], undefined);
});

test('advantage: overlong shaping applies to the greedy response too', () => {
  const s = { ...settings, overlong: { enable: true, maxLength: 4, bufferLength: 2, penaltyFactor: 1 } };
  // the greedy response is 4 tokens long: penalty (4 − 2) / 2 · 1 = 1; the samples (2 tokens) are not penalised
  const b = remaxBaselines(
    [group(0, [1, 0], 0.5, 4)],
    s.overlong.enable ? { max_response_length: 4, overlong_buffer_len: 2, overlong_penalty_factor: 1 } : null,
  );
  assert.equal(b.get(groupId('r', 1, 0)), -0.5);
  const res = computeStep([group(0, [1, 0], 0.5, 4), group(1, [1, 1], 1)], [], null, s, null);
  assert.deepEqual(Array.from(res.updates[0].samples[0].advantages), [1.5, 1.5]);
});

test('advantage: a failed greedy reward filters the group (refill); a missing baseline is refused with what to do', () => {
  const failed = group(1, [1, 0], null);
  assert.match(filterReason(failed, settings)!, /reward failed for the greedy baseline \(remax\): boom/);
  assert.deepEqual(settle([group(0, [1, 0], 0), failed], [], settings), { kind: 'refill', needed: 1 });
  assert.throws(
    () => computeStep([group(0, [1, 0], undefined)], [], null, settings, null),
    (e: unknown) => {
      assert.ok(e instanceof ConfigError);
      assert.equal(e.retriable, false);
      assert.match(
        e.message,
        /remax needs the reward of a greedy rollout per prompt, but group r\/train\/s1\/p0 \(and 0 more\) has none/,
      );
      return true;
    },
  );
});

test('advantage metrics: each numeric reward component is averaged over the kept samples as reward/<name>; pipeline names go under reward/details/', () => {
  const withDetails = (g: ScoredGroup, details: Array<Record<string, number>>): ScoredGroup => ({
    ...g,
    samples: g.samples.map((x, i) => ({ ...x, reward_details: details[i]! })),
  });
  const a = withDetails(group(0, [1, 0], undefined), [
    { accuracy: 1, format: 1, mean: 7 },
    { accuracy: 0, format: 1, mean: 9 },
  ]);
  const b = withDetails(group(1, [1, 1], undefined), [{ accuracy: 1, format: 0 }, { accuracy: 1 }]);
  const res = computeStep([a, b], [], null, { ...settings, estimator: 'grpo' }, null);
  assert.equal(res.metrics['reward/accuracy'], 3 / 4);
  assert.equal(res.metrics['reward/format'], 2 / 3, 'over the samples that report it');
  assert.equal(res.metrics['reward/details/mean'], 8, 'a component called "mean" does not overwrite reward/mean');
  assert.equal(res.metrics['reward/mean'], 3 / 4);
});
