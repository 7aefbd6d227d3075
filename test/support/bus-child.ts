/**
 * A consumer process for the embedded log's crash tests (test/int/bus/embedded-*.test.ts); the
 * parent kills it with SIGKILL mid-run. Usage:
 *   node --import tsx test/support/bus-child.ts '<json ChildSpec>'
 * For every input message it sends one output `{ p, o }` (source partition and offset) keyed by
 * the input key, and before each batch it appends a tick to `ticks` (numbered 0, 1, 2, …) outside
 * the batch, so the parent can check that committed appends are dense after the crash. It prints
 * `ready` once consuming and `batch <n>` after each handled batch.
 */
import { openDatabase, type DatabaseTarget } from '../../lib/db/database.ts';
import { createEmbeddedBus } from '../../lib/bus/embedded-log.ts';
import { sleep } from '../../lib/bus/delivery.ts';

export interface ChildSpec {
  target: DatabaseTarget;
  group: string;
  input: string;
  output: string;
  ticks: string;
  maxBatchMessages: number;
  /** Pause inside each handler (ms), so the parent's kill lands mid-batch. */
  handlerDelayMs: number;
  sessionTimeoutMs?: number;
  heartbeatIntervalMs?: number;
}

const spec = JSON.parse(process.argv[2] ?? '') as ChildSpec;
const database = await openDatabase(spec.target);
const bus = createEmbeddedBus({
  database,
  sessionTimeoutMs: spec.sessionTimeoutMs,
  heartbeatIntervalMs: spec.heartbeatIntervalMs,
});
let ticks = 0;
let batches = 0;
const consumer = bus.consumer({ group: spec.group, topics: [spec.input], maxBatchMessages: spec.maxBatchMessages });
const running = consumer.run(async (batch, ctx) => {
  ctx.send(
    batch.map((m) => ({
      topic: spec.output,
      key: m.key ?? '',
      value: Buffer.from(JSON.stringify({ p: m.partition, o: m.offset })),
    })),
  );
  await sleep(spec.handlerDelayMs);
  batches++;
  queueMicrotask(() => process.stdout.write(`batch ${batches}\n`));
});
// Appends outside the batches, racing them for the (PGlite: single) connection.
const ticking = (async () => {
  while (true) {
    await bus.produce([{ topic: spec.ticks, key: 'tick', value: Buffer.from(String(ticks)) }]);
    ticks++;
    await sleep(spec.handlerDelayMs);
  }
})();
process.stdout.write('ready\n');
await Promise.race([running, ticking]);
