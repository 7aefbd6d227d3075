/** The policy-store contract over the filesystem adapter (a run directory shared by the processes). */
import { promises as fs } from 'node:fs';
import { join } from 'node:path';
import { FilesystemPolicyStore } from '../../../lib/policy-store/index.ts';
import { runPolicyStoreContract } from '../../support/policy-store-contract.ts';

runPolicyStoreContract('filesystem', ({ runId, runDir, db }) => {
  const writer = new FilesystemPolicyStore(runDir, runId, db.db);
  return {
    writer,
    reader: () => new FilesystemPolicyStore(runDir, runId, db.db),
    async damage(kind, version, file) {
      const path = join(writer.writeDir(kind, version), file);
      const b = await fs.readFile(path);
      for (let i = 100; i < 164; i++) b[i] ^= 0xff;
      await fs.writeFile(path, b);
    },
  };
});
