/**
 * Policy store in S3-compatible object storage (pipeline.policy_store = s3: AWS S3, MinIO, GCS's
 * XML API, Ceph): each file of a version is an object under
 * `<prefix><run_id>/<kind>/vNNNNNN/<sha256>/<name>`, uploaded in parts (multipart upload) above
 * pipeline.s3.part_size_mb; its sha256 and size are recorded in the run's database (policy_files)
 * and the version listed (policy_artifacts) in the same transaction, after its objects, so a
 * reader never sees half a version. The key holds the content's sha256: a version rewritten by a
 * restarted writer gets new objects, and one whose transaction rolled back leaves the recorded
 * objects in place. Every process reads through a local cache directory
 * (pipeline.policy_cache_dir): a cached file is used only when it has the recorded sha256;
 * otherwise the objects are downloaded into a temporary directory, each checked against its
 * sha256 while it streams, and renamed into place. `remove` deletes every object of the version.
 */
import { promises as fs, createWriteStream } from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import type { Readable } from 'node:stream';
import { sql } from 'kysely';
import type { S3Client } from '@aws-sdk/client-s3';
import type { Db } from '../db/database.ts';
import { RlError, TransientError, errorMessage } from '../errors.ts';
import {
  IntegrityError,
  versionDirName,
  type ArtifactFile,
  type ArtifactKind,
  type Executor,
  type PolicyStore,
} from './port.ts';
import { describeDir } from './hash.ts';
import {
  deleteManifest,
  readManifest,
  writeManifest,
  cachedCopyMatches,
  manifestFiles,
  storedVersions,
} from './manifest.ts';

/** S3's smallest part (all but the last): 5 MiB. */
export const MIN_PART_BYTES = 5 * 1024 * 1024;

export interface S3Location {
  bucket: string;
  /** Key prefix, e.g. `rlstream/` (ends with `/` unless empty). */
  prefix: string;
}

type S3 = typeof import('@aws-sdk/client-s3');
let s3mod: Promise<S3> | null = null;
const sdk = () => (s3mod ??= import('@aws-sdk/client-s3'));

/** An S3 error as an RlError: throttling, 5xx and network errors are retriable; the rest say what to fix. */
export function s3Error(what: string, e: unknown): RlError {
  if (e instanceof RlError) return e;
  const err = e as { name?: string; $metadata?: { httpStatusCode?: number }; $retryable?: unknown; code?: string };
  const status = err.$metadata?.httpStatusCode;
  const msg = `${what}: ${err.name ?? 'error'}${status ? ` (HTTP ${status})` : ''}: ${errorMessage(e)}`;
  if (
    err.$retryable ||
    (status !== undefined && (status >= 500 || status === 429)) ||
    ['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE'].includes(err.code ?? '') ||
    err.name === 'TimeoutError'
  )
    return new TransientError(msg, { cause: e });
  const hint =
    err.name === 'NoSuchBucket'
      ? ' — create the bucket, or set pipeline.s3.bucket to an existing one'
      : status === 403 || err.name === 'InvalidAccessKeyId' || err.name === 'SignatureDoesNotMatch'
        ? " — check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or the pod's role) and the bucket policy"
        : '';
  return new RlError(`${msg}${hint}`, { retriable: false, code: 'ERR_S3', cause: e });
}

export class S3PolicyStore implements PolicyStore {
  readonly kind = 's3' as const;
  private readonly partBytes: number;
  private clientP: Promise<S3Client> | null = null;
  constructor(
    /** A client, or how to make one on first use (the SDK is loaded only by processes that use it). */
    private readonly makeClient: S3Client | (() => Promise<S3Client>),
    private readonly loc: S3Location,
    private readonly cacheDir: string,
    private readonly runId: string,
    private readonly db: Db,
    partBytes = 64 * 1024 * 1024,
    /** Only tests go below S3's 5 MiB (s3rver does not enforce it). */
    allowSmallParts = false,
  ) {
    this.partBytes = allowSmallParts ? partBytes : Math.max(MIN_PART_BYTES, partBytes);
  }

  private client(): Promise<S3Client> {
    return (this.clientP ??=
      typeof this.makeClient === 'function' ? this.makeClient() : Promise.resolve(this.makeClient));
  }

  writeDir(kind: ArtifactKind, version: number): string {
    return join(this.cacheDir, this.runId, kind, versionDirName(version));
  }

  /** `s3://bucket/prefix…/run/kind/vNNNNNN/` (messages). */
  where(kind: ArtifactKind, version: number): string {
    return `s3://${this.loc.bucket}/${this.versionPrefix(kind, version)}`;
  }

