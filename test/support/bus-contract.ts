/**
 * The event bus contract: one suite, run against every adapter (test/int/bus/*.test.ts).
 * `makeBus` is called once per suite; every test uses its own topics and groups (unique per run),
 * so suites can share a broker or a database with other runs. Topics have 4 partitions (what the
 * librdkafka mock auto-creates). Waits poll with a generous timeout; nothing asserts on time.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import avro from 'avsc';
import { PoisonMessageError, TransientError, errorMessage } from '../../lib/errors.ts';
import { partitionFor } from '../../lib/bus/partitioner.ts';
import type {
  BatchHandler,
  BusMessage,
  Consumer,
  ConsumerOptions,
  DeadLetterInfo,
  EventBus,
  OutMessage,
} from '../../lib/bus/port.ts';

export interface BusFixture {
  bus: EventBus;
  cleanup(): Promise<void>;
}
export interface ContractOptions {
  /** Longest wait for a condition (default 60 s; Kafka group joins on the mock take seconds). */
  timeoutMs?: number;
}

const P = 4;
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '../..');

/** Dead letters in the project's Avro schema (schemas/deadletter.v1.avsc). */
export const DeadLetterType = avro.Type.forSchema(
  JSON.parse(readFileSync(join(ROOT, 'schemas/deadletter.v1.avsc'), 'utf8')),
  { wrapUnions: false },
);
const SampleType = avro.Type.forSchema({
  type: 'record',
  name: 'Sample',
  namespace: 'rlstream.test',
  fields: [
    { name: 'id', type: 'long' },
    { name: 'text', type: 'string' },
  ],
});

export function encodeDeadLetter(info: DeadLetterInfo): OutMessage {
  const m = info.message;
  const err = info.error as { code?: unknown; retriable?: unknown } | undefined;
  return {
    topic: 'replaced-by-the-bus',
    key: `${m.topic}/${m.partition}`,
    value: DeadLetterType.toBuffer({
      run_id: 'contract',
      id: `contract/deadletter/${info.group}/${m.topic}/${m.partition}/${m.offset}`,
      step: null,
      policy_version: null,
      stage: info.group,
      source_topic: m.topic,
      source_partition: m.partition,
      source_offset: m.offset,
      key: m.key === null ? null : Buffer.from(m.key),
      headers: Object.fromEntries(Object.entries(m.headers).map(([k, v]) => [k, Buffer.from(v)])),
      payload: m.value,
      schema: null,
      reason: info.reason,
      error_code: typeof err?.code === 'string' ? err.code : 'ERR_HANDLER',
      retriable: err?.retriable === true,
      attempts: info.attempts,
      time_ms: Date.now(),
    }),
  };
}

interface Started {
  consumer: Consumer;
  batches: BusMessage[][];
  /** Messages of handler runs that returned normally. */
  processed: BusMessage[];
  running: Promise<void>;
  error?: unknown;
}

function start(bus: EventBus, opts: ConsumerOptions, handler?: BatchHandler): Started {
  const consumer = bus.consumer(opts);
  const s: Started = { consumer, batches: [], processed: [], running: Promise.resolve() };
  s.running = consumer
    .run(async (batch, ctx) => {
      s.batches.push(batch);
      if (handler) await handler(batch, ctx);
      s.processed.push(...batch);
    })
    .catch((e) => {
      s.error = e;
    });
  return s;
}

const msgKey = (m: { topic: string; partition: number; offset: number }) => `${m.topic}/${m.partition}/${m.offset}`;
const range = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => a + i);
const offsetsOf = (ms: BusMessage[], partition?: number) =>
  ms.filter((m) => partition === undefined || m.partition === partition).map((m) => m.offset);

/**
 * Registers the contract suite. `makeBus` gets the run's namespace: every topic and group name
 * the suite uses starts with it (so a fixture on a shared database can delete them afterwards).
 */
