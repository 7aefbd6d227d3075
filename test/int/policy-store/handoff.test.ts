/**
 * Uses the shared test database (RLSTREAM_TEST_PG_URL): this file runs alone (@runs-alone).
 * The in-process hand-off of a written policy version (lib/policy-store/handoff.ts): a reader
 * sharing the writer's store object samples with the writer's arrays without reading the files;
 * a reader with its own store (another process) reads and verifies them; a version whose recorded
 * bytes are not the handed-off ones is read from the store; bf16 versions hand off the weights
 * rounded as a reader of the store gets them. A version kept in memory only (policy.version_files =
 * checkpoints) has no file, is named by the sha256 of the bytes it would be written as, is taken
 * from memory until the writer drops it, and is then gone. A reader that releases a version taken
 * from memory takes it again without a load, and holds nothing once it has.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { openDatabase } from '../../../lib/db/database.ts';
import { FilesystemPolicyStore } from '../../../lib/policy-store/index.ts';
import { sha256File } from '../../../lib/policy-store/hash.ts';
import { RunVersions } from '../../../lib/pipeline/run-versions.ts';
import { PolicyCache } from '../../../lib/pipeline/policy.ts';
import { initWeights, modelConfig } from '../../../lib/model/index.ts';
import { collectGarbage } from '../../../lib/util/gc.ts';
import { roundedToBf16 } from '../../../lib/model/safetensors.ts';
import { PG_URL } from '../../../devkit/pipeline-procs.ts';
import { uniqueRunId } from '../../support/store-fixtures.ts';
import { TINY_ONE_LAYER } from '../../support/tiny-models.ts';

const model = modelConfig(TINY_ONE_LAYER);

interface Fixture {
  db: Awaited<ReturnType<typeof openDatabase>>;
  runDir: string;
  runId: string;
  store: FilesystemPolicyStore;
}

/** A filesystem policy store of a fresh run in the shared database; its rows and files go afterwards. */
async function withStore(name: string, body: (f: Fixture) => Promise<void>): Promise<void> {
  const db = await openDatabase({ kind: 'postgres', url: PG_URL });
  const runDir = mkdtempSync(join(tmpdir(), 'rl-handoff-'));
  const runId = uniqueRunId(name);
  try {
    await body({ db, runDir, runId, store: new FilesystemPolicyStore(runDir, runId, db.db) });
  } finally {
    for (const t of ['policy_chunks', 'policy_files', 'policy_artifacts'])
      await sql`delete from ${sql.table(t)} where run_id = ${runId}`.execute(db.db);
    await db.close();
    rmSync(runDir, { recursive: true, force: true });
  }
}

test('policy hand-off: same-process readers take the written arrays, other processes read the store', async () => {
  await withStore('handoff', async ({ db, runDir, runId, store }) => {
    const versions = new RunVersions(
      store,
      { runId, runDir, store: null as never },
      { lora: null, assetsFrom: null, db: db.db },
    );
    const w1 = initWeights(model, 1);
    const sha = await versions.put('policy', 1, model, w1, { metadata: { policy_version: '1' } });
    // the recorded sha256s are those of the bytes on disk (recorded from memory, not read back)
    for (const f of await store.files('policy', 1))
      assert.equal(f.sha256, await sha256File(join(store.writeDir('policy', 1), f.name)), f.name);
    assert.equal((await versions.record(1, 0)).sha256, sha);

    const embedded = new PolicyCache(store, model);
    assert.equal(await embedded.get(1), w1, 'the very arrays the writer stored');
    assert.equal(embedded.fromMemory, 1);

    // policy.dtype bf16: the hand-off and a read of the store give the same rounded weights
    const half = new RunVersions(
      store,
      { runId, runDir, store: null as never },
      { lora: null, assetsFrom: null, db: db.db, policyDtype: 'bf16' },
    );
    await half.put('policy', 3, model, w1, {});
    const mem = await new PolicyCache(store, model).get(3);
    const disk = await new PolicyCache(new FilesystemPolicyStore(runDir, runId, db.db), model).get(3);
    for (const [k, v] of w1) {
      assert.deepEqual(mem.get(k), roundedToBf16(v), k);
      assert.deepEqual(disk.get(k), mem.get(k), k);
    }

    const other = new PolicyCache(new FilesystemPolicyStore(runDir, runId, db.db), model);
    const read = await other.get(1);
    assert.notEqual(read, w1);
    assert.equal(other.fromMemory, 0);
    for (const [k, v] of w1) assert.deepEqual(read.get(k), v, k);

    // version 2 written by another writer (other bytes recorded): the hand-off of this writer's v2 is not used
    const w2 = initWeights(model, 2);
    await versions.put('policy', 2, model, w2, {});
    const elsewhere = new RunVersions(
      new FilesystemPolicyStore(runDir, runId, db.db),
      { runId, runDir, store: null as never },
      {
        lora: null,
        assetsFrom: null,
        db: db.db,
      },
    );
    const w2b = initWeights(model, 3);
    await elsewhere.put('policy', 2, model, w2b, {});
    const fresh = new PolicyCache(store, model);
    const got = await fresh.get(2);
    assert.equal(fresh.fromMemory, 0, 'recorded sha256 differs: read from the store');
    for (const [k, v] of w2b) assert.deepEqual(got.get(k), v, k);
  });
});

