/** pipeline.kafka.sasl / tls → kafkajs options (lib/bus/kafka-security.ts). */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig, formatResolvedConfig } from '../../../lib/config/index.ts';
import { kafkaSecurity } from '../../../lib/bus/kafka-security.ts';

const tmp = mkdtempSync(join(tmpdir(), 'rl-kafka-sec-'));
after(() => rmSync(tmp, { recursive: true, force: true }));
const kafka = (overrides: string[]) =>
  loadConfig({
    env: {},
    onWarning: () => undefined,
    overrides: [
      'data.task=number_game',
      'trainer.val_before_train=false',
      'pipeline.bus=kafka',
      'pipeline.brokers=[b:9093]',
      ...overrides,
    ],
  });

test('default: plaintext, no authentication', () => {
  assert.deepEqual(kafkaSecurity(kafka([]).pipeline.kafka, {}), {});
});

test('SCRAM-SHA-512 with the password from the environment; the password is never in the printed config', () => {
  const cfg = kafka(['pipeline.kafka.sasl.mechanism=scram-sha-512', 'pipeline.kafka.sasl.username=rl']);
  assert.deepEqual(kafkaSecurity(cfg.pipeline.kafka, { KAFKA_PASSWORD: 's3cret' }), {
    sasl: { mechanism: 'scram-sha-512', username: 'rl', password: 's3cret' },
  });
  assert.ok(!formatResolvedConfig(cfg).includes('s3cret'));
  assert.throws(
    () => kafkaSecurity(cfg.pipeline.kafka, {}),
    /needs the password in the environment variable KAFKA_PASSWORD \(pipeline\.kafka\.sasl\.password_env\)/,
  );
  const plain = kafka([
    'pipeline.kafka.sasl.mechanism=plain',
    'pipeline.kafka.sasl.username_env=CC_KEY',
    'pipeline.kafka.sasl.password_env=CC_SECRET',
  ]);
  assert.deepEqual(kafkaSecurity(plain.pipeline.kafka, { CC_KEY: 'key', CC_SECRET: 'sec' }).sasl, {
    mechanism: 'plain',
    username: 'key',
    password: 'sec',
  });
  assert.throws(() => kafkaSecurity(plain.pipeline.kafka, { CC_SECRET: 'sec' }), /the environment variable CC_KEY/);
});

test('TLS: CA, client certificate and key read from files; a missing file or half a pair says what to set', () => {
  writeFileSync(join(tmp, 'ca.crt'), 'CA PEM');
  writeFileSync(join(tmp, 'user.crt'), 'CERT PEM');
  writeFileSync(join(tmp, 'user.key'), 'KEY PEM');
  const cfg = kafka([
    `pipeline.kafka.tls.ca_file=${join(tmp, 'ca.crt')}`,
    `pipeline.kafka.tls.cert_file=${join(tmp, 'user.crt')}`,
    `pipeline.kafka.tls.key_file=${join(tmp, 'user.key')}`,
    'pipeline.kafka.tls.servername=kafka.example',
  ]);
  assert.deepEqual(kafkaSecurity(cfg.pipeline.kafka, {}), {
    ssl: { rejectUnauthorized: true, ca: ['CA PEM'], cert: 'CERT PEM', key: 'KEY PEM', servername: 'kafka.example' },
  });
  assert.deepEqual(kafkaSecurity(kafka(['pipeline.kafka.tls.enabled=true']).pipeline.kafka, {}), {
    ssl: { rejectUnauthorized: true },
  });
  assert.throws(
    () => kafkaSecurity(kafka([`pipeline.kafka.tls.cert_file=${join(tmp, 'user.crt')}`]).pipeline.kafka, {}),
    /tls\.cert_file needs pipeline\.kafka\.tls\.key_file/,
  );
  assert.throws(
    () => kafkaSecurity(kafka([`pipeline.kafka.tls.ca_file=${join(tmp, 'none.crt')}`]).pipeline.kafka, {}),
    /pipeline\.kafka\.tls\.ca_file: cannot read .*none\.crt \(ENOENT\)/,
  );
});