export function runBusContract(
  name: string,
  makeBus: (ctx: { namespace: string }) => Promise<BusFixture>,
  options: ContractOptions = {},
): void {
  const timeoutMs = options.timeoutMs ?? 60_000;
  const ns = `c${Date.now().toString(36)}${randomBytes(2).toString('hex')}`;
  let fx: BusFixture;
  let bus: EventBus;
  const running: Started[] = [];

  async function waitFor(what: string, cond: () => boolean | Promise<boolean>): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!(await cond())) {
      const failed = running.find((s) => s.error);
      if (failed) throw new Error(`while waiting for ${what}: a consumer failed: ${errorMessage(failed.error)}`);
      if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  function consume(opts: ConsumerOptions, handler?: BatchHandler): Started {
    const s = start(bus, opts, handler);
    running.push(s);
    return s;
  }

  async function stop(s: Started): Promise<void> {
    await s.consumer.stop();
    await s.running;
    running.splice(running.indexOf(s), 1);
  }

  /** Waits until the consumer's committed offsets reach the topic's end offsets. */
  async function drained(s: Started, topic: string): Promise<void> {
    await waitFor(`group to commit everything in ${topic}`, async () => {
      const [ends, committed] = await Promise.all([bus.endOffsets(topic), s.consumer.committed()]);
      return ends.every(
        (end, p) => end === 0 || committed.some((c) => c.topic === topic && c.partition === p && c.offset === end),
      );
    });
  }

  async function readAll(topic: string): Promise<BusMessage[]> {
    const ends = await bus.endOffsets(topic);
    const out: BusMessage[] = [];
    for (let p = 0; p < ends.length; p++) {
      let from = 0;
      while (from < ends[p]) {
        const got = await bus.read(topic, p, from, 1000);
        if (!got.length) break;
        out.push(...got);
        from = got[got.length - 1].offset + 1;
      }
    }
    return out;
  }

  async function topics(...names: string[]): Promise<string[]> {
    const full = names.map((n) => `${ns}.${n}`);
    await bus.ensureTopics(full.map((n) => ({ name: n, partitions: P })));
    return full;
  }

  describe(`event bus contract: ${name}`, { timeout: 10 * timeoutMs }, () => {
    before(async () => {
      fx = await makeBus({ namespace: ns });
      bus = fx.bus;
    });
    after(async () => {
      for (const s of [...running]) await stop(s).catch(() => undefined);
      await fx?.cleanup();
    });

    test('topics: ensureTopics is idempotent, refuses another partition count; endOffsets and read', async () => {
      const [t] = await topics('basic');
      await bus.ensureTopics([{ name: t, partitions: P }]);
      await assert.rejects(bus.ensureTopics([{ name: t, partitions: P + 1 }]), /partitions/);
      await assert.rejects(bus.ensureTopics([{ name: 'bad topic!', partitions: 1 }]), /invalid topic name/);
      assert.deepEqual(await bus.endOffsets(t), [0, 0, 0, 0]);
      await bus.produce(
        range(0, 10).map((i) => ({
          topic: t,
          key: `k${i}`,
          partition: 2,
          value: Buffer.from(`v${i}`),
          headers: { n: String(i) },
        })),
      );
      assert.deepEqual(await bus.endOffsets(t), [0, 0, 10, 0]);
      const got = await bus.read(t, 2, 3, 4);
      assert.deepEqual(
        got.map((m) => [m.topic, m.partition, m.offset, m.key, m.value.toString(), m.headers]),
        range(3, 7).map((i) => [t, 2, i, `k${i}`, `v${i}`, { n: String(i) }]),
      );
      assert.ok(
        got.every((m) => Number.isFinite(m.timestamp) && m.timestamp > 1.6e12),
        'timestamps are epoch ms',
      );
      assert.deepEqual(await bus.read(t, 2, 10, 5), []);
      assert.deepEqual(await bus.read(t, 0, 0, 5), []);
    });

    test('ordering: batches hold one partition in offset order; outputs keep per-key order', async () => {
      const [input, output] = await topics('order-in', 'order-out');
      const keys = range(0, 10).map((i) => `g${i}`);
      for (let round = 0; round < 4; round++) {
        await bus.produce(
          range(0, 100).map((i) => {
            const key = keys[i % 10];
            const seq = round * 10 + Math.floor(i / 10);
            return { topic: input, key, value: Buffer.from(JSON.stringify({ key, seq })) };
          }),
        );
      }
      const s = consume({ group: `${ns}-order`, topics: [input], maxBatchMessages: 37 }, async (batch, ctx) => {
        ctx.send(batch.map((m) => ({ topic: output, key: m.key!, value: m.value })));
      });
      await drained(s, input);
      await stop(s);
      for (const b of s.batches) {
        assert.ok(b.length >= 1 && b.length <= 37, `batch size ${b.length} within maxBatchMessages`);
        assert.ok(
          b.every((m) => m.partition === b[0].partition && m.topic === input),
          'a batch never mixes partitions',
        );
        b.forEach((m, i) => assert.equal(m.offset, b[0].offset + i, 'offsets within a batch are consecutive'));
      }
      const ends = await bus.endOffsets(input);
      assert.equal(
        ends.reduce((a, b) => a + b, 0),
        400,
      );
      for (let p = 0; p < P; p++)
        assert.deepEqual(offsetsOf(s.processed, p), range(0, ends[p]), `partition ${p} delivered once, in order`);
      const seqOf = (ms: BusMessage[], key: string) =>
        ms.filter((m) => m.key === key).map((m) => JSON.parse(m.value.toString()).seq);
      for (const key of keys) assert.deepEqual(seqOf(s.processed, key), range(0, 40), `input order of ${key}`);
      const outs = await readAll(output);
      assert.equal(outs.length, 400, 'every output was made durable');
      for (const key of keys) assert.deepEqual(seqOf(outs, key), range(0, 40), `output order of ${key}`);
    });

    test('keyed routing: murmur2(key) mod partitions; a prompt group shares one partition; explicit partition wins', async () => {
      const [t] = await topics('keys');
      const groups = range(0, 60).map((i) => (i % 7 === 0 ? `prompt-ü-${i}-✓` : `prompt-${i}`));
      const msgs: OutMessage[] = [];
      for (let sample = 0; sample < 5; sample++)
        for (const g of groups) msgs.push({ topic: t, key: g, value: Buffer.from(`${g}#${sample}`) });
      const explicit = range(0, 5).map((i) => ({
        topic: t,
        key: 'pinned',
        partition: 3,
        value: Buffer.from(`pinned#${i}`),
      }));
      await bus.produce([...msgs, ...explicit]);
      const all = await readAll(t);
      assert.equal(all.length, msgs.length + explicit.length);
      for (const g of groups) {
        const mine = all.filter((m) => m.key === g);
        assert.equal(mine.length, 5);
        assert.ok(
          mine.every((m) => m.partition === partitionFor(g, P)),
          `${g} routed to murmur2 partition ${partitionFor(g, P)}`,
        );
        assert.deepEqual(
          mine.map((m) => m.value.toString()),
          range(0, 5).map((i) => `${g}#${i}`),
          `${g} samples in order`,
        );
      }
      const pinned = all.filter((m) => m.key === 'pinned');
      assert.ok(pinned.every((m) => m.partition === 3));
      assert.deepEqual(
        pinned.map((m) => m.value.toString()),
        range(0, 5).map((i) => `pinned#${i}`),
      );
      assert.ok(new Set(all.map((m) => m.partition)).size === P, 'keys spread over all partitions');
    });

    test('group rebalancing: two consumers split the partitions; one takes over when the other stops', async () => {
      const [t] = await topics('rebalance');
      const group = `${ns}-rebalance`;
      const a = consume({ group, topics: [t], maxBatchMessages: 10 });
      await waitFor('A to own all partitions', () => a.consumer.assignment().length === P);
      const b = consume({ group, topics: [t], maxBatchMessages: 10 });
      const split = () => {
        const pa = a.consumer.assignment().map((x) => x.partition);
        const pb = b.consumer.assignment().map((x) => x.partition);
        return pa.length > 0 && pb.length > 0 && pa.length + pb.length === P && new Set([...pa, ...pb]).size === P;
      };
      await waitFor('A and B to split the partitions', split);
      const ownA = new Set(a.consumer.assignment().map((x) => x.partition));
      const ownB = new Set(b.consumer.assignment().map((x) => x.partition));
      const before = { a: a.processed.length, b: b.processed.length };
      await bus.produce(
        range(0, 80).map((i) => ({ topic: t, key: `r${i}`, partition: i % P, value: Buffer.from(`phase2-${i}`) })),
      );
      await drained(a, t);
      const phase2 = [...a.processed.slice(before.a), ...b.processed.slice(before.b)];
      assert.ok(split(), 'assignment stayed split while consuming');
      assert.ok(
        a.processed.slice(before.a).every((m) => ownA.has(m.partition)),
        'A only processed its partitions',
      );
      assert.ok(
        b.processed.slice(before.b).every((m) => ownB.has(m.partition)),
        'B only processed its partitions',
      );
      assert.ok(a.processed.length > before.a && b.processed.length > before.b, 'both members did work');
      for (let p = 0; p < P; p++)
        assert.deepEqual(
          [...new Set(offsetsOf(phase2, p))].sort((x, y) => x - y),
          range(0, 20),
          `partition ${p} fully consumed`,
        );

      await stop(b);
      await waitFor('A to take over every partition', () => a.consumer.assignment().length === P);
      const mark = a.processed.length;
      await bus.produce(
        range(0, 40).map((i) => ({ topic: t, key: `r${i}`, partition: i % P, value: Buffer.from(`phase3-${i}`) })),
      );
      await drained(a, t);
      const phase3 = a.processed.slice(mark).filter((m) => m.value.toString().startsWith('phase3'));
      assert.equal(
        new Set(phase3.map(msgKey)).size,
        40,
        "A consumed all 40 new messages, including B's former partitions",
      );
      await stop(a);
    });

    test('resume: a new consumer of the group starts at the committed offset', async () => {
      const [t] = await topics('resume');
      const group = `${ns}-resume`;
      await bus.produce(range(0, 30).map((i) => ({ topic: t, key: 'x', partition: 1, value: Buffer.from(`a${i}`) })));
      const c1 = consume({ group, topics: [t], maxBatchMessages: 10 });
      await drained(c1, t);
      await stop(c1);
      assert.deepEqual(
        (await c1.consumer.committed()).filter((c) => c.partition === 1).map((c) => c.offset),
        [30],
      );
      await bus.produce(range(30, 45).map((i) => ({ topic: t, key: 'x', partition: 1, value: Buffer.from(`a${i}`) })));
      const c2 = consume({ group, topics: [t], maxBatchMessages: 10 });
      await drained(c2, t);
      await stop(c2);
      assert.deepEqual(offsetsOf(c2.processed), range(30, 45), 'the new consumer got exactly the uncommitted messages');
      assert.deepEqual(
        c2.processed.map((m) => m.value.toString()),
        range(30, 45).map((i) => `a${i}`),
      );
    });

    test('at-least-once: a consumer killed mid-batch commits nothing of it; the batch is redelivered, its outputs only once', async () => {
      const [t, out] = await topics('redeliver', 'redeliver-out');
      const group = `${ns}-redeliver`;
      await bus.produce(range(0, 20).map((i) => ({ topic: t, key: 'y', partition: 0, value: Buffer.from(`m${i}`) })));
      let hung: BusMessage[] | undefined;
      const c1 = consume({ group, topics: [t], maxBatchMessages: 5 }, async (batch, ctx) => {
        ctx.send(batch.map((m) => ({ topic: out, key: 'y', value: m.value })));
        if (batch[0].offset >= 10) {
          hung = batch;
          await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve(), { once: true }));
          throw new Error('killed');
        }
      });
      await waitFor('c1 to hang on the batch at offset 10', () => hung !== undefined);
      assert.deepEqual(offsetsOf(hung!), range(10, 15));
      await stop(c1);
      assert.deepEqual(offsetsOf(c1.processed), range(0, 10));
      assert.deepEqual(
        (await c1.consumer.committed()).filter((c) => c.partition === 0).map((c) => c.offset),
        [10],
        'the hung batch was not committed',
      );
      const c2 = consume({ group, topics: [t], maxBatchMessages: 5 }, async (batch, ctx) => {
        ctx.send(batch.map((m) => ({ topic: out, key: 'y', value: m.value })));
      });
      await drained(c2, t);
      await stop(c2);
      assert.deepEqual(offsetsOf(c2.batches[0]), range(10, 15), 'the uncommitted batch is redelivered first');
      assert.deepEqual(offsetsOf(c2.processed), range(10, 20));
      const outs = (await readAll(out)).map((m) => m.value.toString());
      assert.deepEqual(
        outs,
        range(0, 20).map((i) => `m${i}`),
        'outputs of the killed batch were never made durable',
      );
    });

    test('retriable handler error: the same batch is redelivered after backoff, nothing dead-lettered', async () => {
      const [t, dlq] = await topics('retry', 'retry-dlq');
      let failures = 0;
      const c = consume(
        {
          group: `${ns}-retry`,
          topics: [t],
          maxBatchMessages: 4,
          retry: { initialMs: 5, maxMs: 20 },
          deadLetter: { topic: dlq, encode: encodeDeadLetter },
        },
        async (batch) => {
          if (batch.some((m) => m.offset === 5) && failures < 2) {
            failures++;
            throw new TransientError('reward server returned 503');
          }
        },
      );
      await bus.produce(range(0, 12).map((i) => ({ topic: t, key: 'z', partition: 0, value: Buffer.from(`r${i}`) })));
      await drained(c, t);
      await stop(c);
      assert.equal(failures, 2);
      const withFive = c.batches.filter((b) => b.some((m) => m.offset === 5));
      assert.equal(withFive.length, 3, 'delivered twice failing, then once succeeding');
      assert.deepEqual(offsetsOf(withFive[0]), offsetsOf(withFive[2]), 'the same batch was redelivered');
      assert.deepEqual(offsetsOf(c.processed), range(0, 12), 'each message processed once');
      assert.deepEqual(await bus.endOffsets(dlq), [0, 0, 0, 0], 'nothing dead-lettered');
    });

    test('poison message: dead-lettered with its reason; the rest is processed; nothing lost', async () => {
      const [t, dlq] = await topics('poison', 'poison-dlq');
      const poison = new Set([7, 19]);
      await bus.produce(
        range(0, 30).map((i) => ({
          topic: t,
          key: 'p',
          partition: 0,
          value: poison.has(i) ? Buffer.from([0x0e, 0x10]) : SampleType.toBuffer({ id: i, text: `sample ${i}` }),
          headers: i === 23 ? { reject: 'yes' } : ({} as Record<string, string>),
        })),
      );
      const c = consume(
        {
          group: `${ns}-poison`,
          topics: [t],
          maxBatchMessages: 10,
          retry: { initialMs: 5, maxMs: 20 },
          deadLetter: { topic: dlq, encode: encodeDeadLetter },
        },
        async (batch, ctx) => {
          for (const m of batch) {
            if (m.headers.reject === 'yes') {
              ctx.deadLetter(m, 'rejected by the handler: marked reject');
              continue;
            }
            try {
              SampleType.fromBuffer(m.value);
            } catch (e) {
              throw new PoisonMessageError(
                `undecodable Sample at ${m.topic}[${m.partition}]@${m.offset}: ${errorMessage(e)}`,
                { cause: e },
              );
            }
          }
        },
      );
      await drained(c, t);
      await stop(c);
      const dead = (await readAll(dlq)).map((m) => DeadLetterType.fromBuffer(m.value) as Record<string, any>);
      assert.deepEqual(
        dead.map((d) => d.source_offset).sort((a, b) => a - b),
        [7, 19, 23],
      );
      for (const d of dead) {
        assert.equal(d.source_topic, t);
        assert.equal(d.source_partition, 0);
        assert.equal(d.stage, `${ns}-poison`);
        if (d.source_offset === 23) {
          assert.equal(d.reason, 'rejected by the handler: marked reject');
        } else {
          assert.match(
            d.reason,
            new RegExp(`undecodable Sample at ${t.replace(/\./g, '\\.')}\\[0\\]@${d.source_offset}: .+`),
          );
          assert.equal(d.error_code, 'ERR_POISON');
          assert.equal(d.retriable, false);
          assert.deepEqual(Buffer.from(d.payload), Buffer.from([0x0e, 0x10]), 'the poison bytes are kept');
        }
      }
      // Every offset exactly once across processed (decoded) and dead-lettered (by the bus).
      const fine = offsetsOf(c.processed).filter((o) => o !== 23);
      const all = [...fine, ...dead.map((d) => d.source_offset as number)].sort((a, b) => a - b);
      assert.deepEqual(all, range(0, 30), 'nothing lost, nothing twice');
      assert.ok(
        fine.some((o) => o > 19),
        'kept going after the poison messages',
      );
    });

    test('large batches (≥ 1 MB) arrive intact; maxBatchBytes bounds a batch unless one message is larger', async () => {
      const [t] = await topics('large');
      const values = [1_000_000, 400_000, 400_000, 400_000, 20_000].map((n) => randomBytes(n));
      await bus.produce(
        values.map((value, i) => ({ topic: t, key: 'big', partition: 1, value, headers: { i: String(i) } })),
      );
      const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
      const whole = consume({ group: `${ns}-large-a`, topics: [t] });
      const small = consume({ group: `${ns}-large-b`, topics: [t], maxBatchBytes: 500_000 });
      await drained(whole, t);
      await drained(small, t);
      await stop(whole);
      await stop(small);
      for (const s of [whole, small]) {
        assert.deepEqual(
          s.processed.map((m) => sha(m.value)),
          values.map(sha),
          'values intact, in order',
        );
        assert.deepEqual(
          s.processed.map((m) => m.headers.i),
          ['0', '1', '2', '3', '4'],
        );
      }
      const bytes = (b: BusMessage[]) => b.reduce((n, m) => n + m.value.length, 0);
      assert.ok(
        whole.batches.some((b) => bytes(b) >= 1_000_000),
        'a batch of at least 1 MB',
      );
      for (const b of small.batches)
        assert.ok(
          b.length === 1 || bytes(b) <= 500_000,
          `batch of ${b.length} messages, ${bytes(b)} bytes, respects maxBatchBytes`,
        );
      assert.ok(small.batches.length >= 4, 'the byte limit split the messages');
    });

    test('seek: moves the group position back; the messages are consumed again from there', async () => {
      const [t] = await topics('seek');
      await bus.produce(range(0, 20).map((i) => ({ topic: t, key: 's', partition: 2, value: Buffer.from(`s${i}`) })));
      const c = consume({ group: `${ns}-seek`, topics: [t], maxBatchMessages: 6 });
      await drained(c, t);
      const mark = c.processed.length;
      await c.consumer.seek(t, 2, 5);
      await waitFor('the 15 messages after offset 5 to be consumed again', () => c.processed.length >= mark + 15);
      await drained(c, t);
      await stop(c);
      assert.deepEqual(offsetsOf(c.processed.slice(mark)), range(5, 20));
      assert.deepEqual(
        (await c.consumer.committed()).filter((x) => x.partition === 2).map((x) => x.offset),
        [20],
      );
    });

    test('fromBeginning: false starts a new group at the end of the log', async () => {
      const [t] = await topics('latest');
      await bus.produce(range(0, 5).map((i) => ({ topic: t, key: 'l', partition: 0, value: Buffer.from(`old${i}`) })));
      const c = consume({ group: `${ns}-latest`, topics: [t], fromBeginning: false });
      await waitFor('the consumer to join', () => c.consumer.assignment().length === P);
      // The group's start position is taken when it first fetches; keep appending until it sees one.
      let sent = 0;
      await waitFor('the consumer to receive a new message', async () => {
        if (c.processed.length > 0) return true;
        await bus.produce([{ topic: t, key: 'l', partition: 0, value: Buffer.from(`new${sent++}`) }]);
        await new Promise((r) => setTimeout(r, 300));
        return c.processed.length > 0;
      });
      await bus.produce(
        range(sent, sent + 2).map((i) => ({ topic: t, key: 'l', partition: 0, value: Buffer.from(`new${i}`) })),
      );
      sent += 2;
      await drained(c, t);
      await stop(c);
      const got = c.processed.map((m) => m.value.toString());
      assert.ok(
        got.every((v) => v.startsWith('new')),
        `no message from before the group existed: ${got.join(',')}`,
      );
      const first = Number(got[0].slice(3));
      assert.deepEqual(
        got,
        range(first, sent).map((i) => `new${i}`),
        'every message after the start position, in order',
      );
    });

    test('without a dead-letter topic a poison message stops the consumer with a clear error, uncommitted', async () => {
      const [t] = await topics('nodlq');
      await bus.produce(
        range(0, 6).map((i) => ({ topic: t, key: 'n', partition: 0, value: Buffer.from(i === 3 ? 'bad' : `ok${i}`) })),
      );
      const c = consume({ group: `${ns}-nodlq`, topics: [t], maxBatchMessages: 2 }, async (batch) => {
        for (const m of batch)
          if (m.value.toString() === 'bad') throw new PoisonMessageError(`cannot decode offset ${m.offset}`);
      });
      running.splice(running.indexOf(c), 1); // its failure is expected
      await c.running;
      assert.match(errorMessage(c.error), /no dead-letter topic is configured/);
      assert.match(errorMessage(c.error), /cannot decode offset 3/);
      assert.deepEqual(offsetsOf(c.processed), [0, 1, 2], 'everything before the poison message was processed');
      assert.deepEqual(
        (await c.consumer.committed()).filter((x) => x.partition === 0).map((x) => x.offset),
        [3],
        'the poison message stays uncommitted',
      );
    });
  });
}