test('policy hand-off: a version kept in memory only has the sha256 of its file, no file, and goes when dropped', async () => {
  await withStore('handoff-mem', async ({ db, runDir, runId, store }) => {
    for (const policyDtype of ['f32', 'bf16'] as const) {
      const versions = new RunVersions(
        store,
        { runId, runDir, store: null as never },
        { lora: null, assetsFrom: null, db: db.db, policyDtype },
      );
      const w = initWeights(model, 7);
      const meta = { metadata: { policy_version: '4' } };
      const v = policyDtype === 'f32' ? 4 : 5;
      const mem = await versions.put('policy', v, model, w, { ...meta, inMemoryOnly: true });
      assert.deepEqual(await store.files('policy', v), [], 'nothing recorded');
      assert.equal(existsSync(store.writeDir('policy', v)), false, 'nothing written');
      assert.equal(await versions.stored(v), false);
      assert.equal((await versions.record(v, 0)).sha256, mem);
      const cache = new PolicyCache(store, model);
      const got = await cache.get(v);
      assert.equal(cache.fromMemory, 1);
      // the same weights written: the file's sha256 is the one the in-memory version is named by
      const written = await versions.put('policy', 9, model, w, meta);
      assert.equal(mem, written, policyDtype);
      const read = await new PolicyCache(new FilesystemPolicyStore(runDir, runId, db.db), model).get(9);
      for (const [k, a] of read) assert.deepEqual(got.get(k), a, k);
      await store.remove('policy', 9);
      // dropped: no reader can take it any more, and there is no file to read
      versions.retainInMemory(v + 1);
      await assert.rejects(new PolicyCache(store, model).get(v), /not in/);
    }
  });
});

/** A full collection once the current job has ended (a WeakRef's target stays alive until then). */
async function settle(): Promise<void> {
  await new Promise((r) => setImmediate(r));
  collectGarbage();
}

test('policy hand-off: a reader that released a version takes it again for free, and once dropped nothing holds its arrays', async () => {
  await withStore('handoff-release', async ({ db, runDir, runId, store }) => {
    const versions = new RunVersions(
      store,
      { runId, runDir, store: null as never },
      { lora: null, assetsFrom: null, db: db.db },
    );
    const loads: number[] = [];
    const cache = new PolicyCache(store, model, (v) => loads.push(v));
    for (const v of [1, 2]) await versions.put('policy', v, model, initWeights(model, v), { inMemoryOnly: true });
    // weak references to the handed-off arrays (taken by a throwaway reader): they alone keep nothing alive
    const handed = async (v: number) => new WeakRef(await new PolicyCache(store, model).get(v));
    const refs = new Map([
      [1, await handed(1)],
      [2, await handed(2)],
    ]);
    assert.equal(await cache.get(1), refs.get(1)!.deref(), 'the handed-off arrays');
    cache.release();
    assert.equal(await cache.get(1), refs.get(1)!.deref(), 'taken again from the hand-off');
    assert.deepEqual(loads, [1], 'taking a released version again is not a new load');
    assert.equal(cache.fromMemory, 1);
    cache.release();
    // a validation round still samples with version 1: kept; version 2 is below the oldest a rollout may ask for
    assert.equal(versions.retainInMemory(3, [1]), 1);
    await settle();
    assert.equal(refs.get(2)!.deref(), undefined, 'the dropped version is freed');
    assert.equal(await cache.get(1), refs.get(1)!.deref());
    cache.release();
    assert.equal(versions.retainInMemory(3), 1);
    await settle();
    assert.equal(refs.get(1)!.deref(), undefined, 'released by the reader and dropped by the writer: freed');
    await assert.rejects(cache.get(1), /not in/);
  });
});
