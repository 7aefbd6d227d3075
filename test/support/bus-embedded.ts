/**
 * Tests only the embedded log can pass (beyond the shared contract): a batch's outputs, store
 * writes and offset commit are one transaction, and a process killed with SIGKILL loses nothing.
 * Used by test/int/bus/embedded-pglite.test.ts and embedded-postgres.test.ts.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import { TransientError } from '../../lib/errors.ts';
import type { Database } from '../../lib/db/database.ts';
import type { EmbeddedBus } from '../../lib/bus/embedded-log.ts';
import type { BusMessage, EventBus } from '../../lib/bus/port.ts';
import type { ChildSpec } from './bus-child.ts';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '../..');
export const range = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => a + i);
export const uniqueName = (prefix: string) => `${prefix}${Date.now().toString(36)}${randomBytes(2).toString('hex')}`;

export async function waitFor(what: string, cond: () => boolean | Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export async function readAll(bus: EventBus, topic: string): Promise<BusMessage[]> {
  const ends = await bus.endOffsets(topic);
  const out: BusMessage[] = [];
  for (let p = 0; p < ends.length; p++) {
    for (let from = 0; from < ends[p];) {
      const got = await bus.read(topic, p, from, 1000);
      if (!got.length) break;
      out.push(...got);
      from = got[got.length - 1].offset + 1;
    }
  }
  return out;
}

/** Group's committed offsets for `topic`, per partition (0 where none). */
export async function committedOf(
  database: Database,
  group: string,
  topic: string,
  partitions: number,
): Promise<number[]> {
  const r = await sql<{
    partition: number;
    next_offset: number;
  }>`select partition, next_offset from bus_offsets where group_id = ${group} and topic = ${topic}`.execute(
    database.db,
  );
  const out = new Array<number>(partitions).fill(0);
  for (const row of r.rows) out[row.partition] = Number(row.next_offset);
  return out;
}

/** Source (partition, offset) of each output written by bus-child.ts, as "p/o" strings. */
export function sources(outputs: BusMessage[]): string[] {
  return outputs.map((m) => {
    const s = JSON.parse(m.value.toString()) as { p: number; o: number };
    return `${s.p}/${s.o}`;
  });
}

/** Asserts that outputs hold each input offset below `committed[p]` exactly once, and nothing else. */
export function assertOutputsMatchCommits(outputs: BusMessage[], committed: number[], what: string): void {
  const got = sources(outputs).sort();
  const want = committed.flatMap((c, p) => range(0, c).map((o) => `${p}/${o}`)).sort();
  assert.equal(new Set(got).size, got.length, `${what}: no input was output twice`);
  assert.deepEqual(got, want, `${what}: outputs exist exactly for the committed inputs`);
}

export interface Child {
  proc: ChildProcess;
  batches(): number;
  exited: Promise<void>;
  kill(): Promise<void>;
}

export function spawnChild(spec: ChildSpec): Child {
  const proc = spawn(
    process.execPath,
    ['--import', 'tsx', join(ROOT, 'test/support/bus-child.ts'), JSON.stringify(spec)],
    { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let batches = 0;
  let stderr = '';
  proc.stdout!.setEncoding('utf8').on('data', (d: string) => {
    batches += (d.match(/^batch \d+$/gm) ?? []).length;
  });
  proc.stderr!.setEncoding('utf8').on('data', (d: string) => {
    stderr += d;
  });
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
  const killOnExit = () => proc.kill('SIGKILL');
  process.once('exit', killOnExit);
  void exited.then(() => process.removeListener('exit', killOnExit));
  return {
    proc,
    batches: () => {
      if (proc.exitCode !== null && proc.exitCode !== 0)
        throw new Error(`bus child exited with ${proc.exitCode}: ${stderr}`);
      return batches;
    },
    exited,
    async kill() {
      proc.kill('SIGKILL');
      await exited;
    },
  };
}

/**
 * A batch whose handler wrote a row through ctx.tx and sent outputs, then failed (retriable) or
 * was abandoned by stop(), leaves no trace: no row, no output, no commit. Retried, it applies once.
 */
export async function checkBatchAtomicity(
  bus: EmbeddedBus,
  database: Database,
  ns = uniqueName('atomic'),
): Promise<void> {
  const input = `${ns}.in`;
  const output = `${ns}.out`;
  await bus.ensureTopics([
    { name: input, partitions: 2 },
    { name: output, partitions: 2 },
  ]);
  await sql`create table if not exists bus_test_effects (tag text not null, topic text not null, partition int not null, msg_offset bigint not null)`.execute(
    database.db,
  );
  await bus.produce(
    range(0, 20).map((i) => ({ topic: input, key: `a${i}`, partition: i % 2, value: Buffer.from(String(i)) })),
  );

  // 1. A retriable failure after ctx.send and a ctx.tx write rolls both back; the retry applies once.
  let failed = 0;
  const c1 = bus.consumer({
    group: `${ns}-g`,
    topics: [input],
    maxBatchMessages: 4,
    retry: { initialMs: 5, maxMs: 10 },
  });
  const run1 = c1.run(async (batch, ctx) => {
    ctx.send(batch.map((m) => ({ topic: output, key: m.key!, value: m.value })));
    for (const m of batch)
      await sql`insert into bus_test_effects values (${ns}, ${m.topic}, ${m.partition}, ${m.offset})`.execute(ctx.tx!);
    if (batch.some((m) => m.partition === 0 && m.offset === 5) && failed++ === 0)
      throw new TransientError('store briefly unavailable');
  });
  await waitFor('all 20 inputs committed', async () =>
    (await committedOf(database, `${ns}-g`, input, 2)).every((c) => c === 10),
  );
  await c1.stop();
  await run1;
  assert.equal(failed, 2, 'the failing batch ran twice');
  const effects = await sql<{
    n: number;
  }>`select count(*)::int as n, count(distinct (partition, msg_offset))::int as d from bus_test_effects where tag = ${ns}`.execute(
    database.db,
  );
  assert.deepEqual(effects.rows[0], { n: 20, d: 20 }, 'store rows of the failed attempt were rolled back');
  assert.equal((await readAll(bus, output)).length, 20, 'outputs of the failed attempt were rolled back');

  // 2. A batch abandoned by stop() after its writes commits nothing.
  await bus.produce(
    range(20, 24).map((i) => ({ topic: input, key: `a${i}`, partition: 0, value: Buffer.from(String(i)) })),
  );
  let hung = false;
  const c2 = bus.consumer({ group: `${ns}-g`, topics: [input] });
  const run2 = c2.run(async (batch, ctx) => {
    ctx.send(batch.map((m) => ({ topic: output, key: m.key!, value: m.value })));
    for (const m of batch)
      await sql`insert into bus_test_effects values (${ns}, ${m.topic}, ${m.partition}, ${m.offset})`.execute(ctx.tx!);
    hung = true;
    await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve(), { once: true }));
  });
  await waitFor('the handler to hang after writing', () => hung);
  await c2.stop();
  await run2;
  assert.deepEqual(await committedOf(database, `${ns}-g`, input, 2), [10, 10], 'nothing committed');
  const after = await sql<{ n: number }>`select count(*)::int as n from bus_test_effects where tag = ${ns}`.execute(
    database.db,
  );
  assert.equal(after.rows[0].n, 20, 'no store rows from the abandoned batch');
  assert.equal((await readAll(bus, output)).length, 20, 'no outputs from the abandoned batch');
  await sql`delete from bus_test_effects where tag = ${ns}`.execute(database.db);
}
