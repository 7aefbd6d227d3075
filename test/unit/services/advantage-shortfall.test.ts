/**
 * Why a step is short of usable groups (services/advantage/logic.ts shortfallReason), the text
 * the run stops with when refills run out: reward failures with their count
 * and last error; online filtering only when it is on.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { sampleId, type ScoredGroup, type ScoredSample } from '../../../lib/contracts/index.ts';
import { shortfallReason } from '../../../services/advantage/logic.ts';
import { advantageSettings, scoredGroup, scoredSample } from './advantage-fixtures.ts';

const base = advantageSettings();

function sample(
  p: number,
  i: number,
  reward: number | null,
  message = 'fn:/x/reward.mjs: reward function threw: boom',
): ScoredSample {
  return scoredSample(p, i, reward, {
    details: reward === null ? {} : { overall: reward },
    failureMessage: message,
  });
}

function group(p: number, rewards: Array<number | null>): ScoredGroup {
  return scoredGroup(
    p,
    rewards.map((r, i) => sample(p, i, r)),
  );
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
