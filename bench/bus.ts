/**
 * Event bus throughput with 64 KB messages in 1 MB batches (16 messages), for the embedded log
 * on PGlite, the embedded log on PostgreSQL, and Kafka (librdkafka's mock broker, or
 * KAFKA_BROKERS). Per adapter:
 *   - produce: produce() calls of one batch each (keyed, 4 partitions), until durable;
 *   - consume: a consumer group reading the topic in 1 MB batches and committing each;
 *   - stage: consume a batch and ctx.send one 64 KB output per input (what a pipeline stage does):
 *     outputs durable and offsets committed per batch.
 * Consume timings start at the first batch (Kafka's group join is not counted). The mock broker
 * keeps only about the last 5 MB of each partition, so the default stays at 3 MB per partition.
 *
 *   node --import tsx bench/bus.ts
 *   RLSTREAM_BENCH_SKIP=pglite,postgres,kafka   leave some out
 *   RLSTREAM_BENCH_BUS_MB=24                    MB per topic (default 24, over 8 partitions)
 *   PostgreSQL: RLSTREAM_BENCH_PG_URL, else RLSTREAM_TEST_PG_URL, else postgres://postgres@127.0.0.1:5432/test
 * Topics and groups are named bench-bus-…; on PostgreSQL they are deleted afterwards.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { openDatabase, type Database } from '../lib/db/database.ts';
import { createEmbeddedBus } from '../lib/bus/embedded-log.ts';
import { createKafkaBus } from '../lib/bus/kafka-log.ts';
import type { BatchHandler, EventBus } from '../lib/bus/port.ts';
import { errorMessage } from '../lib/errors.ts';
import { startKafka } from '../devkit/kafka-mock.ts';

export interface Row {
  name: string;
  value: number;
  unit: string;
  /** The value should be at least this. */
  goal?: number;
}

const MESSAGE_BYTES = 64 * 1024;
const BATCH = 16;
const PARTITIONS = 8;

const round = (x: number) => (x >= 100 ? Math.round(x) : Math.round(x * 10) / 10);

const debug = (...a: unknown[]) => {
  if (process.env.RLSTREAM_BENCH_DEBUG) console.error(...a);
};

