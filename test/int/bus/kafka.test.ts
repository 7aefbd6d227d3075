/**
 * The bus contract against Kafka: librdkafka's mock cluster started for this file
 * (devkit/kafka-mock.ts), or the real broker in KAFKA_BROKERS.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { runBusContract } from '../../support/bus-contract.ts';
import { startKafka } from '../../../devkit/kafka-mock.ts';
import { createKafkaBus } from '../../../lib/bus/kafka-log.ts';

runBusContract('kafka', async () => {
  const kafka = await startKafka();
  // The idempotent producer needs the mock's controller-id fix; exercise it whenever it works.
  const bus = createKafkaBus({
    brokers: kafka.brokers,
    clientId: 'rlstream-contract',
    idempotent: kafka.controllerFixed,
  });
  return {
    bus,
    async cleanup() {
      await bus.close();
      await kafka.stop();
    },
  };
});

describe(
  'kafka consumer: group glitches',
  { timeout: 120_000, skip: process.env.KAFKA_BROKERS ? 'fault injection needs the mock broker' : false },
  () => {
    test("a SyncGroup answered INVALID_REQUEST (the mock's join race) → the consumer joins again and consumes everything", async () => {
      // ApiKey 14 = SyncGroup, error 42 = INVALID_REQUEST: what the librdkafka mock answers when two
      // members' joins race. kafkajs treats it as fatal and leaves the group.
      const kafka = await startKafka({ requestErrors: { 14: [42, 42] } });
      const bus = createKafkaBus({ brokers: kafka.brokers, clientId: 'rlstream-glitch' });
      try {
        const t = 'glitch.in';
        await bus.ensureTopics([{ name: t, partitions: 4 }]);
        await bus.produce(
          Array.from({ length: 30 }, (_, i) => ({ topic: t, key: `k${i}`, value: Buffer.from(`v${i}`) })),
        );
        const seen = new Set<string>();
        const c = bus.consumer({ group: 'glitch', topics: [t] });
        let failed: unknown;
        const running = c
          .run(async (batch) => {
            for (const m of batch) seen.add(m.value.toString());
          })
          .catch((e: unknown) => {
            failed = e;
          });
        const deadline = Date.now() + 60_000;
        while (seen.size < 30 && !failed && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
        await c.stop();
        await running;
        assert.equal(failed, undefined, `the consumer failed: ${String(failed)}`);
        assert.equal(seen.size, 30);
      } finally {
        await bus.close();
        await kafka.stop();
      }
    });
  },
);
