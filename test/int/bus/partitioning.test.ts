/**
 * Pure parts of the bus (no database or broker needed): keyed partitioning agrees with Kafka's
 * murmur2 (the Java client's test vectors and kafkajs' DefaultPartitioner), the embedded log's
 * group assignment, batch cutting and backoff.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Partitioners } from 'kafkajs';
import { murmur2, partitionFor } from '../../../lib/bus/partitioner.ts';
import { assignPartitions } from '../../../lib/bus/embedded-log.ts';
import { backoffMs, chunkMessages } from '../../../lib/bus/delivery.ts';
import type { BusMessage } from '../../../lib/bus/port.ts';

test('murmur2 matches the Kafka Java client (Utils.murmur2 test vectors)', () => {
  const cases: Array<[string, number]> = [
    ['21', -973932308],
    ['foobar', -790332482],
    ['a-little-bit-long-string', -985981536],
    ['a-little-bit-longer-string', -1486304829],
    ['lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8', -58897971],
    ['abc', 479470107],
  ];
  for (const [key, want] of cases) assert.equal(murmur2(Buffer.from(key)), want, key);
});

test('partitionFor agrees with kafkajs DefaultPartitioner for ASCII and Unicode keys', () => {
  const kafkajs = Partitioners.DefaultPartitioner();
  let seed = 12345;
  const next = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0);
  let checked = 0;
  for (let i = 0; i < 3000; i++) {
    const len = next() % 40;
    const key =
      i % 2
        ? `prompt-${next()}-${i}`
        : String.fromCodePoint(
            ...Array.from(
              { length: len },
              () => 0x20 + (next() % 0x10000 >= 0xd800 ? next() % 0xd000 : next() % 0x10000),
            ),
          );
    for (const n of [1, 2, 3, 4, 6, 7, 16, 100]) {
      const partitionMetadata = Array.from({ length: n }, (_, partitionId) => ({
        partitionId,
        leader: 1,
        partitionErrorCode: 0,
        replicas: [1],
        isr: [1],
      }));
      assert.equal(
        partitionFor(key, n),
        kafkajs({ topic: 't', partitionMetadata, message: { key, value: 'x' } }),
        `key ${JSON.stringify(key)} with ${n} partitions`,
      );
      checked++;
    }
  }
  assert.equal(checked, 24000);
  assert.throws(() => partitionFor('k', 0), /positive integer/);
});

test('assignPartitions: deterministic, disjoint, complete, round-robin over sorted members', () => {
  const counts = new Map([
    ['a', 4],
    ['b', 3],
  ]);
  const members = [
    { member_id: 'm2', topics: ['a', 'b'] },
    { member_id: 'm1', topics: ['a', 'b'] },
  ];
  const got = assignPartitions(members, counts);
  assert.deepEqual(got.get('m1'), [
    { topic: 'a', partition: 0 },
    { topic: 'a', partition: 2 },
    { topic: 'b', partition: 0 },
    { topic: 'b', partition: 2 },
  ]);
  assert.deepEqual(got.get('m2'), [
    { topic: 'a', partition: 1 },
    { topic: 'a', partition: 3 },
    { topic: 'b', partition: 1 },
  ]);
  assert.deepEqual(
    assignPartitions([...members].reverse(), counts),
    got,
    'independent of the order members are listed',
  );
  // A member subscribed to one topic only gets partitions of that topic.
  const mixed = assignPartitions(
    [
      { member_id: 'x', topics: ['a'] },
      { member_id: 'y', topics: ['a', 'b'] },
    ],
    counts,
  );
  assert.ok(mixed.get('x')!.every((tp) => tp.topic === 'a'));
  assert.equal(mixed.get('y')!.filter((tp) => tp.topic === 'b').length, 3);
  assert.equal(mixed.get('x')!.length + mixed.get('y')!.length, 7);
  assert.deepEqual(assignPartitions([], counts), new Map());
});

test('chunkMessages: respects count and byte limits, keeps order, a large message goes alone', () => {
  const msg = (offset: number, size: number): BusMessage => ({
    topic: 't',
    partition: 0,
    offset,
    key: null,
    value: Buffer.alloc(size),
    headers: {},
    timestamp: 0,
  });
  const ms = [msg(0, 10), msg(1, 10), msg(2, 100), msg(3, 10), msg(4, 10), msg(5, 10)];
  const sizes = (b: BusMessage[][]) => b.map((c) => c.map((m) => m.offset));
  assert.deepEqual(sizes(chunkMessages(ms, 2, 1000)), [
    [0, 1],
    [2, 3],
    [4, 5],
  ]);
  assert.deepEqual(sizes(chunkMessages(ms, 10, 30)), [[0, 1], [2], [3, 4, 5]]);
  assert.deepEqual(chunkMessages([], 5, 5), []);
});

test('backoffMs: jittered in [d/2, d], exponential, capped', () => {
  for (let a = 0; a < 12; a++) {
    const d = Math.min(1000, 10 * 2 ** a);
    for (let i = 0; i < 50; i++) {
      const v = backoffMs(a, 10, 1000);
      assert.ok(v >= d / 2 && v <= d, `attempt ${a}: ${v} within [${d / 2}, ${d}]`);
    }
  }
});
