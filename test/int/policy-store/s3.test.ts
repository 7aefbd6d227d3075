/**
 * Uses the shared test database (RLSTREAM_TEST_PG_URL): this file runs alone (@runs-alone).
 * The policy-store contract over the S3 adapter, against s3rver on 127.0.0.1: every reader has its
 * own empty cache directory (another node's emptyDir); files above the part size go up as
 * multipart uploads (a small part size here). Also: an object deleted from the bucket is refused
 * with its key, and `remove` leaves no object of the version behind.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { promises as fs, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DeleteObjectCommand, GetObjectCommand, ListObjectsV2Command, PutObjectCommand } from '@aws-sdk/client-s3';
import { IntegrityError, S3PolicyStore } from '../../../lib/policy-store/index.ts';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import { runPolicyStoreContract } from '../../support/policy-store-contract.ts';
import { PG_URL } from '../../../devkit/pipeline-procs.ts';
import { startLocalS3, type LocalS3 } from '../../../devkit/s3-local.ts';
import { uniqueRunId } from '../../support/store-fixtures.ts';

let s3: LocalS3;
before(async () => {
  s3 = await startLocalS3();
});
after(async () => {
  await s3.close();
});

const PART = 8 * 1024; // the contract's 20 kB model file goes up in 3 parts
const store = (runId: string, db: Database, cache: string) =>
  new S3PolicyStore(s3.client, { bucket: s3.bucket, prefix: 'contract/' }, cache, runId, db.db, PART, true);

async function keys(prefix: string): Promise<string[]> {
  const page = await s3.client.send(new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: prefix }));
  return (page.Contents ?? []).map((o) => o.Key!).sort();
}

runPolicyStoreContract('s3', ({ runId, db, tmp }) => {
  let readers = 0;
  const writer = store(runId, db, join(tmp, 'writer-cache'));
  return {
    writer,
    reader: () => store(runId, db, join(tmp, `reader-cache-${++readers}`)),
    async damage(kind, version, file) {
      const f = (await writer.files(kind, version)).find((x) => x.name === file)!;
      const Key = `contract/${runId}/${kind}/v${String(version).padStart(6, '0')}/${f.sha256}/${file}`;
      const got = await s3.client.send(new GetObjectCommand({ Bucket: s3.bucket, Key }));
      const b = Buffer.from(await got.Body!.transformToByteArray());
      for (let i = 100; i < 164; i++) b[i] ^= 0xff;
      await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key, Body: b }));
    },
  };
});

test('s3 policy store: multipart objects, a lost object named, remove leaves nothing behind', async () => {
  const db = await openDatabase({ kind: 'postgres', url: PG_URL });
  const tmp = mkdtempSync(join(tmpdir(), 'rl-policy-s3-'));
  const runId = uniqueRunId('policy-s3');
  try {
    const w = store(runId, db, join(tmp, 'w'));
    const dir = w.writeDir('policy', 4);
    await fs.mkdir(dir, { recursive: true });
    const bytes = Buffer.from(Array.from({ length: 3 * PART + 17 }, (_, i) => (i * 29) & 0xff));
    await fs.writeFile(join(dir, 'model.safetensors'), bytes);
    await fs.writeFile(join(dir, 'config.json'), '{}');
    const [, model] = await w.put('policy', 4);
    const prefix = `contract/${runId}/policy/v000004/`;
    assert.deepEqual(
      await keys(prefix),
      [
        `${prefix}${model.sha256}/model.safetensors`,
        `${prefix}44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a/config.json`,
      ].sort(),
    );
    const r = store(runId, db, join(tmp, 'r'));
    assert.deepEqual(await fs.readFile(join((await r.get('policy', 4))!, 'model.safetensors')), bytes);
    await s3.client.send(
      new DeleteObjectCommand({ Bucket: s3.bucket, Key: `${prefix}${model.sha256}/model.safetensors` }),
    );
    await assert.rejects(store(runId, db, join(tmp, 'r2')).get('policy', 4), (e: unknown) => {
      assert.ok(e instanceof IntegrityError);
      assert.match(e.message, /model\.safetensors\) is missing from the bucket/);
      return true;
    });
    await w.remove('policy', 4);
    assert.deepEqual(await keys(prefix), []);
    assert.deepEqual(await w.versions('policy'), []);
  } finally {
    await db.close();
    rmSync(tmp, { recursive: true, force: true });
  }
});
