import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import {
  configSchema,
  defaultConfig,
  schemaDefaults,
  renderConfigDocs,
  ADV_ESTIMATORS,
} from '../../../lib/config/index.ts';
import { schemaEntries } from '../../../lib/config/introspect.ts';

test('every section and key is described and has a default', () => {
  const entries = schemaEntries(configSchema);
  assert.ok(entries.length > 150, `only ${entries.length} entries`);
  const undescribed = entries.filter((e) => !e.description || e.description.length < 8).map((e) => e.path.join('.'));
  assert.deepEqual(undescribed, []);
  const noDefault = entries.filter((e) => !e.hasDefault).map((e) => e.path.join('.'));
  assert.deepEqual(noDefault, []);
  const notSnake = entries
    .filter((e) => !/^[a-z][a-z0-9_]*$/.test(e.path[e.path.length - 1]))
    .map((e) => e.path.join('.'));
  assert.deepEqual(notSnake, []);
});

test('the schema is strict at every level', () => {
  for (const e of schemaEntries(configSchema).filter((x) => x.section)) {
    const value: Record<string, unknown> = {};
    let cur = value;
    for (const seg of e.path) {
      cur[seg] = {};
      cur = cur[seg] as Record<string, unknown>;
    }
    cur.not_a_key = 1;
    const r = configSchema.safeParse(value);
    assert.ok(
      !r.success && r.error.issues.some((i) => i.code === 'unrecognized_keys'),
      `${e.path.join('.')} accepts unknown keys`,
    );
  }
});

test('defaults follow verl/EasyR1 where the concept is the same', () => {
  const d = schemaDefaults();
  assert.equal(d.algorithm.adv_estimator, 'grpo');
  assert.equal(d.algorithm.kl_penalty, 'low_var_kl');
  assert.equal(d.algorithm.kl_coef, 1e-3);
  assert.equal(d.algorithm.use_kl_loss, true);
  assert.equal(d.algorithm.use_kl_in_reward, false);
  assert.equal(d.algorithm.filter_low, 0.01);
  assert.equal(d.algorithm.filter_high, 0.99);
  assert.equal(d.rollout.n, 5);
  assert.deepEqual(d.rollout.val_override, { temperature: 0.6, top_p: 0.95, n: 1, top_k: null });
  assert.equal(d.actor.optim.lr, 1e-6);
  assert.deepEqual(d.actor.optim.betas, [0.9, 0.999]);
  assert.equal(d.actor.clip_ratio_low, 0.2);
  assert.equal(d.actor.clip_ratio_high, 0.3);
  assert.equal(d.actor.clip_ratio_dual, 3.0);
  assert.equal(d.actor.loss_agg_mode, 'token-mean');
  assert.equal(d.critic.cliprange_value, 0.5);
  assert.equal(d.reward.on_failure, 'retry');
  assert.deepEqual(d.reward.remote.response_mapping.weights, { vlm_score: 0.5, ocr_confidence: 0.5 });
  assert.equal(d.trainer.val_freq, -1);
  assert.equal(d.pipeline.max_staleness, 0);
  assert.equal(ADV_ESTIMATORS.length, 13);
});

test('defaultConfig fills derived values and returns fresh objects', () => {
  const a = defaultConfig();
  assert.equal(a.algorithm.kl_loss_type, 'low_var_kl');
  assert.equal(a.trainer.run_dir, 'runs/default');
  assert.match(a.pipeline.run_id!, /^rlstream-default-[0-9a-f]{8}$/);
  a.reward.remote.response_mapping.weights.extra = 1;
  a.actor.optim.betas[0] = 0.5;
  const b = defaultConfig();
  assert.deepEqual(b.reward.remote.response_mapping.weights, { vlm_score: 0.5, ocr_confidence: 0.5 });
  assert.deepEqual(b.actor.optim.betas, [0.9, 0.999]);
});

test('docs/config.md is what scripts/gen-config-docs.ts generates', () => {
  const path = fileURLToPath(new URL('../../../docs/config.md', import.meta.url));
  const committed = readFileSync(path, 'utf8');
  assert.ok(
    committed === renderConfigDocs(),
    'docs/config.md is stale: run node --import tsx scripts/gen-config-docs.ts',
  );
  for (const key of [
    '`rollout_batch_size`',
    '`optim.lr`',
    '`remote.breaker.failure_threshold`',
    '`database_url`',
    'DISABLE_RL_REWARD_MODEL',
  ]) {
    assert.ok(committed.includes(key), key);
  }
});
