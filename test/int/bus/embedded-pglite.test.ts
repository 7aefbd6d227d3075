/**
 * The bus contract against the embedded log over PGlite (one data directory for the file), plus
 * what only the embedded log promises: batch atomicity, and a consumer process killed with
 * SIGKILL (its own PGlite directory) loses nothing.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { runBusContract } from '../../support/bus-contract.ts';
import {
  assertOutputsMatchCommits,
  checkBatchAtomicity,
  committedOf,
  range,
  readAll,
  spawnChild,
  waitFor,
} from '../../support/bus-embedded.ts';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import { createEmbeddedBus, type EmbeddedBus } from '../../../lib/bus/embedded-log.ts';

const TMP = join(process.cwd(), 'test/.tmp');
mkdirSync(TMP, { recursive: true });
const dir = mkdtempSync(join(TMP, 'bus-pglite-'));
let database: Database;
let bus: EmbeddedBus;

before(async () => {
  database = await openDatabase({ kind: 'pglite', dir });
  bus = createEmbeddedBus({ database, heartbeatIntervalMs: 200, sessionTimeoutMs: 5000 });
});
after(async () => {
  await bus?.close();
  await database?.close();
  rmSync(dir, { recursive: true, force: true });
});

runBusContract('embedded log on PGlite', async () => ({
  bus,
  async cleanup() {
    /* closed after the file */
  },
}));

