/**
 * Uses the shared test database (RLSTREAM_TEST_PG_URL): this file runs alone (@runs-alone).
 * The bus contract against the embedded log over a real PostgreSQL (RLSTREAM_TEST_PG_URL,
 * default postgres://postgres@127.0.0.1:5432/test), plus batch atomicity and several processes
 * sharing one group: one is killed with SIGKILL mid-run, another takes over its partitions after
 * the session timeout, and every input is output exactly once. Topic and group names are unique
 * per run and deleted afterwards.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { sql } from 'kysely';
import { runBusContract } from '../../support/bus-contract.ts';
import {
  assertOutputsMatchCommits,
  checkBatchAtomicity,
  committedOf,
  range,
  readAll,
  spawnChild,
  uniqueName,
  waitFor,
} from '../../support/bus-embedded.ts';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import { createEmbeddedBus, type EmbeddedBus } from '../../../lib/bus/embedded-log.ts';

const url = process.env.RLSTREAM_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
let database: Database;
let bus: EmbeddedBus;
const prefixes: string[] = [];

async function dropNamespace(db: Database, prefix: string): Promise<void> {
  const like = `${prefix.replace(/[\\%_]/g, '\\$&')}%`;
  await sql`delete from bus_messages where topic like ${like}`.execute(db.db);
  await sql`delete from bus_topics where name like ${like}`.execute(db.db);
  await sql`delete from bus_offsets where group_id like ${like} or topic like ${like}`.execute(db.db);
  await sql`delete from bus_members where group_id like ${like}`.execute(db.db);
}

before(async () => {
  database = await openDatabase({ kind: 'postgres', url });
  bus = createEmbeddedBus({ database, heartbeatIntervalMs: 200, sessionTimeoutMs: 5000 });
});
after(async () => {
  await bus?.close();
  if (database) for (const p of prefixes) await dropNamespace(database, p);
  await database?.close();
});

runBusContract('embedded log on PostgreSQL', async ({ namespace }) => {
  prefixes.push(namespace);
  return {
    bus,
    async cleanup() {
      /* dropped after the file */
    },
  };
});

/** A bus over its own one-connection pool (so its connection can be terminated) and a topic `<ns>.in` holding `count` messages. */
async function ownBus(
  name: string,
  count: number,
): Promise<{ ns: string; own: Database; obus: EmbeddedBus; input: string }> {
  const ns = uniqueName(name);
  prefixes.push(ns);
  const own = await openDatabase({ kind: 'postgres', url, poolSize: 1 }, { migrate: false });
  const obus = createEmbeddedBus({ database: own, heartbeatIntervalMs: 200, sessionTimeoutMs: 5000 });
  const input = `${ns}.in`;
  await obus.ensureTopics([{ name: input, partitions: 1 }]);
  await obus.produce(range(0, count).map((i) => ({ topic: input, key: 'k', value: Buffer.from(String(i)) })));
  return { ns, own, obus, input };
}

