/**
 * Fault injection with real servers on loopback: a reward-server killed (SIGKILL, by PID) mid-run,
 * one whose scorer stalls past the timeout, one whose scorer throws (HTTP 500), one answering
 * malformed JSON and one answering NaN — next to two healthy reward-servers. The run completes
 * with every trajectory scored by a healthy server (failover), each reward equal to the scorer's;
 * with only broken servers left, every trajectory is a recorded failure and on_failure = stop
 * gives a message naming the server and the error. Never a fabricated reward; nothing lost.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { createRemoteRewardClient } from '../../../lib/reward/http-client.ts';
import { decideOnFailures } from '../../../lib/reward/failure-policy.ts';
import { withRemoteDefaults, type RewardOutcome, type RewardRequestItem } from '../../../lib/reward/types.ts';
import exampleScore from '../../../examples/reward-server/overlap-scorer.ts';
import { FAULTY_SCORER, startRewardServers, type ServerGroup } from '../../../devkit/reward-procs.ts';
import { startFaultyServer, type FaultyServer } from '../../support/reward-faulty-http.ts';

let dir = '';
const groups: Record<string, ServerGroup> = {};
const faulty: Record<string, FaultyServer> = {};

before(async () => {
  mkdirSync('test/.tmp', { recursive: true });
  dir = mkdtempSync(join('test/.tmp', 'reward-faults-'));
  const specs: [string, Record<string, string>][] = [
    ['victim', { REWARD_FAULT: 'delay=40' }],
    ['stall', { REWARD_FAULT: 'stall' }],
    ['throws', { REWARD_FAULT: 'throw' }],
    ['healthyA', {}],
    ['healthyB', {}],
  ];
  const started = await Promise.all(
    specs.map(([, env]) =>
      startRewardServers({ scorer: FAULTY_SCORER, logDir: dir, env, args: ['--shutdown-grace-ms', '0'] }),
    ),
  );
  specs.forEach(([name], i) => {
    groups[name] = started[i];
  });
  faulty.malformed = await startFaultyServer('malformed');
  faulty.nan = await startFaultyServer('nan');
});

after(async () => {
  for (const g of Object.values(groups)) await g.stop('SIGKILL');
  for (const f of Object.values(faulty)) await f.close();
  rmSync(dir, { recursive: true, force: true });
});

const url = (name: string) => groups[name]?.servers[0].url ?? faulty[name].url;
const key = (name: string) => groups[name]?.servers[0].key ?? faulty[name].key;

function makeItems(n: number): RewardRequestItem[] {
  return Array.from({ length: n }, (_, i) => ({
    id: `traj-${i}`,
    step: 4,
    prompt_text: `say the word ${i % 4 ? 'apple' : 'pear'}`,
    response_text: i % 3 ? 'apple' : 'pear tree',
    ground_truth: 'apple',
  }));
}

function expected(it: RewardRequestItem): number {
  const r = exampleScore({
    prompt: it.prompt_text,
    response: it.response_text,
    ground_truth: it.ground_truth,
    extra: {},
  }) as Record<string, number>;
  return 0.5 * r.vlm_score + 0.5 * r.ocr_confidence;
}

function assertNothingLostNoFabrication(items: RewardRequestItem[], outs: RewardOutcome[]): void {
  assert.equal(outs.length, items.length, 'one outcome per trajectory');
  assert.deepEqual(
    outs.map((o) => o.id),
    items.map((i) => i.id),
    'every trajectory accounted for, in order',
  );
  for (const o of outs) {
    if (o.ok) assert.ok(Number.isFinite(o.reward));
    else assert.equal((o as Record<string, unknown>).reward, undefined, `failed ${o.id} must not carry a reward`);
  }
}

test('killed, stalled, 500, malformed and NaN servers: every trajectory is scored by a healthy one (failover)', async () => {
  const names = ['victim', 'stall', 'throws', 'malformed', 'nan', 'healthyA', 'healthyB'];
  const c = createRemoteRewardClient(
    withRemoteDefaults({
      enabled: true,
      urls: names.map(url),
      request_preset: 'text',
      timeout_ms: 1500,
      max_retries: 10,
      backoff_initial_ms: 20,
      backoff_max_ms: 200,
      concurrency_per_server: 2,
      breaker: { failure_threshold: 2, reset_timeout_ms: 60_000, probe_interval_ms: 200 },
    }),
    { replicaIndex: 0 },
  ); // affinity: server 0, the victim
  const items = makeItems(80);
  const run = c.scoreBatch(items);
  // kill the victim once it has served part of the run (bounded wait)
  const victimKey = `reward_server/${key('victim')}/requests_total`;
  for (let i = 0; i < 400 && c.metrics()[victimKey] < 3; i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(c.metrics()[victimKey] >= 3, 'the victim served requests before it was killed');
  process.kill(groups.victim.servers[0].pid, 'SIGKILL');
  const outs = await run;
  const m = c.metrics();
  c.close();

  assertNothingLostNoFabrication(items, outs);
  const allowed = new Set([key('healthyA'), key('healthyB'), key('victim')]);
  for (const [i, o] of outs.entries()) {
    assert.ok(o.ok, `trajectory ${o.id} not scored: ${JSON.stringify(o)}`);
    assert.ok(allowed.has(o.server), `${o.id} scored by ${o.server}, which is broken`);
    assert.ok(Math.abs(o.reward - expected(items[i])) < 1e-12, `${o.id}: reward ${o.reward} is not the scorer's`);
  }
  assert.ok(
    outs.some((o) => o.ok && o.server !== key('victim')),
    'healthy servers took over',
  );
  for (const name of ['stall', 'throws', 'malformed', 'nan']) {
    assert.ok(m[`reward_server/${key(name)}/errors_total`] >= 2, `${name} was tried and failed`);
    assert.equal(m[`reward_server/${key(name)}/breaker_open`], 1, `${name}'s breaker opened`);
  }
  assert.ok(m[`reward_server/${key('victim')}/errors_total`] >= 1, "the killed server's failures were seen");
  assert.equal(m['reward/failures'], 0);
  assert.ok(m['reward/retries'] >= 8);
  assert.equal(
    decideOnFailures(
      outs,
      { group_id: 'step4', expected_ids: items.map((i) => i.id), attempt: 0, max_attempts: 3 },
      'stop',
    ).action,
    'emit',
  );
});

test('only broken servers left: recorded failures with reasons and bodies; on_failure = stop names the server and the error', async () => {
  const names = ['victim', 'throws', 'malformed', 'nan'];
  const c = createRemoteRewardClient(
    withRemoteDefaults({
      enabled: true,
      urls: names.map(url),
      request_preset: 'text',
      timeout_ms: 1500,
      max_retries: 4,
      backoff_initial_ms: 10,
      backoff_max_ms: 50,
      concurrency_per_server: 2,
      breaker: { failure_threshold: 3, reset_timeout_ms: 100, probe_interval_ms: 50 },
    }),
    { replicaIndex: 1 },
  );
  const items = makeItems(12);
  const outs = await c.scoreBatch(items);
  const m = c.metrics();
  c.close();
  assertNothingLostNoFabrication(items, outs);
  const serverErr = new RegExp(
    `(${names.map((n) => key(n).replace(/\./g, '\\.')).join('|')}): (connection failed: ECONNREFUSED|HTTP 500: scorer failed: injected fault|malformed response)`,
  );
  for (const o of outs) {
    assert.equal(o.ok, false);
    if (o.ok) continue;
    assert.match(o.reason, serverErr);
  }
  assert.ok(
    outs.some((o) => !o.ok && o.body !== undefined),
    'offending bodies are kept',
  );
  assert.equal(m['reward/failures'], items.length);
  const d = decideOnFailures(
    outs,
    { group_id: 'step4', expected_ids: items.map((i) => i.id), attempt: 0, max_attempts: 3 },
    'stop',
  );
  assert.equal(d.action, 'stop');
  assert.match(d.message!, /12 of 12 trajectories in group step4 could not be scored/);
  assert.match(d.message!, serverErr);
  assert.equal(
    decideOnFailures(
      outs,
      { group_id: 'step4', expected_ids: items.map((i) => i.id), attempt: 0, max_attempts: 3 },
      'drop_group',
    ).action,
    'drop_group',
  );
});

test('a stalled server alone: the per-request timeout fires and the item fails as retriable, not as zero', async () => {
  const c = createRemoteRewardClient(
    withRemoteDefaults({
      enabled: true,
      urls: [url('stall')],
      request_preset: 'text',
      timeout_ms: 300,
      max_retries: 1,
      backoff_initial_ms: 10,
      backoff_max_ms: 20,
    }),
    { replicaIndex: 0 },
  );
  const items = makeItems(2);
  const outs = await c.scoreBatch(items);
  c.close();
  assertNothingLostNoFabrication(items, outs);
  for (const o of outs) {
    assert.ok(!o.ok);
    assert.equal(o.retriable, true);
    assert.match(
      o.reason,
      new RegExp(`${key('stall').replace(/\./g, '\\.')}: no response within 300 ms \\(timeout\\)`),
    );
  }
  assert.equal(
    decideOnFailures(
      outs,
      { group_id: 'g', expected_ids: items.map((i) => i.id), attempt: 0, max_attempts: 2 },
      'retry',
    ).action,
    'retry_later',
  );
});
