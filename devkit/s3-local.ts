/**
 * A local S3 for tests and examples: s3rver (a filesystem-backed S3 API) in this process on
 * 127.0.0.1 with a fresh bucket, and a client for it (path-style, any credentials).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CreateBucketCommand, S3Client } from '@aws-sdk/client-s3';

export interface LocalS3 {
  endpoint: string;
  bucket: string;
  client: S3Client;
  /** The environment a child process needs to reach it (credentials, region, no SDK warning). */
  env: NodeJS.ProcessEnv;
  close(): Promise<void>;
}

export async function startLocalS3(bucket = 'rlstream-test'): Promise<LocalS3> {
  // s3rver is CommonJS without types
  const name = 's3rver'; // (no type declarations)
  const { default: S3rver } = (await import(name)) as {
    default: new (o: object) => { run(): Promise<{ port: number }>; close(): Promise<void> };
  };
  const dir = mkdtempSync(join(tmpdir(), 'rl-s3rver-'));
  const server = new S3rver({ port: 0, address: '127.0.0.1', silent: true, directory: dir });
  const { port } = await server.run();
  const endpoint = `http://127.0.0.1:${port}`;
  const env = {
    AWS_ACCESS_KEY_ID: 'S3RVER',
    AWS_SECRET_ACCESS_KEY: 'S3RVER',
    AWS_REGION: 'us-east-1',
    AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
  };
  Object.assign(process.env, env);
  const client = new S3Client({ endpoint, region: 'us-east-1', forcePathStyle: true });
  await client.send(new CreateBucketCommand({ Bucket: bucket }));
  return {
    endpoint,
    bucket,
    client,
    env,
    async close() {
      client.destroy();
      await server.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
