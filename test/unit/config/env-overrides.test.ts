/** RLSTREAM_<SECTION>__<KEY> environment overrides: after the file, before the CLI overrides, YAML-parsed, secrets never shown. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig, envOverrides } from '../../../lib/config/load.ts';
import { ConfigError } from '../../../lib/errors.ts';

const dir = mkdtempSync(join(tmpdir(), 'rl-env-'));
const file = join(dir, 'c.yaml');
writeFileSync(
  file,
  'data:\n  task: number_game\npipeline:\n  partitions: 3\n  bus: embedded\ntrainer:\n  max_steps: 5\n  val_before_train: false\n',
);

test('env overrides map RLSTREAM_A__B__C to a.b.c, parsed as YAML', () => {
  const cfg = loadConfig({
    file,
    onWarning: () => undefined,
    env: {
      RLSTREAM_PIPELINE__BUS: 'kafka',
      RLSTREAM_PIPELINE__BROKERS: '[kafka-0:9092, kafka-1:9092]',
      RLSTREAM_PIPELINE__PARTITIONS: '4',
      RLSTREAM_PIPELINE__KAFKA__SESSION_TIMEOUT_MS: '9000',
      RLSTREAM_PIPELINE__STORE: 'postgres',
      RLSTREAM_PIPELINE__DATABASE_URL: 'postgres://u:pw@db:5432/rl',
      // not config: no "__"
      RLSTREAM_LOG_JSON: '1',
      RLSTREAM_TEST_PG_URL: 'x',
    },
  });
  assert.equal(cfg.pipeline.bus, 'kafka');
  assert.deepEqual(cfg.pipeline.brokers, ['kafka-0:9092', 'kafka-1:9092']);
  assert.equal(cfg.pipeline.partitions, 4, 'the environment wins over the file');
  assert.equal(cfg.pipeline.kafka.session_timeout_ms, 9000);
  assert.equal(cfg.pipeline.database_url, 'postgres://u:pw@db:5432/rl');
  assert.equal(cfg.trainer.max_steps, 5, 'the file still applies where the environment is silent');
});

test('command-line overrides win over the environment', () => {
  const cfg = loadConfig({
    file,
    overrides: ['pipeline.partitions=7'],
    env: { RLSTREAM_PIPELINE__PARTITIONS: '4' },
    onWarning: () => undefined,
  });
  assert.equal(cfg.pipeline.partitions, 7);
});

test('a bad environment value names the variable, never a secret value', () => {
  assert.throws(
    () =>
      loadConfig({
        env: {
          RLSTREAM_PIPELINE__PARTITIONS: 'many',
          RLSTREAM_PIPELINE__DATABASE_URL: 'mysql://u:hunter2@db/x',
          RLSTREAM_PIPELINE__STORE: 'postgres',
        },
        onWarning: () => undefined,
      }),
    (e: unknown) => {
      assert.ok(e instanceof ConfigError);
      assert.match(e.message, /environment RLSTREAM_PIPELINE__PARTITIONS: pipeline\.partitions: expected/);
      assert.doesNotMatch(e.message, /hunter2/);
      return true;
    },
  );
  assert.throws(
    () => loadConfig({ env: { RLSTREAM_PIPELINE__PARTITONS: '4' }, onWarning: () => undefined }),
    /environment RLSTREAM_PIPELINE__PARTITONS: unknown key "pipeline.partitons" — did you mean "pipeline.partitions"\?/,
  );
});

test('envOverrides lists only RLSTREAM_*__* names, sorted', () => {
  assert.deepEqual(
    envOverrides({ RLSTREAM_B__X: '1', RLSTREAM_A__Y: '2', RLSTREAM_DEBUG: '1', OTHER__Z: '3' }).map((o) => o.text),
    ['a.y=2', 'b.x=1'],
  );
});