describe('embedded log on PostgreSQL: atomicity and several processes', () => {
  test('outputs, store writes and the offset commit of a batch are one transaction', async () => {
    const ns = uniqueName('atomic');
    prefixes.push(ns);
    await checkBatchAtomicity(bus, database, ns);
  });

  test('a consumer survives its database connection being terminated mid-batch (server restart)', async () => {
    const { ns, own, obus, input } = await ownBus('conn', 30);
    try {
      let terminated = 0;
      const processed: number[] = [];
      const c = obus.consumer({
        group: `${ns}-g`,
        topics: [input],
        maxBatchMessages: 5,
        retry: { initialMs: 10, maxMs: 50 },
      });
      const running = c.run(async (batch, ctx) => {
        if (batch[0].offset === 10 && terminated === 0) {
          const pid = (await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(ctx.tx!)).rows[0].pid;
          await sql`select pg_terminate_backend(${pid})`.execute(database.db);
          terminated++;
          await sql`select 1`.execute(ctx.tx!); // the connection is gone
        }
        processed.push(...batch.map((m) => m.offset));
      });
      await waitFor(
        'all 30 committed after the connection was lost',
        async () => (await committedOf(database, `${ns}-g`, input, 1))[0] === 30,
      );
      await c.stop();
      await running;
      assert.equal(terminated, 1);
      assert.deepEqual(processed, range(0, 30), 'the interrupted batch was redone, each message once');
    } finally {
      await obus.close();
      await own.close();
    }
  });

  test('a consumer whose connection is terminated while it joins its group retries the join (server restart at start-up)', async () => {
    const { ns, own, obus, input } = await ownBus('joinconn', 10);
    try {
      const processed: number[] = [];
      let running: Promise<void> | null = null;
      const c = obus.consumer({
        group: `${ns}-g`,
        topics: [input],
        fromBeginning: true,
        retry: { initialMs: 10, maxMs: 50 },
      });
      // hold bus_members so the join blocks, then terminate the joining backend while it waits
      await database.db.transaction().execute(async (tx) => {
        await sql`lock table bus_members in access exclusive mode`.execute(tx);
        running = c.run(async (batch) => {
          processed.push(...batch.map((m) => m.offset));
        });
        let pid = 0;
        await waitFor('the join to wait on the lock', async () => {
          const r = await sql<{
            pid: number;
          }>`select pid from pg_stat_activity where wait_event_type = 'Lock' and query like '%insert into bus_members%'`.execute(
            database.db,
          );
          pid = r.rows[0]?.pid ?? 0;
          return pid !== 0;
        });
        await sql`select pg_terminate_backend(${pid})`.execute(database.db);
      });
      await waitFor(
        'all 10 committed after the join was retried',
        async () => (await committedOf(database, `${ns}-g`, input, 1))[0] === 10,
      );
      await c.stop();
      await running;
      assert.deepEqual(processed, range(0, 10));
    } finally {
      await obus.close();
      await own.close();
    }
  });

  test('two processes share a group; one killed with -9, the other takes over; every input output exactly once', async () => {
    const ns = uniqueName('mp');
    prefixes.push(ns);
    const [input, output, ticks, group] = [`${ns}.in`, `${ns}.out`, `${ns}.ticks`, `${ns}-g`];
    await bus.ensureTopics([
      { name: input, partitions: 4 },
      { name: output, partitions: 2 },
      { name: ticks, partitions: 1 },
    ]);
    await bus.produce(range(0, 2000).map((i) => ({ topic: input, key: `k${i}`, value: Buffer.from(String(i)) })));
    const spec = {
      target: { kind: 'postgres' as const, url },
      group,
      input,
      output,
      ticks,
      maxBatchMessages: 10,
      handlerDelayMs: 20,
      sessionTimeoutMs: 2000,
      heartbeatIntervalMs: 200,
    };
    const a = spawnChild(spec);
    const b = spawnChild(spec);
    try {
      await waitFor('both processes to handle batches', () => a.batches() >= 5 && b.batches() >= 5, 120_000);
      await a.kill();
      const atKill = (await committedOf(database, group, input, 4)).reduce((x, y) => x + y, 0);
      assert.ok(atKill < 2000, 'killed mid-run');
      await waitFor(
        'the survivor to finish every partition',
        async () => (await committedOf(database, group, input, 4)).reduce((x, y) => x + y, 0) === 2000,
        120_000,
      );
      const members = await sql<{
        n: number;
      }>`select count(*)::int as n from bus_members where group_id = ${group}`.execute(database.db);
      assert.equal(members.rows[0].n, 1, 'the killed member was expired from the group');
    } finally {
      await a.kill();
      await b.kill();
    }
    assertOutputsMatchCommits(await readAll(bus, output), await bus.endOffsets(input), 'after kill -9 and takeover');
    const t = await readAll(bus, ticks);
    assert.deepEqual(
      t.map((m) => m.offset),
      range(0, t.length),
      'appends from two processes are dense',
    );
  });
});
