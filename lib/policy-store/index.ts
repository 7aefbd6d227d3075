/** Opens the policy store pipeline.policy_store names (lib/policy-store/port.ts). */
import { join } from 'node:path';
import type { Db } from '../db/database.ts';
import type { PolicyStore } from './port.ts';
import { FilesystemPolicyStore } from './filesystem-store.ts';
import { PostgresPolicyStore } from './postgres-store.ts';

export * from './port.ts';
export { FilesystemPolicyStore, verifyDir } from './filesystem-store.ts';
export { PostgresPolicyStore } from './postgres-store.ts';

export const POLICY_STORES = ['filesystem', 'postgres'] as const;

export function createPolicyStore(
  kind: (typeof POLICY_STORES)[number],
  opts: { runDir: string; runId: string; db: Db; cacheDir?: string | null },
): PolicyStore {
  switch (kind) {
    case 'filesystem':
      return new FilesystemPolicyStore(opts.runDir, opts.runId, opts.db);
    case 'postgres':
      return new PostgresPolicyStore(opts.cacheDir ?? join(opts.runDir, 'policy-cache'), opts.runId, opts.db);
  }
}
export { versionsToPrune, neededVersions, keptCheckpointSteps } from './retention.ts';
