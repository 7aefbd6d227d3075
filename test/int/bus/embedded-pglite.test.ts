/**
 * The bus contract against the embedded log over PGlite (one data directory for the file), plus
 * what only the embedded log promises: batch atomicity, and a consumer process killed with
 * SIGKILL (its own PGlite directory) loses nothing.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { runBusContract } from '../../support/bus-contract.ts';
import { assertOutputsMatchCommits, checkBatchAtomicity, committedOf, range, readAll, spawnChild, waitFor } from '../../support/bus-embedded.ts';
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

runBusContract('embedded log on PGlite', async () => ({ bus, async cleanup() { /* closed after the file */ } }));

describe('embedded log on PGlite: atomicity and crashes', () => {
  test('outputs, store writes and the offset commit of a batch are one transaction', async () => {
    await checkBatchAtomicity(bus, database);
  });

  test('inside a handler, bus.produce is refused with advice (PGlite has one connection)', async () => {
    await bus.ensureTopics([{ name: 'guard.in', partitions: 1 }]);
    await bus.produce([{ topic: 'guard.in', key: 'k', value: Buffer.from('x') }]);
    let refusal = '';
    const c = bus.consumer({ group: 'guard', topics: ['guard.in'] });
    const running = c.run(async () => {
      try { await bus.produce([{ topic: 'guard.in', key: 'k', value: Buffer.from('y') }]); } catch (e) { refusal = (e as Error).message; }
    });
    await waitFor('the handler to run', () => refusal !== '');
    await c.stop();
    await running;
    assert.match(refusal, /inside a batch handler of group guard.*use ctx\.send/);
  });

  test('kill -9 of a consumer process mid-run loses nothing; a restart resumes from committed offsets', async () => {
    const kdir = mkdtempSync(join(TMP, 'bus-kill-'));
    let db: Database | undefined;
    let kbus: EmbeddedBus | undefined;
    let child: ReturnType<typeof spawnChild> | undefined;
    try {
      db = await openDatabase({ kind: 'pglite', dir: kdir });
      kbus = createEmbeddedBus({ database: db });
      await kbus.ensureTopics([{ name: 'in', partitions: 3 }, { name: 'out', partitions: 2 }, { name: 'ticks', partitions: 1 }]);
      await kbus.produce(range(0, 3000).map((i) => ({ topic: 'in', key: `k${i}`, value: Buffer.from(String(i)) })));
      await db.close();
      db = undefined;

      const proc = spawnChild({ target: { kind: 'pglite', dir: kdir }, group: 'g', input: 'in', output: 'out', ticks: 'ticks', maxBatchMessages: 20, handlerDelayMs: 5 });
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
      assert.deepEqual(ticks.map((m) => [m.offset, m.value.toString()]), ticks.map((_, i) => [i, String(i)]), 'appends are dense and in order');

      const resumed = kbus.consumer({ group: 'g', topics: ['in'], maxBatchMessages: 200 });
      let first: number[] | undefined;
      const running = resumed.run(async (batch, ctx) => {
        first ??= [batch[0].partition, batch[0].offset];
        ctx.send(batch.map((m) => ({ topic: 'out', key: m.key ?? '', value: Buffer.from(JSON.stringify({ p: m.partition, o: m.offset })) })));
      });
      await waitFor('the restarted consumer to finish', async () => (await committedOf(db!, 'g', 'in', 3)).reduce((a, b) => a + b, 0) === 3000);
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
