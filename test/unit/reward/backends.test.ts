/**
 * The reward backend registry (lib/reward/backends.ts): its names are `reward.type`'s, the config
 * schema accepts exactly those, and an unknown name — in the config or asked of the registry —
 * is answered with the valid ones.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRewardBackend, rewardBackends } from '../../../lib/reward/backends.ts';
import { REWARD_TYPES } from '../../../lib/reward/types.ts';
import { defaultConfig, loadConfig } from '../../../lib/config/index.ts';
import { ConfigError } from '../../../lib/errors.ts';
import { silentLogger } from '../../../lib/log.ts';

test('the registry holds one backend per reward.type name, and the schema accepts exactly those', () => {
  assert.deepEqual(rewardBackends.names(), [...REWARD_TYPES].sort());
  for (const t of REWARD_TYPES) assert.ok(rewardBackends.has(t), t);
  assert.equal(defaultConfig().reward.type, 'function');
  assert.throws(
    () => loadConfig({ env: {}, overrides: ['data.task=number_game', 'reward.type=grpc'] }),
    (e: unknown) => e instanceof ConfigError && REWARD_TYPES.every((t) => e.message.includes(t)),
  );
});

test('an unknown backend name lists the valid ones', async () => {
  const cfg = defaultConfig();
  await assert.rejects(
    createRewardBackend({ cfg, log: silentLogger(), replicaIndex: 0, env: {} }, 'grpc'),
    (e: unknown) =>
      e instanceof ConfigError && /unknown reward\.type "grpc" — valid: function, model, remote/.test(e.message),
  );
});
