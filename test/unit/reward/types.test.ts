import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError } from '../../../lib/errors.ts';
import { defaultConfig } from '../../../lib/config/index.ts';
import {
  isRemoteRewardEnabled,
  resolveServerEndpoints,
  withRemoteDefaults,
  REMOTE_REWARD_DEFAULTS,
  type RemoteRewardOptions,
  type RewardModelOptions,
  type OnFailurePolicy,
} from '../../../lib/reward/types.ts';

test('the parsed run config sections can be passed straight in (same snake_case names and defaults)', () => {
  const cfg = defaultConfig();
  const remote: RemoteRewardOptions = cfg.reward.remote; // compile-time compatibility
  const model: RewardModelOptions = cfg.reward.model;
  const policy: OnFailurePolicy = cfg.reward.on_failure;
  assert.ok(model && policy);
  for (const k of [
    'request_preset',
    'auth_header',
    'auth_scheme',
    'timeout_ms',
    'max_retries',
    'backoff_initial_ms',
    'backoff_max_ms',
    'concurrency_per_server',
    'batch_size',
    'batch_budget_ms',
  ] as const) {
    assert.deepEqual(remote[k], REMOTE_REWARD_DEFAULTS[k], k);
  }
  assert.deepEqual(remote.breaker, REMOTE_REWARD_DEFAULTS.breaker);
  assert.deepEqual(remote.response_mapping, REMOTE_REWARD_DEFAULTS.response_mapping);
  assert.deepEqual(
    resolveServerEndpoints({ ...remote, host: 'rm.local' }).map((e) => e.scoreUrl),
    ['http://rm.local:8000/score'],
  );
});

test('seed-style host + start_port + count, or a URL list (with or without /score)', () => {
  assert.deepEqual(resolveServerEndpoints({ host: '10.0.0.5', start_port: 8000, count: 3 }), [
    { key: '10.0.0.5:8000', scoreUrl: 'http://10.0.0.5:8000/score', healthUrl: 'http://10.0.0.5:8000/healthz' },
    { key: '10.0.0.5:8001', scoreUrl: 'http://10.0.0.5:8001/score', healthUrl: 'http://10.0.0.5:8001/healthz' },
    { key: '10.0.0.5:8002', scoreUrl: 'http://10.0.0.5:8002/score', healthUrl: 'http://10.0.0.5:8002/healthz' },
  ]);
  const eps = resolveServerEndpoints({ urls: ['http://a:1/', 'https://b:2/score', 'http://c:3/api/rm'] });
  assert.deepEqual(
    eps.map((e) => e.scoreUrl),
    ['http://a:1/score', 'https://b:2/score', 'http://c:3/api/rm/score'],
  );
  assert.deepEqual(
    eps.map((e) => e.healthUrl),
    ['http://a:1/healthz', 'https://b:2/healthz', 'http://c:3/api/rm/healthz'],
  );
});

test('bad server lists are ConfigErrors that say what to set', () => {
  const bad: [Parameters<typeof resolveServerEndpoints>[0], RegExp][] = [
    [{}, /no reward servers configured — set `urls/],
    [{ urls: ['http://a:1'], host: 'x' }, /both set/],
    [{ urls: ['not a url'] }, /is not a URL/],
    [{ urls: ['ftp://a:1'] }, /must be http/],
    [{ urls: ['http://a:1', 'http://a:1/score'] }, /listed twice/],
    [{ host: 'h', start_port: 65535, count: 2 }, /valid ports/],
  ];
  for (const [o, re] of bad)
    assert.throws(
      () => resolveServerEndpoints(o),
      (e: Error) => e instanceof ConfigError && re.test(e.message),
      JSON.stringify(o),
    );
});

test('debug mode: enabled false or DISABLE_RL_REWARD_MODEL=true switches remote rewards off', () => {
  const on = withRemoteDefaults({ enabled: true });
  assert.equal(isRemoteRewardEnabled(on, {}), true);
  assert.equal(isRemoteRewardEnabled({ enabled: null }, {}), true);
  assert.equal(isRemoteRewardEnabled({ enabled: false }, {}), false);
  for (const v of ['true', 'TRUE', '1', 'yes'])
    assert.equal(isRemoteRewardEnabled(on, { DISABLE_RL_REWARD_MODEL: v }), false, v);
  for (const v of ['false', '0', '']) assert.equal(isRemoteRewardEnabled(on, { DISABLE_RL_REWARD_MODEL: v }), true, v);
  assert.equal(isRemoteRewardEnabled(undefined, {}), false);
});
