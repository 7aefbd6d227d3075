/**
 * Uses the shared test database (RLSTREAM_TEST_PG_URL): this file runs alone (@runs-alone).
 * The in-process hand-off of a written policy version (lib/policy-store/handoff.ts): a reader
 * sharing the writer's store object samples with the writer's arrays without reading the files;
 * a reader with its own store (another process) reads and verifies them; a version whose recorded
 * bytes are not the handed-off ones is read from the store; bf16 versions hand off the weights
 * rounded as a reader of the store gets them.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { openDatabase } from '../../../lib/db/database.ts';
import { FilesystemPolicyStore } from '../../../lib/policy-store/index.ts';
import { sha256File } from '../../../lib/policy-store/hash.ts';
import { RunVersions } from '../../../lib/pipeline/run-versions.ts';
import { PolicyCache } from '../../../lib/pipeline/policy.ts';
import { initWeights, modelConfig } from '../../../lib/model/index.ts';
import { roundedToBf16 } from '../../../lib/model/safetensors.ts';
import { PG_URL } from '../../../devkit/pipeline-procs.ts';
import { uniqueRunId } from '../../support/store-fixtures.ts';
import { TINY_ONE_LAYER } from '../../support/tiny-models.ts';

const model = modelConfig(TINY_ONE_LAYER);

test('policy hand-off: same-process readers take the written arrays, other processes read the store', async () => {
  const db = await openDatabase({ kind: 'postgres', url: PG_URL });
  const runDir = mkdtempSync(join(tmpdir(), 'rl-handoff-'));
  const runId = uniqueRunId('handoff');
  try {
    const store = new FilesystemPolicyStore(runDir, runId, db.db);
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
  } finally {
    for (const t of ['policy_chunks', 'policy_files', 'policy_artifacts'])
      await sql`delete from ${sql.table(t)} where run_id = ${runId}`.execute(db.db);
    await db.close();
    rmSync(runDir, { recursive: true, force: true });
  }
});
