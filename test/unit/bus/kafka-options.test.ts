/** Kafka bus options that are checked before any connection: producer acknowledgements. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createKafkaBus } from '../../../lib/bus/kafka-log.ts';
import { ConfigError } from '../../../lib/errors.ts';

test('acks is -1 unless set; 0 and 1 pass through; other values and a non-idempotent-safe mix are refused', async () => {
  const byDefault = createKafkaBus({ brokers: ['127.0.0.1:1'] });
  assert.equal(byDefault.opts.acks, -1);
  const leader = createKafkaBus({ brokers: ['127.0.0.1:1'], acks: 1 });
  assert.equal(leader.opts.acks, 1);
  assert.throws(
    () => createKafkaBus({ brokers: ['127.0.0.1:1'], acks: 2 as never }),
    (e) => e instanceof ConfigError && /acks must be -1 \(all\), 0 or 1, got 2/.test(e.message),
  );
  assert.throws(
    () => createKafkaBus({ brokers: ['127.0.0.1:1'], idempotent: true, acks: 1 }),
    (e) => e instanceof ConfigError && /idempotent producer needs acks = -1/.test(e.message),
  );
  await byDefault.close();
  await leader.close();
});
