/**
 * The state `rlstream runs` shows for a run over PostgreSQL (lib/analysis/run-state.ts), from its
 * stored status and its stages' leases, with an injected clock.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runState, stageLiveness, stagesText, type StageLease } from '../../../lib/analysis/run-state.ts';

const NOW = 1_800_000_000_000;
const lease = (stage: string, ageMs: number, over: Partial<StageLease> = {}): StageLease => ({
  stage,
  replica: 0,
  holder: `pod-${stage}:1`,
  state: 'running',
  heartbeatAtMs: NOW - ageMs,
  leaseMs: 30_000,
  error: null,
  ...over,
});
const five = (ageMs: number, over: Partial<StageLease> = {}) =>
  ['controller', 'rollout', 'reward', 'advantage', 'update'].map((s) => lease(s, ageMs, over));

test('a stage is live while its heartbeat is no older than its lease, lost after', () => {
  assert.equal(stageLiveness(lease('update', 30_000), NOW), 'live');
  assert.equal(stageLiveness(lease('update', 30_001), NOW), 'lost');
  assert.equal(stageLiveness(lease('update', 1, { state: 'stopped' }), NOW), 'stopped');
});

test('running while one stage holds its lease, stale once every lease ran out', () => {
  const killedButOne = [...five(60_000).slice(1), lease('controller', 2_000)];
  assert.equal(runState('running', killedButOne, NOW).status, 'running');
  const stale = runState('running', five(31_000), NOW);
  assert.equal(stale.status, 'stale');
  assert.match(stale.note!, /no stage holds its lease: .*update \(pod-update:1\) last heartbeat 31 s ago/);
  // the same rows, read 20 s earlier (an injected clock): still running
  assert.equal(runState('running', five(31_000), NOW - 20_000).status, 'running');
});

test('stopped when every stage stopped gracefully; stale when one of them was killed instead', () => {
  assert.equal(runState('running', five(90_000, { state: 'stopped' }), NOW).status, 'stopped');
  const oneKilled = [...five(90_000, { state: 'stopped' }).slice(1), lease('controller', 90_000)];
  assert.equal(runState('running', oneKilled, NOW).status, 'stale');
  const crashed = [
    ...five(90_000, { state: 'stopped' }).slice(1),
    lease('controller', 90_000, { state: 'crashed', error: 'boom' }),
  ];
  const v = runState('running', crashed, NOW);
  assert.equal(v.status, 'stale');
  assert.match(v.note!, /controller \(pod-controller:1\) exited with an error: boom/);
  // rlstream train over PostgreSQL stores stopped on SIGTERM
  assert.equal(runState('stopped', five(90_000, { state: 'stopped' }), NOW).status, 'stopped');
});

test('a stopped or stale run that is resumed is running again', () => {
  assert.equal(runState('stopped', five(1_000), NOW).status, 'running');
  assert.equal(runState('running', [...five(90_000), lease('update', 100)], NOW).status, 'running');
});

test('the stored end wins: finished and failed whatever the leases say', () => {
  assert.equal(runState('completed', five(90_000), NOW).status, 'finished');
  assert.equal(runState('completed', five(0), NOW).status, 'finished');
  assert.equal(runState('failed', five(90_000), NOW).status, 'failed');
  assert.equal(runState('failed', five(90_000), NOW).note, null);
});

test('no heartbeat rows: the stored status as it is', () => {
  assert.deepEqual(runState('running', [], NOW), { status: 'running', stages: [], note: null });
  assert.equal(runState('completed', [], NOW).status, 'finished');
});

test('the stages column names replicas and the age of a lost lease', () => {
  const v = runState(
    'running',
    [
      lease('rollout', 1_000, { replica: 1 }),
      lease('rollout', 45_000),
      lease('controller', 500),
      lease('update', 0, { state: 'stopped' }),
    ],
    NOW,
  );
  assert.equal(v.status, 'running');
  assert.equal(stagesText(v.stages), 'controller live, rollout#0 lost 45 s, rollout#1 live, update stopped');
  assert.equal(stagesText([]), null);
});
