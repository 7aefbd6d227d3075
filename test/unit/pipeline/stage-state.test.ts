/**
 * Pending items of a stage (lib/pipeline/stage-state.ts) on an embedded store: multi-row inserts
 * keep every item with its payload and headers, ignore redelivered and repeated ids, span several
 * statements for large batches, and join a transaction that rolls back with it. A PendingBatch
 * writes only the items of buckets its batch did not settle.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import {
  addPending,
  listPending,
  pendingBuckets,
  deletePending,
  PendingBatch,
  type PendingItem,
} from '../../../lib/pipeline/stage-state.ts';

let dir: string;
let db: Database;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rlstream-stage-state-'));
  db = await openDatabase({ kind: 'pglite', dir });
});
after(async () => {
  await db.close();
  rmSync(dir, { recursive: true, force: true });
});

const item = (bucket: string, id: string, byte: number): PendingItem => ({
  bucket,
  id,
  payload: Buffer.from([byte, 0, 255]),
  headers: { 'rl-schema': `s${byte}` },
});

test('multi-row insert keeps payloads and headers; redelivered and repeated ids are ignored', async () => {
  await addPending(db.db, 'r1', 'advantage', [
    item('step:1', 'b', 2),
    item('step:1', 'a', 1),
    item('step:2', 'a', 3),
    item('step:1', 'a', 9),
  ]);
  await addPending(db.db, 'r1', 'advantage', [item('step:1', 'b', 7), item('step:1', 'c', 4)]);
  const one = await listPending(db.db, 'r1', 'advantage', 'step:1');
  assert.deepEqual(
    one.map((x) => x.id),
    ['a', 'b', 'c'],
  );
  assert.deepEqual(
    one.map((x) => [...x.payload]),
    [
      [1, 0, 255],
      [2, 0, 255],
      [4, 0, 255],
    ],
    'the first copy of an id wins',
  );
  assert.deepEqual(
    one.map((x) => x.headers['rl-schema']),
    ['s1', 's2', 's4'],
  );
  assert.deepEqual(await pendingBuckets(db.db, 'r1', 'advantage'), ['step:1', 'step:2']);
  assert.deepEqual(await listPending(db.db, 'r1', 'update', 'step:1'), [], "stages do not see each other's items");
  await deletePending(db.db, 'r1', 'advantage', 'step:1');
  assert.deepEqual(await pendingBuckets(db.db, 'r1', 'advantage'), ['step:2']);
});

test('a batch larger than one statement is stored whole', async () => {
  const many = Array.from({ length: 1234 }, (_, i) => item('step:9', `g${String(i).padStart(5, '0')}`, i % 256));
  await addPending(db.db, 'r2', 'update', many);
  const got = await listPending(db.db, 'r2', 'update', 'step:9');
  assert.equal(got.length, 1234);
  assert.equal(got[1000].id, 'g01000');
  assert.deepEqual([...got[1000].payload], [1000 % 256, 0, 255]);
});

test('inside a transaction that fails, nothing is kept', async () => {
  await assert.rejects(
    db.db.transaction().execute(async (tx) => {
      await addPending(tx, 'r3', 'update', [item('step:1', 'x', 1), item('step:1', 'y', 2)]);
      throw new Error('batch failed');
    }),
    /batch failed/,
  );
  assert.deepEqual(await listPending(db.db, 'r3', 'update', 'step:1'), []);
  await addPending(db.db, 'r3', 'update', []);
  assert.deepEqual(await pendingBuckets(db.db, 'r3', 'update'), [], 'an empty batch writes nothing');
});

test('PendingBatch: a bucket settled within its batch is never written; unsettled items are; stored rows of settled buckets go', async () => {
  // an earlier batch left half of step 2 pending
  await addPending(db.db, 'r4', 'update', [item('step:2', 'b', 2)]);
  const batch = new PendingBatch(db.db, 'r4', 'update');
  batch.add([
    item('step:1', 'z', 9),
    item('step:1', 'y', 8),
    item('step:2', 'a', 1),
    item('step:2', 'b', 7),
    item('step:3', 'c', 3),
    item('step:1', 'y', 5),
  ]);
  const one = await batch.items('step:1');
  assert.deepEqual(
    one.map((x) => [x.id, x.payload[0]]),
    [
      ['y', 8],
      ['z', 9],
    ],
    'ordered by id; a repeated id keeps its first copy',
  );
  const two = await batch.items('step:2');
  assert.deepEqual(
    two.map((x) => [x.id, x.payload[0]]),
    [
      ['a', 1],
      ['b', 2],
    ],
    'the stored copy of a redelivered id wins',
  );
  assert.deepEqual(
    two.map((x) => x.headers['rl-schema']),
    ['s1', 's2'],
  );
  batch.settle('step:1');
  batch.settle('step:2');
  assert.deepEqual(await pendingBuckets(db.db, 'r4', 'update'), ['step:2'], 'nothing is written before persist()');
  await batch.persist();
  assert.deepEqual(
    await pendingBuckets(db.db, 'r4', 'update'),
    ['step:3'],
    'settled buckets leave nothing; the unsettled one is stored',
  );
  assert.deepEqual(
    (await listPending(db.db, 'r4', 'update', 'step:3')).map((x) => [x.id, x.payload[0]]),
    [['c', 3]],
  );
  // the next batch completes step 3 from the stored item and its own
  const next = new PendingBatch(db.db, 'r4', 'update');
  next.add([item('step:3', 'd', 4)]);
  assert.deepEqual(
    (await next.items('step:3')).map((x) => x.id),
    ['c', 'd'],
  );
  next.settle('step:3');
  await next.persist();
  assert.deepEqual(await pendingBuckets(db.db, 'r4', 'update'), []);
});