async function consumeAll(
  bus: EventBus,
  group: string,
  topic: string,
  total: number,
  handler?: BatchHandler,
): Promise<{ seconds: number; batches: number; bytes: number }> {
  const c = bus.consumer({ group, topics: [topic], maxBatchMessages: BATCH, maxBatchBytes: BATCH * MESSAGE_BYTES });
  let count = 0;
  let batches = 0;
  let bytes = 0;
  let t0 = 0;
  let failed: unknown;
  const running = c
    .run(async (batch, ctx) => {
      if (!t0) t0 = performance.now();
      if (handler) await handler(batch, ctx);
      batches++;
      count += batch.length;
      for (const m of batch) bytes += m.value.length;
      if (batches % 50 === 0) debug(group, 'batches', batches, 'messages', count, '/', total);
    })
    .catch((e) => {
      failed = e;
    });
  // Done when the group has committed everything (the last commit follows the last handler).
  while (!failed) {
    const committed = (await c.committed()).reduce((a, x) => a + x.offset, 0);
    if (committed >= total) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  const t1 = performance.now();
  await c.stop();
  await running;
  if (failed) throw failed;
  if (count !== total) throw new Error(`${group}: consumed ${count} messages, expected ${total}`);
  return { seconds: (t1 - t0) / 1000, batches, bytes };
}

async function measure(label: string, bus: EventBus, prefix: string, megabytes: number): Promise<Row[]> {
  const total = Math.max(BATCH, Math.floor((megabytes * 1024 * 1024) / MESSAGE_BYTES / BATCH) * BATCH);
  const [input, output] = [`${prefix}.in`, `${prefix}.out`];
  await bus.ensureTopics([
    { name: input, partitions: PARTITIONS },
    { name: output, partitions: PARTITIONS },
  ]);
  const payload = randomBytes(MESSAGE_BYTES);
  // Produce: one call per 1 MB batch.
  const t = performance.now();
  for (let i = 0; i < total; i += BATCH) {
    // A batch is two prompt groups of 8 samples; batches go round-robin over the partitions.
    await bus.produce(
      Array.from({ length: BATCH }, (_, j) => ({
        topic: input,
        key: `prompt-${(i + j) >> 3}`,
        partition: (i / BATCH) % PARTITIONS,
        value: payload,
      })),
    );
  }
  const produceS = (performance.now() - t) / 1000;
  debug(label, 'produced', total, await bus.endOffsets(input));
  const produced = await bus.endOffsets(input);
  for (let p = 0; p < PARTITIONS; p++) {
    const first = await bus.read(input, p, 0, 1);
    if (produced[p] > 0 && first[0]?.offset !== 0)
      throw new Error(
        `${label}: partition ${p} does not start at offset 0: the broker dropped old messages (the mock keeps ~5 MB per partition); lower RLSTREAM_BENCH_BUS_MB`,
      );
  }
  const mb = (total * MESSAGE_BYTES) / 1e6;
  const consume = await consumeAll(bus, `${prefix}-consume`, input, total);
  const stage = await consumeAll(bus, `${prefix}-stage`, input, total, async (batch, ctx) => {
    ctx.send(batch.map((m) => ({ topic: output, key: m.key ?? '', value: m.value })));
  });
  const ends = await bus.endOffsets(output);
  if (ends.reduce((a, b) => a + b, 0) !== total)
    throw new Error(`${label}: the stage wrote ${ends.reduce((a, b) => a + b, 0)} outputs, expected ${total}`);
  return [
    { name: `bus/${label}/produce (64 KB msgs, 1 MB calls)`, value: round(mb / produceS), unit: 'MB/s' },
    { name: `bus/${label}/produce`, value: round(total / BATCH / produceS), unit: 'batch/s' },
    {
      name: `bus/${label}/consume+commit (1 MB batches)`,
      value: round(consume.bytes / 1e6 / consume.seconds),
      unit: 'MB/s',
    },
    { name: `bus/${label}/consume+commit`, value: round(consume.batches / consume.seconds), unit: 'batch/s' },
    {
      name: `bus/${label}/stage (consume, send 1:1, commit)`,
      value: round(stage.bytes / 1e6 / stage.seconds),
      unit: 'MB/s',
    },
    { name: `bus/${label}/stage`, value: round(stage.batches / stage.seconds), unit: 'batch/s' },
  ];
}

async function dropPrefix(database: Database, prefix: string): Promise<void> {
  const like = `${prefix}%`;
  await sql`delete from bus_messages where topic like ${like}`.execute(database.db);
  await sql`delete from bus_topics where name like ${like}`.execute(database.db);
  await sql`delete from bus_offsets where group_id like ${like}`.execute(database.db);
  await sql`delete from bus_members where group_id like ${like}`.execute(database.db);
}

export async function run(): Promise<Row[]> {
  const skip = new Set(
    (process.env.RLSTREAM_BENCH_SKIP ?? '')
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean),
  );
  const mb = Number(process.env.RLSTREAM_BENCH_BUS_MB ?? 24);
  const prefix = `bench-bus-${Date.now().toString(36)}`;
  const rows: Row[] = [];

  if (!skip.has('pglite')) {
    const dir = mkdtempSync(join(tmpdir(), 'rlstream-bench-bus-'));
    const database = await openDatabase({ kind: 'pglite', dir });
    const bus = createEmbeddedBus({ database });
    try {
      rows.push(...(await measure('embedded-pglite', bus, `${prefix}-pglite`, mb)));
    } finally {
      await bus.close();
      await database.close();
      rmSync(dir, { recursive: true, force: true });
    }
  }

  if (!skip.has('postgres')) {
    const url =
      process.env.RLSTREAM_BENCH_PG_URL ??
      process.env.RLSTREAM_TEST_PG_URL ??
      'postgres://postgres@127.0.0.1:5432/test';
    let database: Database | undefined;
    try {
      database = await openDatabase({ kind: 'postgres', url });
    } catch (e) {
      console.error(`bus bench: skipping PostgreSQL: ${errorMessage(e)}`);
    }
    if (database) {
      const bus = createEmbeddedBus({ database });
      try {
        rows.push(...(await measure('embedded-postgres', bus, `${prefix}-pg`, mb)));
      } finally {
        await bus.close();
        await dropPrefix(database, `${prefix}-pg`).catch(() => undefined);
        await database.close();
      }
    }
  }

  if (!skip.has('kafka')) {
    const kafkaPrefix = `${prefix}-kafka`;
    const kafka = await startKafka({
      topics: [`${kafkaPrefix}.in`, `${kafkaPrefix}.out`].map((name) => ({ name, partitions: PARTITIONS })),
    });
    const bus = createKafkaBus({ brokers: kafka.brokers, clientId: 'rlstream-bench' });
    try {
      rows.push(...(await measure(kafka.external ? 'kafka' : 'kafka-mock', bus, kafkaPrefix, mb)));
    } finally {
      await bus.close();
      await kafka.stop();
    }
  }
  return rows;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const rows = await run();
  const w = Math.max(...rows.map((r) => r.name.length));
  console.log(`${'benchmark'.padEnd(w)}  ${'value'.padStart(9)}  unit`);
  for (const r of rows) console.log(`${r.name.padEnd(w)}  ${String(r.value).padStart(9)}  ${r.unit}`);
}
