/**
 * The embedded log's in-memory mirror (PGlite): ends and positions only move forward (seek may
 * move a position back), the tail serves exactly the range it holds, and eviction keeps it bounded.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { LocalLog, type Appended } from '../../../lib/bus/embedded-local.ts';
import type { BusMessage } from '../../../lib/bus/port.ts';

const msg = (topic: string, partition: number, offset: number, bytes = 4): BusMessage => ({
  topic,
  partition,
  offset,
  key: `k${offset}`,
  value: Buffer.alloc(bytes, offset % 256),
  headers: { h: String(offset) },
  timestamp: 1000 + offset,
});
const append = (topic: string, partition: number, base: number, n: number, bytes = 4): Appended => ({
  topic,
  partition,
  base,
  msgs: Array.from({ length: n }, (_, i) => msg(topic, partition, base + i, bytes)),
});

describe('embedded log mirror (LocalLog)', () => {
  test('end offsets: the larger of what the table said and what committed here', () => {
    const l = new LocalLog();
    assert.equal(l.hasTopic('t'), false);
    l.committed([append('t', 1, 10, 2)]); // committed before the table was read
    l.loadTopic('t', [
      { partition: 0, next_offset: 5 },
      { partition: 1, next_offset: 10 },
    ]);
    assert.equal(l.hasTopic('t'), true);
    assert.deepEqual([l.end('t', 0), l.end('t', 1), l.end('t', 2)], [5, 12, 0]);
    l.committed([append('t', 0, 5, 3)]);
    assert.equal(l.end('t', 0), 8);
  });

  test('positions move forward unless forced (seek)', () => {
    const l = new LocalLog();
    assert.equal(l.position('g', 't', 0), 0);
    l.setPosition('g', 't', 0, 7);
    l.setPosition('g', 't', 0, 3); // an older read of the table
    assert.equal(l.position('g', 't', 0), 7);
    l.setPosition('g', 't', 0, 2, true);
    assert.equal(l.position('g', 't', 0), 2);
    assert.equal(l.position('other', 't', 0), 0);
  });

  test('tail: serves from its first offset to the end, nothing before it or past the end', () => {
    const l = new LocalLog();
    l.committed([append('t', 0, 100, 5)]);
    assert.equal(l.fromTail('t', 0, 99, 10), undefined, 'before the tail: read the table');
    assert.equal(l.fromTail('t', 1, 100, 10), undefined, 'another partition');
    assert.deepEqual(
      l.fromTail('t', 0, 102, 10)!.map((m) => m.offset),
      [102, 103, 104],
    );
    assert.deepEqual(l.fromTail('t', 0, 105, 10), [], 'at the end: nothing new');
    assert.equal(l.fromTail('t', 0, 106, 10), undefined, 'past the end: not ours to answer');
    assert.deepEqual(
      l.fromTail('t', 0, 100, 2)!.map((m) => m.offset),
      [100, 101],
      'at most max',
    );
    const got = l.fromTail('t', 0, 103, 1)![0]!;
    assert.deepEqual(got, msg('t', 0, 103));
    got.headers.h = 'changed'; // callers get their own headers
    assert.equal(l.fromTail('t', 0, 103, 1)![0]!.headers.h, '103');
  });

  test('tail: maxBytes bounds a batch unless the first message alone is larger', () => {
    const l = new LocalLog();
    l.committed([append('t', 0, 0, 4, 100)]);
    assert.deepEqual(
      l.fromTail('t', 0, 0, 10, 250)!.map((m) => m.offset),
      [0, 1],
    );
    assert.deepEqual(
      l.fromTail('t', 0, 0, 10, 50)!.map((m) => m.offset),
      [0],
    );
  });

  test('tail: bounded by message count, oldest dropped first; a gap restarts it', () => {
    const l = new LocalLog();
    for (let b = 0; b < 600; b += 100) l.committed([append('t', 0, b, 100)]);
    assert.equal(l.fromTail('t', 0, 343, 1), undefined, 'evicted: read the table');
    assert.equal(l.fromTail('t', 0, 344, 1)![0]!.offset, 344, '256 newest kept');
    assert.equal(l.end('t', 0), 600);
    l.committed([append('t', 0, 700, 1)]);
    assert.equal(l.fromTail('t', 0, 650, 1), undefined);
    assert.equal(l.fromTail('t', 0, 700, 5)!.length, 1);
  });
});

test('members: join, leave and list per group, as bus_members rows', () => {
  const l = new LocalLog();
  l.join('g', 'm1', ['a', 'b']);
  l.join('g', 'm2', ['a']);
  l.join('h', 'm3', ['c']);
  assert.deepEqual(l.membersOf('g'), [
    { member_id: 'm1', topics: ['a', 'b'] },
    { member_id: 'm2', topics: ['a'] },
  ]);
  l.leave('g', 'm1');
  assert.deepEqual(l.membersOf('g'), [{ member_id: 'm2', topics: ['a'] }]);
  assert.deepEqual(l.membersOf('h'), [{ member_id: 'm3', topics: ['c'] }]);
  assert.deepEqual(l.membersOf('none'), []);
});
