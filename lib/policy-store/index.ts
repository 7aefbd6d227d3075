/** Opens the policy store pipeline.policy_store names (lib/policy-store/port.ts). */
import { join } from 'node:path';
import type { Db } from '../db/database.ts';
import { ConfigError } from '../errors.ts';
import type { PolicyStore } from './port.ts';
import { FilesystemPolicyStore } from './filesystem-store.ts';
import { PostgresPolicyStore } from './postgres-store.ts';
import { S3PolicyStore, createS3Client } from './s3-store.ts';

export * from './port.ts';
export { FilesystemPolicyStore, verifyDir } from './filesystem-store.ts';
export { PostgresPolicyStore } from './postgres-store.ts';
export { S3PolicyStore, createS3Client } from './s3-store.ts';

export const POLICY_STORES = ['filesystem', 'postgres', 's3'] as const;

/** pipeline.s3 (lib/config/schema.ts). */
export interface S3Options {
  bucket: string | null;
  prefix: string;
  endpoint: string | null;
  region: string | null;
  force_path_style: boolean;
  part_size_mb: number;
}

export function createPolicyStore(
  kind: (typeof POLICY_STORES)[number],
  opts: { runDir: string; runId: string; db: Db; cacheDir?: string | null; s3?: S3Options },
): PolicyStore {
  switch (kind) {
    case 'filesystem':
      return new FilesystemPolicyStore(opts.runDir, opts.runId, opts.db);
    case 'postgres':
      return new PostgresPolicyStore(opts.cacheDir ?? join(opts.runDir, 'policy-cache'), opts.runId, opts.db);
    case 's3': {
      const s3 = opts.s3;
      if (!s3?.bucket)
        throw new ConfigError(
          'pipeline.policy_store = s3 needs pipeline.s3.bucket (and pipeline.s3.endpoint for MinIO or GCS)',
        );
      return new S3PolicyStore(
        () => createS3Client({ endpoint: s3.endpoint, region: s3.region, forcePathStyle: s3.force_path_style }),
        { bucket: s3.bucket, prefix: s3.prefix },
        opts.cacheDir ?? join(opts.runDir, 'policy-cache'),
        opts.runId,
        opts.db,
        s3.part_size_mb * 1024 * 1024,
      );
    }
  }
}
export { versionsToPrune, neededVersions, keptCheckpointSteps, optimizerStatesToPrune } from './retention.ts';