  private versionPrefix(kind: ArtifactKind, version: number): string {
    return `${this.loc.prefix}${this.runId}/${kind}/${versionDirName(version)}/`;
  }

  private key(kind: ArtifactKind, version: number, f: Pick<ArtifactFile, 'name' | 'sha256'>): string {
    return `${this.versionPrefix(kind, version)}${f.sha256}/${f.name}`;
  }

  async put(
    kind: ArtifactKind,
    version: number,
    db: Executor = this.db,
    written?: readonly ArtifactFile[],
  ): Promise<ArtifactFile[]> {
    const dir = this.writeDir(kind, version);
    const files = written ? [...written] : await describeDir(dir);
    for (const f of files) await this.upload(join(dir, f.name), this.key(kind, version, f), f);
    const write = async (tx: Executor) => {
      await this.deleteRows(tx, kind, version);
      await writeManifest(tx, this.runId, kind, version, files, (f) => this.parts(f.sizeBytes));
      const total = files.reduce((s, f) => s + f.sizeBytes, 0);
      await sql`insert into policy_artifacts (run_id, kind, version, files, size_bytes) values (${this.runId}, ${kind}, ${version}, ${files.length}, ${total})`.execute(
        tx,
      );
    };
    if (db.isTransaction) await write(db);
    else await (db as Db).transaction().execute(write);
    return files;
  }

  private parts(size: number): number {
    return Math.max(1, Math.ceil(size / this.partBytes));
  }

  /** One object from a file: a single PUT up to partBytes, else a multipart upload (aborted on failure). */
  private async upload(path: string, key: string, f: ArtifactFile): Promise<void> {
    const s3 = await sdk();
    const Bucket = this.loc.bucket;
    const Metadata = { sha256: f.sha256 };
    const hashed = createHash('sha256');
    const check = () => {
      const got = hashed.digest('hex');
      if (got !== f.sha256)
        throw new IntegrityError(`${path} changed while it was being uploaded (sha256 ${f.sha256}, then ${got})`, {
          path,
          expected: f.sha256,
          actual: got,
        });
    };
    const fh = await fs.open(path, 'r');
    try {
      if (f.sizeBytes <= this.partBytes) {
        const body = await fh.readFile();
        hashed.update(body);
        check();
        await (
          await this.client()
        )
          .send(new s3.PutObjectCommand({ Bucket, Key: key, Body: body, Metadata }))
          .catch((e: unknown) => {
            throw s3Error(`uploading ${path} to s3://${Bucket}/${key}`, e);
          });
        return;
      }
      const { UploadId } = await (
        await this.client()
      )
        .send(new s3.CreateMultipartUploadCommand({ Bucket, Key: key, Metadata }))
        .catch((e: unknown) => {
          throw s3Error(`starting the upload of ${path} to s3://${Bucket}/${key}`, e);
        });
      try {
        const Parts: Array<{ PartNumber: number; ETag: string | undefined }> = [];
        const buf = Buffer.allocUnsafe(this.partBytes);
        for (let pos = 0, PartNumber = 1; pos < f.sizeBytes; PartNumber++) {
          const { bytesRead } = await fh.read(buf, 0, Math.min(buf.length, f.sizeBytes - pos), pos);
          if (bytesRead === 0) break;
          const body = buf.subarray(0, bytesRead);
          hashed.update(body);
          const { ETag } = await (
            await this.client()
          )
            .send(new s3.UploadPartCommand({ Bucket, Key: key, UploadId, PartNumber, Body: body }))
            .catch((e: unknown) => {
              throw s3Error(`uploading part ${PartNumber} of ${path} to s3://${Bucket}/${key}`, e);
            });
          Parts.push({ PartNumber, ETag });
          pos += bytesRead;
        }
        check();
        await (
          await this.client()
        )
          .send(new s3.CompleteMultipartUploadCommand({ Bucket, Key: key, UploadId, MultipartUpload: { Parts } }))
          .catch((e: unknown) => {
            throw s3Error(`completing the upload of ${path} to s3://${Bucket}/${key}`, e);
          });
      } catch (e) {
        await (
          await this.client()
        )
          .send(new s3.AbortMultipartUploadCommand({ Bucket, Key: key, UploadId }))
          .catch(() => undefined);
        throw e;
      }
    } finally {
      await fh.close();
    }
  }

