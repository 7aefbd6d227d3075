/**
 * The store contract on PGlite in a run directory, plus the lock file: a second process that opens
 * the same embedded database gets a clear error naming the holder's PID (PGlite itself would let
 * it in and silently lose its rows).
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { openDatabase } from '../../../lib/db/database.ts';
import { PgliteStore } from '../../../lib/store/pglite-store.ts';
import { runStoreContract } from '../../support/store-contract.ts';

const dir = mkdtempSync(join(tmpdir(), 'rlstream-store-pglite-'));
after(() => rmSync(dir, { recursive: true, force: true }));

runStoreContract('pglite', async () => {
  const database = await openDatabase({ kind: 'pglite', dir });
  return { database, store: new PgliteStore(database) };
});

describe('PgliteStore specifics', () => {
  it('a second process opening the same run directory gets an error naming this PID', async () => {
    const database = await openDatabase({ kind: 'pglite', dir });
    try {
      const storeModule = pathToFileURL(resolve('lib/store/index.ts')).href;
      const child = spawnSync(
        process.execPath,
        [
          '--import',
          'tsx',
          '--input-type=module',
          '-e',
          `
        import { openStore } from ${JSON.stringify(storeModule)};
        try {
          const store = await openStore({ kind: 'pglite', dir: ${JSON.stringify(dir)} });
          await store.close();
          console.log('OPENED');
        } catch (e) {
          console.error(e.code + ': ' + e.message);
          process.exit(3);
        }`,
        ],
        { encoding: 'utf8', timeout: 120_000 },
      );
      assert.equal(
        child.status,
        3,
        `child should fail to open: status ${child.status}, stdout ${child.stdout}, stderr ${child.stderr}`,
      );
      assert.match(
        child.stderr,
        new RegExp(`ERR_LOCKED: embedded database at .* is in use by another process \\(PID ${process.pid}\\b`),
      );
      assert.doesNotMatch(child.stdout, /OPENED/);
    } finally {
      await database.close();
    }
  });
});
