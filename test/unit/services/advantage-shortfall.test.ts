/**
 * Why a step is short of usable groups (services/advantage/logic.ts shortfallReason), the text
 * the run stops with when refills run out: reward failures with their count
 * and last error; online filtering only when it is on.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { groupId, hashId, sampleId, type ScoredGroup, type ScoredSample } from '../../../lib/contracts/index.ts';
import { shortfallReason, type AdvantageSettings } from '../../../services/advantage/logic.ts';

const base: AdvantageSettings = {
  rolloutBatchSize: 2,
  estimator: 'grpo',
  gamma: 1,
  lam: 1,
  normAdvByStd: true,
  onlineFiltering: false,
  filterSemantics: 'easyr1',
  filterKey: 'overall',
  filterLow: 0.01,
  filterHigh: 0.99,
  overlong: { enable: false, maxLength: 4, bufferLength: 2, penaltyFactor: 1 },
  useKlInReward: false,
  klPenalty: 'kl',
  klType: 'fixed',
  klCoef: 0,
  klTarget: 0.1,
  klHorizon: 10000,
};

function sample(
  p: number,
  i: number,
  reward: number | null,
  message = 'fn:/x/reward.mjs: reward function threw: boom',
): ScoredSample {
  return {
    id: sampleId('r', 1, p, i),
    sample_index: i,
    prompt_index: p,
    response_ids: Int32Array.from([3]),
    response_text: 'x',
    behaviour_logprobs: Float32Array.from([-1]),
    response_mask: Buffer.alloc(0),
    finish_reason: 'stop',
    reward,
    reward_details: reward === null ? {} : { overall: reward },
    reward_text: {},
    failure: reward === null ? { code: 'ERR_REWARD', message, retriable: false, attempts: 1 } : null,
  };
}

function group(p: number, rewards: Array<number | null>): ScoredGroup {
  const id = groupId('r', 1, p);
  return {
    run_id: 'r',
    id,
    step: 1,
    policy_version: 0,
    group_uid: hashId(id),
    kind: 'train',
    epoch: 0,
    attempt: 0,
    prompt_index: p,
    dataset_index: p,
    prompt_ids: Int32Array.from([1]),
    prompt_text: 'q',
    images: [],
    data_source: 't',
    ground_truth: '1',
    extra_info: '{}',
    reward_fn: 'fn:t',
    samples: rewards.map((r, i) => sample(p, i, r)),
    baseline: null,
  };
}

test('reward failures: the count and the last real error; no word of online filtering when it is off', () => {
  const r = shortfallReason([group(0, [null, null]), group(1, [1, 0])], base);
  assert.equal(
    r,
    `the reward failed for 2 samples in 1 of 2 groups (reward.on_failure dropped them); last error: ${sampleId('r', 1, 0, 1)}: fn:/x/reward.mjs: reward function threw: boom — fix the reward function`,
  );
  assert.doesNotMatch(shortfallReason([group(0, [1, 1]), group(1, [0, 0])], base), /online filter/);
});

test('online filtering on: what it removed, with the fix for its semantics', () => {
  const easy = shortfallReason([group(0, [1, 1]), group(1, [0.5, 0.2])], { ...base, onlineFiltering: true });
  assert.match(
    easy,
    /^online filtering removed 1 of 2 groups \(online filter \(easyr1\): mean overall 1\.0000 not in \(0\.01, 0\.99\)\) — widen algorithm\.filter_low\/filter_high/,
  );
  const dapo = shortfallReason([group(0, [1, 1]), group(1, [1, 0])], {
    ...base,
    onlineFiltering: true,
    filterSemantics: 'dapo',
  });
  assert.match(dapo, /online filter \(dapo\).*a group needs rewards that differ/);
  assert.doesNotMatch(dapo, /filter_low/);
});
