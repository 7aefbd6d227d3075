/**
 * The advantage stage's rows and events (services/advantage/logic.ts): the estimators the
 * pipeline refuses, the rows of groups with reward failures, a refill request, and the state
 * kept after a step.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  BASELINE_REASON,
  estimatorRefusal,
  failureRows,
  initialAdvantageState,
  refillRequest,
  stepBucket,
  stepDone,
  trimAdvantageState,
} from '../../../services/advantage/logic.ts';
import { ADV_ESTIMATOR_NAMES } from '../../../lib/rl/advantage.ts';
import { advantageSettings, scoredGroup, scoredSample } from './advantage-fixtures.ts';

test('estimators without their pipeline input are refused with the usable ones listed; the others pass', () => {
  const r = estimatorRefusal('optimal_token_baseline');
  assert.match(r ?? '', /sum_pi_squared/);
  assert.match(r ?? '', /use gae, grpo, .* or gpg$/);
  assert.doesNotMatch(r ?? '', /use .*optimal_token_baseline/);
  for (const name of ['grpo', 'gae', 'remax']) assert.equal(estimatorRefusal(name), null);
  assert.ok(ADV_ESTIMATOR_NAMES.every((n) => estimatorRefusal(n) === null || n.includes('optimal_token_baseline')));
});

test('failure rows: every sample of a group with a failed reward (its baseline last), filtered; other groups none', () => {
  const s = advantageSettings({ estimator: 'remax' });
  const ok = scoredGroup(0, [scoredSample(0, 0, 1), scoredSample(0, 1, 0)]);
  const failed = scoredGroup(1, [scoredSample(1, 0, null), scoredSample(1, 1, 1)], {
    baseline: scoredSample(1, 2, 0.5),
  });
  const baselineFailed = scoredGroup(2, [scoredSample(2, 0, 1)], { baseline: scoredSample(2, 1, null) });
  const rows = failureRows('r', [ok, failed, baselineFailed], s);
  assert.deepEqual(
    rows.map((r) => [r.id, r.filtered, r.filterReason === BASELINE_REASON]),
    [
      [failed.samples[0].id, true, false],
      [failed.samples[1].id, true, false],
      [baselineFailed.samples[0].id, true, false],
      [failed.baseline!.id, true, true],
      [baselineFailed.baseline!.id, true, true],
    ],
  );
  assert.match(rows[0].filterReason ?? '', /reward/);
  assert.deepEqual(failureRows('r', [ok], s), []);
});

test('a refill request names the step, the request number, the groups and why they fall short', () => {
  const groups = [scoredGroup(0, [scoredSample(0, 0, null, { failureMessage: 'fn: boom' })], { policy_version: 3 })];
  const e = refillRequest('r', 7, 2, 1, groups, advantageSettings(), 1234);
  assert.equal(e.type, 'refill_request');
  assert.equal(e.step, 7);
  assert.equal(e.policy_version, 3);
  assert.equal(e.time_ms, 1234);
  assert.equal(e.refill_request.request, 2);
  assert.equal(e.refill_request.needed, 1);
  assert.deepEqual(e.refill_request.filtered_group_ids, [groups[0].id]);
  assert.match(e.refill_request.reason, /fn: boom/);
  assert.notEqual(e.id, refillRequest('r', 7, 3, 1, groups, advantageSettings(), 1234).id, 'one id per request');
});

test('a done step records its KL value (the configured one without a controller) and drops its refills; the state stays bounded', () => {
  const st = initialAdvantageState();
  st.refills[4] = [1];
  stepDone(st, 4, null, 0.01);
  stepDone(st, 5, 0.2, 0.01);
  assert.deepEqual(st.done, [4, 5]);
  assert.deepEqual(st.refills, {});
  assert.deepEqual(st.klByStep, { '4': 0.01, '5': 0.2 });
  assert.equal(st.klValue, 0.2);
  for (let s = 6; s <= 300; s++) stepDone(st, s, null, 0);
  trimAdvantageState(st);
  assert.equal(st.done.length, 256);
  assert.equal(st.done[255], 300);
  assert.deepEqual(Object.keys(st.klByStep!).map(Number).slice(0, 2), [237, 238]);
  assert.equal(Object.keys(st.klByStep!).length, 64);
  assert.ok(stepBucket(99) < stepBucket(100));
});
