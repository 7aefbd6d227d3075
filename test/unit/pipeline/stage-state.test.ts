/**
 * Pending items of a stage (lib/pipeline/stage-state.ts) on an embedded store: multi-row inserts
 * keep every item with its payload and headers, ignore redelivered and repeated ids, span several
 * statements for large batches, and join a transaction that rolls back with it.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import { addPending, listPending, pendingBuckets, deletePending, type PendingItem } from '../../../lib/pipeline/stage-state.ts';

let dir: string;
let db: Database;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rlstream-stage-state-'));
  db = await openDatabase({ kind: 'pglite', dir });
});
after(async () => { await db.close(); rmSync(dir, { recursive: true, force: true }); });

const item = (bucket: string, id: string, byte: number): PendingItem => ({ bucket, id, payload: Buffer.from([byte, 0, 255]), headers: { 'rl-schema': `s${byte}` } });

test('multi-row insert keeps payloads and headers; redelivered and repeated ids are ignored', async () => {
  await addPending(db.db, 'r1', 'advantage', [item('step:1', 'b', 2), item('step:1', 'a', 1), item('step:2', 'a', 3), item('step:1', 'a', 9)]);
  await addPending(db.db, 'r1', 'advantage', [item('step:1', 'b', 7), item('step:1', 'c', 4)]);
  const one = await listPending(db.db, 'r1', 'advantage', 'step:1');
  assert.deepEqual(one.map((x) => x.id), ['a', 'b', 'c']);
  assert.deepEqual(one.map((x) => [...x.payload]), [[1, 0, 255], [2, 0, 255], [4, 0, 255]], 'the first copy of an id wins');
  assert.deepEqual(one.map((x) => x.headers['rl-schema']), ['s1', 's2', 's4']);
  assert.deepEqual(await pendingBuckets(db.db, 'r1', 'advantage'), ['step:1', 'step:2']);
  assert.deepEqual(await listPending(db.db, 'r1', 'update', 'step:1'), [], 'stages do not see each other\'s items');
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
  await assert.rejects(db.db.transaction().execute(async (tx) => {
    await addPending(tx, 'r3', 'update', [item('step:1', 'x', 1), item('step:1', 'y', 2)]);
    throw new Error('batch failed');
  }), /batch failed/);
  assert.deepEqual(await listPending(db.db, 'r3', 'update', 'step:1'), []);
  await addPending(db.db, 'r3', 'update', []);
  assert.deepEqual(await pendingBuckets(db.db, 'r3', 'update'), [], 'an empty batch writes nothing');
});
