/**
 * Uses the shared test database (RLSTREAM_TEST_PG_URL): this file runs alone (@runs-alone).
 * The policy-store contract over the postgres adapter: every reader has its own empty cache
 * directory (another node's emptyDir); files span several chunks (a small chunk size here).
 * Also: a damaged cached copy is not used but fetched again from the database.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { promises as fs, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { PostgresPolicyStore } from '../../../lib/policy-store/index.ts';
import { openDatabase } from '../../../lib/db/database.ts';
import { runPolicyStoreContract } from '../../support/policy-store-contract.ts';
import { PG_URL } from '../../../devkit/pipeline-procs.ts';
import { uniqueRunId } from '../../support/store-fixtures.ts';

runPolicyStoreContract('postgres', ({ runId, db, tmp }) => {
  let readers = 0;
  return {
    writer: new PostgresPolicyStore(join(tmp, 'writer-cache'), runId, db.db, 4096),
    reader: () => new PostgresPolicyStore(join(tmp, `reader-cache-${++readers}`), runId, db.db, 4096),
    async damage(kind, version, file) {
      await sql`update policy_chunks set data = overlay(data placing '\\xdeadbeef'::bytea from 10 for 4) where run_id = ${runId} and kind = ${kind} and version = ${version} and name = ${file} and seq = 1`.execute(
        db.db,
      );
    },
  };
});

test('postgres policy store: a damaged or lost cached copy is fetched again and checked', async () => {
  const db = await openDatabase({ kind: 'postgres', url: PG_URL });
  const tmp = mkdtempSync(join(tmpdir(), 'rl-policy-cache-'));
  const runId = uniqueRunId('policy-cache');
  try {
    const s = new PostgresPolicyStore(join(tmp, 'c'), runId, db.db, 1000);
    const dir = s.writeDir('policy', 7);
    await fs.mkdir(dir, { recursive: true });
    const bytes = Buffer.from(Array.from({ length: 5500 }, (_, i) => (i * 13) & 0xff));
    await fs.writeFile(join(dir, 'model.safetensors'), bytes);
    await s.put('policy', 7);
    assert.equal(
      (await sql<{ n: number }>`select count(*)::int as n from policy_chunks where run_id = ${runId}`.execute(db.db))
        .rows[0].n,
      6,
      '5500 bytes in 1000-byte chunks',
    );
    const damaged = Buffer.from(bytes);
    damaged[3] ^= 1;
    await fs.writeFile(join(dir, 'model.safetensors'), damaged);
    assert.equal(await s.get('policy', 7), dir);
    assert.deepEqual(
      await fs.readFile(join(dir, 'model.safetensors')),
      bytes,
      'the damaged cached copy was replaced by the stored bytes',
    );
    await fs.rm(dir, { recursive: true });
    assert.equal(await s.get('policy', 7), dir);
    assert.deepEqual(
      await fs.readFile(join(dir, 'model.safetensors')),
      bytes,
      'a lost cache (a new emptyDir) is refilled',
    );
  } finally {
    for (const t of ['policy_chunks', 'policy_files', 'policy_artifacts'])
      await sql`delete from ${sql.table(t)} where run_id = ${runId}`.execute(db.db);
    await db.close();
    rmSync(tmp, { recursive: true, force: true });
  }
});

test('PolicyCache: a version not written yet is retried, a pruned one is refused saying what to raise', async () => {
  const { PolicyCache } = await import('../../../lib/pipeline/policy.ts');
  const db = await openDatabase({ kind: 'postgres', url: PG_URL });
  const tmp = mkdtempSync(join(tmpdir(), 'rl-policy-pruned-'));
  const runId = uniqueRunId('policy-pruned');
  try {
    const s = new PostgresPolicyStore(join(tmp, 'c'), runId, db.db);
    for (const v of [0, 2]) {
      await fs.mkdir(s.writeDir('policy', v), { recursive: true });
      await fs.writeFile(join(s.writeDir('policy', v), 'model.safetensors'), Buffer.from(`v${v}`));
      await s.put('policy', v);
    }
    const cache = new PolicyCache(s, {} as never);
    await assert.rejects(cache.get(1), (e: unknown) => {
      assert.equal((e as { retriable: boolean }).retriable, false);
      assert.match(
        (e as Error).message,
        /policy version 1 is no longer in .*pruned it .*version 2.*trainer\.keep_policy_versions/,
      );
      return true;
    });
    await assert.rejects(
      cache.get(3),
      (e: unknown) =>
        (e as { retriable: boolean }).retriable === true && /not in .* \(yet\); retrying/.test((e as Error).message),
    );
  } finally {
    for (const t of ['policy_chunks', 'policy_files', 'policy_artifacts'])
      await sql`delete from ${sql.table(t)} where run_id = ${runId}`.execute(db.db);
    await db.close();
    rmSync(tmp, { recursive: true, force: true });
  }
});
