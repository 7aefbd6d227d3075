import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decideOnFailures, type GroupInfo } from '../../../lib/reward/failure-policy.ts';
import type { RewardOutcome } from '../../../lib/reward/types.ts';

const group = (over: Partial<GroupInfo> = {}): GroupInfo => ({
  group_id: 'g7',
  expected_ids: ['a', 'b', 'c'],
  attempt: 0,
  max_attempts: 3,
  ...over,
});
const ok = (id: string, reward = 0): RewardOutcome => ({ id, ok: true, reward, details: {}, server: '127.0.0.1:8000' });
const fail = (id: string, retriable = true, reason = 'HTTP 503: busy'): RewardOutcome => ({
  id,
  ok: false,
  reason,
  retriable,
  server: '127.0.0.1:8001',
});

test('every trajectory scored (zeros included) → emit, whatever the policy', () => {
  for (const p of ['retry', 'drop_group', 'stop'] as const) {
    assert.deepEqual(decideOnFailures([ok('a', 0), ok('b', 1), ok('c', 0)], group(), p), {
      action: 'emit',
      failed: [],
    });
  }
});

test('stop names the trajectories, servers and errors', () => {
  const d = decideOnFailures([ok('a'), fail('b', true, '127.0.0.1:8001: HTTP 500: boom'), ok('c')], group(), 'stop');
  assert.equal(d.action, 'stop');
  assert.match(
    d.message!,
    /1 of 3 trajectories in group g7 could not be scored \(b: 127\.0\.0\.1:8001: HTTP 500: boom\)/,
  );
  assert.match(d.message!, /reward\.on_failure: stop/);
  assert.deepEqual(
    d.failed.map((f) => f.id),
    ['b'],
  );
  assert.match(
    decideOnFailures([ok('a'), fail('b'), ok('c')], group(), 'stop').message!,
    /b on 127\.0\.0\.1:8001: HTTP 503: busy/,
  );
});

test('drop_group drops the group', () => {
  const d = decideOnFailures([ok('a'), fail('b'), fail('c', false)], group(), 'drop_group');
  assert.equal(d.action, 'drop_group');
  assert.deepEqual(
    d.failed.map((f) => f.id),
    ['b', 'c'],
  );
});

test('retry: retriable failures → retry_later until max_attempts, then drop_group; a permanent failure drops at once', () => {
  assert.equal(decideOnFailures([ok('a'), fail('b'), ok('c')], group({ attempt: 0 }), 'retry').action, 'retry_later');
  assert.equal(decideOnFailures([ok('a'), fail('b'), ok('c')], group({ attempt: 2 }), 'retry').action, 'retry_later');
  const out = decideOnFailures([ok('a'), fail('b'), ok('c')], group({ attempt: 3 }), 'retry');
  assert.equal(out.action, 'drop_group');
  assert.match(out.message!, /after 3 later attempts/);
  const perm = decideOnFailures(
    [ok('a'), fail('b', false, 'malformed response: field "vlm_score" is missing'), ok('c')],
    group(),
    'retry',
  );
  assert.equal(perm.action, 'drop_group');
  assert.match(perm.message!, /cannot succeed on retry.*vlm_score/);
});

test('a trajectory without any outcome is a failure (nothing lost silently); a failure then success counts as scored', () => {
  const d = decideOnFailures([ok('a'), ok('c')], group(), 'stop');
  assert.equal(d.action, 'stop');
  assert.match(d.message!, /b: no reward outcome/);
  assert.equal(decideOnFailures([ok('a'), fail('b'), ok('b'), ok('c')], group(), 'stop').action, 'emit');
});

test('outcomes for trajectories outside the group stop the run; a non-finite reward is never emitted', () => {
  const d = decideOnFailures([ok('a'), ok('b'), ok('c'), ok('zz')], group(), 'drop_group');
  assert.equal(d.action, 'stop');
  assert.match(d.message!, /zz/);
  const n = decideOnFailures([ok('a'), ok('b', Number.NaN), ok('c')], group(), 'drop_group');
  assert.equal(n.action, 'drop_group');
  assert.match(n.message!, /not finite/);
});

test('long failure lists are summarised', () => {
  const ids = Array.from({ length: 10 }, (_, i) => `t${i}`);
  const d = decideOnFailures(
    ids.map((id) => fail(id)),
    group({ expected_ids: ids }),
    'stop',
  );
  assert.match(d.message!, /10 of 10 .*… and 7 more/);
});

test('stop says what to fix by the kind of reward: a function, a model, or the servers', () => {
  const fnFail: RewardOutcome = {
    id: 'b',
    ok: false,
    reason: 'reward function threw: boom',
    retriable: false,
    server: 'fn:/x/reward.mjs',
  };
  const m = decideOnFailures([ok('a'), fnFail, ok('c')], group(), 'stop').message!;
  assert.match(m, /fix the reward function \/x\/reward\.mjs/);
  assert.doesNotMatch(m, /reward servers/);
  const modelFail: RewardOutcome = {
    id: 'b',
    ok: false,
    reason: 'token id 99 out of range',
    retriable: false,
    server: 'onnx:/m.onnx',
  };
  assert.match(
    decideOnFailures([ok('a'), modelFail, ok('c')], group(), 'stop').message!,
    /fix the reward model \/m\.onnx/,
  );
  assert.match(decideOnFailures([ok('a'), fail('b'), ok('c')], group(), 'stop').message!, /fix the reward servers/);
});
