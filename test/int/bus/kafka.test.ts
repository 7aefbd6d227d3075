/**
 * The bus contract against Kafka: librdkafka's mock cluster started for this file
 * (test/support/kafka-mock.ts), or the real broker in KAFKA_BROKERS.
 */
import { runBusContract } from '../../support/bus-contract.ts';
import { startKafka } from '../../support/kafka-mock.ts';
import { createKafkaBus } from '../../../lib/bus/kafka-log.ts';

runBusContract('kafka', async () => {
  const kafka = await startKafka();
  // The idempotent producer needs the mock's controller-id fix; exercise it whenever it works.
  const bus = createKafkaBus({ brokers: kafka.brokers, clientId: 'rlstream-contract', idempotent: kafka.controllerFixed });
  return {
    bus,
    async cleanup() {
      await bus.close();
      await kafka.stop();
    },
  };
});