  async get(kind: ArtifactKind, version: number, db: Executor = this.db): Promise<string | null> {
    const listed = (
      await sql<{
        n: number;
      }>`select count(*)::int as n from policy_artifacts where run_id = ${this.runId} and kind = ${kind} and version = ${version}`.execute(
        db,
      )
    ).rows[0].n;
    if (!listed) return null;
    const recorded = await readManifest(db, this.runId, kind, version);
    const dir = this.writeDir(kind, version);
    if (await this.cached(dir, recorded)) return dir;
    const s3 = await sdk();
    const tmp = `${dir}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
    await fs.mkdir(tmp, { recursive: true });
    try {
      for (const f of recorded) {
        const key = this.key(kind, version, f);
        const res = await (
          await this.client()
        )
          .send(new s3.GetObjectCommand({ Bucket: this.loc.bucket, Key: key }))
          .catch((e: unknown) => {
            if ((e as { name?: string }).name === 'NoSuchKey')
              throw new IntegrityError(
                `${kind} version ${version}: s3://${this.loc.bucket}/${key} (${f.name}) is missing from the bucket, though the run's database records it (sha256 ${f.sha256}); was it deleted by a bucket lifecycle rule?`,
                { path: `s3://${this.loc.bucket}/${key}`, expected: f.sha256, actual: 'missing' },
              );
            throw s3Error(`downloading s3://${this.loc.bucket}/${key}`, e);
          });
        const h = createHash('sha256');
        const body = res.Body as Readable;
        body.on('data', (c: Buffer) => h.update(c));
        await pipeline(body, createWriteStream(join(tmp, f.name)));
        const actual = h.digest('hex');
        if (actual !== f.sha256)
          throw new IntegrityError(
            `${kind} version ${version}: ${f.name} in s3://${this.loc.bucket}/${key} has sha256 ${actual}, but ${f.sha256} was recorded when it was written — the stored object is damaged`,
            { path: `s3://${this.loc.bucket}/${key}`, expected: f.sha256, actual },
          );
      }
      await fs.rm(dir, { recursive: true, force: true });
      await fs.rename(tmp, dir);
    } catch (e) {
      await fs.rm(tmp, { recursive: true, force: true }).catch(() => undefined);
      throw e;
    }
    return dir;
  }

  /** Whether the cache holds exactly the recorded files (a damaged or partial copy is not used). */
  private cached(dir: string, recorded: readonly ArtifactFile[]): Promise<boolean> {
    return cachedCopyMatches(dir, recorded);
  }

  files(kind: ArtifactKind, version: number, db: Executor = this.db): Promise<ArtifactFile[]> {
    return manifestFiles(db, this.runId, kind, version);
  }

  versions(kind: ArtifactKind, db: Executor = this.db): Promise<number[]> {
    return storedVersions(db, this.runId, kind);
  }

  async remove(kind: ArtifactKind, version: number, db: Executor = this.db): Promise<void> {
    await this.deleteRows(db, kind, version);
    await fs.rm(this.writeDir(kind, version), { recursive: true, force: true });
    const s3 = await sdk();
    const Prefix = this.versionPrefix(kind, version);
    for (let token: string | undefined, more = true; more;) {
      const page = await (
        await this.client()
      )
        .send(new s3.ListObjectsV2Command({ Bucket: this.loc.bucket, Prefix, ContinuationToken: token }))
        .catch((e: unknown) => {
          throw s3Error(`listing s3://${this.loc.bucket}/${Prefix}`, e);
        });
      const keys = (page.Contents ?? []).map((o) => ({ Key: o.Key! }));
      // one DeleteObject per key: GCS's XML API has no multi-object delete
      for (const k of keys)
        await (
          await this.client()
        )
          .send(new s3.DeleteObjectCommand({ Bucket: this.loc.bucket, Key: k.Key }))
          .catch((e: unknown) => {
            throw s3Error(`deleting s3://${this.loc.bucket}/${k.Key}`, e);
          });
      token = page.NextContinuationToken;
      more = !!page.IsTruncated && !!token;
    }
  }

  private async deleteRows(db: Executor, kind: ArtifactKind, version: number): Promise<void> {
    await sql`delete from policy_artifacts where run_id = ${this.runId} and kind = ${kind} and version = ${version}`.execute(
      db,
    );
    await deleteManifest(db, this.runId, kind, version);
  }
}

/** An S3 client for pipeline.s3 (credentials: the SDK's chain — AWS_* variables, a web identity, an instance role). */
export async function createS3Client(opts: {
  endpoint: string | null;
  region: string | null;
  forcePathStyle: boolean;
}): Promise<S3Client> {
  const { S3Client } = await sdk();
  return new S3Client({
    region: opts.region ?? process.env.AWS_REGION ?? process.env.AWS_DEFAULT_REGION ?? 'us-east-1',
    ...(opts.endpoint ? { endpoint: opts.endpoint } : {}),
    forcePathStyle: opts.forcePathStyle,
    // whole-object sha256 is checked by the store; the SDK's own checksums stay on where the service supports them
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
  });
}
