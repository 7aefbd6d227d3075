/**
 * The policy-store contract (lib/policy-store/port.ts): one suite every adapter passes
 * (filesystem, postgres), over the test PostgreSQL (the manifest lives there for both). A harness
 * makes a writer store and a second "reader" store as another process or node would have it
 * (the same run directory for the filesystem store — a shared volume —, an empty cache directory
 * of its own for the postgres store), and damages the authoritative copy of a stored file.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { promises as fs, mkdtempSync, rmSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { openDatabase, type Database } from '../../lib/db/database.ts';
import { IntegrityError, type ArtifactKind, type PolicyStore } from '../../lib/policy-store/index.ts';
import { PG_URL } from '../../devkit/pipeline-procs.ts';
import { uniqueRunId } from './store-fixtures.ts';

export interface PolicyStoreHarness {
  writer: PolicyStore;
  /** The store as another process (another node) opens it. */
  reader(): PolicyStore;
  /** Flips bytes of the authoritative copy of one stored file (what a later get reads from). */
  damage(kind: ArtifactKind, version: number, file: string): Promise<void>;
}

export type MakeHarness = (ctx: { runId: string; runDir: string; db: Database; tmp: string }) => PolicyStoreHarness;

const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

/** Writes a version's files the way the update stage does: into writeDir, then put. */
async function writeVersion(
  store: PolicyStore,
  kind: ArtifactKind,
  version: number,
  seed: number,
  db?: Parameters<PolicyStore['put']>[2],
) {
  const dir = store.writeDir(kind, version);
  await fs.mkdir(dir, { recursive: true });
  const model = Buffer.alloc(20_000 + seed, 0);
  for (let i = 0; i < model.length; i++) model[i] = (i * 31 + seed * 7) & 0xff;
  const files = {
    'model.safetensors': model,
    'optimizer.safetensors': Buffer.from(`adam ${seed}`.repeat(300)),
    'config.json': Buffer.from(JSON.stringify({ seed })),
  };
  for (const [n, b] of Object.entries(files)) await fs.writeFile(join(dir, n), b);
  const put = await store.put(kind, version, db);
  return { files, put };
}

async function readAll(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const n of (await fs.readdir(dir)).sort()) out[n] = sha(await fs.readFile(join(dir, n)));
  return out;
}

export function runPolicyStoreContract(name: string, make: MakeHarness): void {
  describe(`policy store contract: ${name}`, () => {
    let db: Database;
    const tmp = mkdtempSync(join(tmpdir(), `rl-policy-${name}-`));
    const runs: string[] = [];
    let n = 0;
    before(async () => {
      db = await openDatabase({ kind: 'postgres', url: PG_URL });
    });
    after(async () => {
      for (const r of runs)
        for (const t of ['policy_chunks', 'policy_files', 'policy_artifacts'])
          await sql`delete from ${sql.table(t)} where run_id = ${r}`.execute(db.db);
      await db.close();
      rmSync(tmp, { recursive: true, force: true });
    });
    const harness = () => {
      const runId = uniqueRunId(`policy-${name}`);
      runs.push(runId);
      n++;
      return make({ runId, runDir: join(tmp, `run${n}`), db, tmp: join(tmp, `x${n}`) });
    };

    it('a version not written is null; versions() is empty', async () => {
      const h = harness();
      assert.equal(await h.writer.get('policy', 0), null);
      assert.deepEqual(await h.writer.versions('policy'), []);
      assert.deepEqual(await h.reader().files('policy', 0), []);
    });

    it('put then get: another process reads the same bytes, with their sha256 recorded', async () => {
      const h = harness();
      const { files, put } = await writeVersion(h.writer, 'policy', 3, 1);
      assert.deepEqual(
        put.map((f) => f.name),
        Object.keys(files).sort(),
      );
      for (const f of put) assert.equal(f.sha256, sha(files[f.name as keyof typeof files]));
      const r = h.reader();
      const dir = await r.get('policy', 3);
      assert.ok(dir, 'the reader sees the version');
      assert.deepEqual(await readAll(dir), Object.fromEntries(put.map((f) => [f.name, f.sha256])));
      assert.deepEqual(await r.files('policy', 3), put);
      assert.deepEqual(await r.versions('policy'), [3]);
      assert.deepEqual(await r.versions('critic'), [], 'kinds are separate');
    });

    it('put replaces a version (a restarted writer rewrites it)', async () => {
      const h = harness();
      await writeVersion(h.writer, 'critic', 1, 1);
      const r = h.reader();
      await r.get('critic', 1);
      const { put } = await writeVersion(h.writer, 'critic', 1, 2);
      const dir = await r.get('critic', 1);
      assert.deepEqual(
        await readAll(dir!),
        Object.fromEntries(put.map((f) => [f.name, f.sha256])),
        'the reader gets the new bytes, not its cached copy',
      );
    });

    it('a damaged file is refused with its path and both hashes', async () => {
      const h = harness();
      const { put } = await writeVersion(h.writer, 'policy', 2, 3);
      await h.damage('policy', 2, 'model.safetensors');
      const want = put.find((f) => f.name === 'model.safetensors')!.sha256;
      await assert.rejects(h.reader().get('policy', 2), (e: unknown) => {
        assert.ok(e instanceof IntegrityError, String(e));
        assert.equal(e.retriable, false);
        assert.match(e.message, /model\.safetensors/);
        assert.ok(e.message.includes(want), 'names the recorded sha256');
        const actual = (e.details as { actual: string }).actual;
        assert.match(actual, /^[0-9a-f]{64}$/);
        assert.ok(e.message.includes(actual), 'names the sha256 found');
        return true;
      });
    });

    it('remove prunes a version everywhere; others stay', async () => {
      const h = harness();
      for (const v of [0, 1, 2]) await writeVersion(h.writer, 'ema', v, v);
      await h.writer.remove('ema', 1);
      const r = h.reader();
      assert.deepEqual(await r.versions('ema'), [0, 2]);
      assert.equal(await r.get('ema', 1), null);
      assert.equal(await h.writer.get('ema', 1), null);
      assert.deepEqual(await r.files('ema', 1), []);
      assert.ok(await r.get('ema', 2));
    });

    it('put inside a transaction is visible once it commits', async () => {
      const h = harness();
      await db.db.transaction().execute(async (tx) => {
        await writeVersion(h.writer, 'policy', 5, 5, tx);
        assert.deepEqual((await h.writer.files('policy', 5, tx)).length, 3, 'visible inside the transaction');
      });
      assert.ok(await h.reader().get('policy', 5));
    });
  });
}