describe('embedded log on PGlite: atomicity and crashes', () => {
  test('outputs, store writes and the offset commit of a batch are one transaction', async () => {
    await checkBatchAtomicity(bus, database);
  });

  test('messages served from memory (the tail of what this process appended) equal the rows in the table', async () => {
    await bus.ensureTopics([
      { name: 'mirror.in', partitions: 2 },
      { name: 'mirror.out', partitions: 1 },
    ]);
    const c = bus.consumer({ group: 'mirror', topics: ['mirror.in'] });
    let seen = 0;
    const running = c.run(async (batch, ctx) => {
      ctx.send(
        batch.map((m) => ({
          topic: 'mirror.out',
          key: m.key ?? '',
          value: Buffer.concat([m.value, Buffer.from('!')]),
          headers: { from: `${m.partition}/${m.offset}` },
        })),
      );
      seen += batch.length;
    });
    await bus.produce(
      range(0, 20).map((i) => ({
        topic: 'mirror.in',
        key: `k${i % 5}`,
        value: Buffer.from(`v${i}`),
        headers: { i: String(i), ünï: 'cödé' },
      })),
    );
    await waitFor('20 messages consumed', () => seen === 20);
    await c.stop();
    await running;
    for (const topic of ['mirror.in', 'mirror.out']) {
      const fromMemory = await readAll(bus, topic);
      const rows = (
        await sql<{
          partition: number;
          msg_offset: number;
          key: string;
          value: Buffer;
          headers: Record<string, string>;
          ts_ms: number;
        }>`
        select partition, msg_offset, key, value, headers, (extract(epoch from ts) * 1000)::int8 as ts_ms from bus_messages
        where topic = ${topic} order by partition, msg_offset`.execute(database.db)
      ).rows;
      assert.equal(fromMemory.length, 20);
      assert.deepEqual(
        fromMemory.map((m) => ({
          partition: m.partition,
          offset: m.offset,
          key: m.key,
          value: m.value.toString(),
          headers: m.headers,
          ts: m.timestamp,
        })),
        rows.map((r) => ({
          partition: r.partition,
          offset: Number(r.msg_offset),
          key: r.key,
          value: Buffer.from(r.value).toString(),
          headers: r.headers,
          ts: Number(r.ts_ms),
        })),
      );
    }
    assert.deepEqual(await bus.endOffsets('mirror.out'), [20]);
    assert.deepEqual(await committedOf(database, 'mirror', 'mirror.in', 2), await bus.endOffsets('mirror.in'));
  });

  test('inside a handler, bus.produce is refused with advice (PGlite has one connection)', async () => {
    await bus.ensureTopics([{ name: 'guard.in', partitions: 1 }]);
    await bus.produce([{ topic: 'guard.in', key: 'k', value: Buffer.from('x') }]);
    let refusal = '';
    const c = bus.consumer({ group: 'guard', topics: ['guard.in'] });
    const running = c.run(async () => {
      try {
        await bus.produce([{ topic: 'guard.in', key: 'k', value: Buffer.from('y') }]);
      } catch (e) {
        refusal = (e as Error).message;
      }
    });
    await waitFor('the handler to run', () => refusal !== '');
    await c.stop();
    await running;
    assert.match(refusal, /inside a batch handler of group guard.*use ctx\.send/);
  });

  test('inside a handler, bus.read in the batch transaction (ctx.tx) reads the log; without it, it is refused', async () => {
    await bus.ensureTopics([{ name: 'guard.read', partitions: 1 }]);
    await bus.produce([0, 1, 2].map((i) => ({ topic: 'guard.read', key: 'k', value: Buffer.from(`m${i}`) })));
    let viaTx: string[] | null = null,
      refusal = '';
    const c = bus.consumer({ group: 'guard-read', topics: ['guard.read'] });
    const running = c.run(async (_records, ctx) => {
      if (viaTx) return;
      viaTx = (await bus.read('guard.read', 0, 0, 10, ctx.tx)).map((m) => m.value.toString());
      await bus.read('guard.read', 0, 0, 10).catch((e: Error) => (refusal = e.message));
    });
    await waitFor('the handler to run', () => viaTx !== null && refusal !== '');
    await c.stop();
    await running;
    assert.deepEqual(viaTx, ['m0', 'm1', 'm2']);
    assert.match(refusal, /read called inside a batch handler of group guard-read/);
  });

  test('kill -9 of a consumer process mid-run loses nothing; a restart resumes from committed offsets', async () => {
    const kdir = mkdtempSync(join(TMP, 'bus-kill-'));
    let db: Database | undefined;
    let kbus: EmbeddedBus | undefined;
    let child: ReturnType<typeof spawnChild> | undefined;
    try {
      db = await openDatabase({ kind: 'pglite', dir: kdir });
      kbus = createEmbeddedBus({ database: db });
      await kbus.ensureTopics([
        { name: 'in', partitions: 3 },
        { name: 'out', partitions: 2 },
        { name: 'ticks', partitions: 1 },
      ]);
      await kbus.produce(range(0, 3000).map((i) => ({ topic: 'in', key: `k${i}`, value: Buffer.from(String(i)) })));
      await db.close();
      db = undefined;

      const proc = spawnChild({
        target: { kind: 'pglite', dir: kdir },
        group: 'g',
        input: 'in',
        output: 'out',
        ticks: 'ticks',
        maxBatchMessages: 20,
        handlerDelayMs: 5,
      });
      child = proc;
      await waitFor('the child to handle 25 batches', () => proc.batches() >= 25, 120_000);
      await proc.kill();

      // Reopening takes over the dead process's lock; everything committed is there, nothing half-done.
      db = await openDatabase({ kind: 'pglite', dir: kdir });
      kbus = createEmbeddedBus({ database: db });
      const committed = await committedOf(db, 'g', 'in', 3);
      const total = committed.reduce((a, b) => a + b, 0);
      // (The child prints a batch before its commit, so the last one may be uncommitted.)
      assert.ok(total >= 24 * 20 && total < 3000, `the child committed part of the input (${total})`);
      assertOutputsMatchCommits(await readAll(kbus, 'out'), committed, 'after kill -9');
      const ticks = await readAll(kbus, 'ticks');
      assert.ok(ticks.length > 0);
      assert.deepEqual(
        ticks.map((m) => [m.offset, m.value.toString()]),
        ticks.map((_, i) => [i, String(i)]),
        'appends are dense and in order',
      );

      const resumed = kbus.consumer({ group: 'g', topics: ['in'], maxBatchMessages: 200 });
      let first: number[] | undefined;
      const running = resumed.run(async (batch, ctx) => {
        first ??= [batch[0].partition, batch[0].offset];
        ctx.send(
          batch.map((m) => ({
            topic: 'out',
            key: m.key ?? '',
            value: Buffer.from(JSON.stringify({ p: m.partition, o: m.offset })),
          })),
        );
      });
      await waitFor(
        'the restarted consumer to finish',
        async () => (await committedOf(db!, 'g', 'in', 3)).reduce((a, b) => a + b, 0) === 3000,
      );
      await resumed.stop();
      await running;
      assert.equal(first![1], committed[first![0]], 'resumed exactly at the committed offset');
      assertOutputsMatchCommits(await readAll(kbus, 'out'), await kbus.endOffsets('in'), 'after resuming');
    } finally {
      await child?.kill();
      await kbus?.close();
      await db?.close();
      rmSync(kdir, { recursive: true, force: true });
    }
  });
});
