/**
 * Policy store in the run's database (pipeline.policy_store = postgres): each file of a version
 * is kept as ordered bytea chunks (policy_chunks, CHUNK_BYTES each) with its sha256 and size
 * (policy_files), and the version is listed (policy_artifacts) in the same transaction after its
 * chunks, so a reader never sees half a version. Every process reads through a local cache
 * directory (pipeline.policy_cache_dir, an emptyDir is enough): a cached file is used only when it
 * has the recorded sha256; otherwise the version is downloaded again into a temporary directory,
 * each file checked against its sha256, and renamed into place. The writer (the update stage)
 * writes a version into its cache directory first (writeDir) and then `put`s it.
 */
import { promises as fs } from 'node:fs';
import { randomBytes, createHash } from 'node:crypto';
import { join } from 'node:path';
import { sql } from 'kysely';
import type { Db } from '../db/database.ts';
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

/** Bytes per stored chunk: large enough for few rows, small enough to stream and to stay far below bytea's 1 GB. */
export const CHUNK_BYTES = 8 * 1024 * 1024;

export class PostgresPolicyStore implements PolicyStore {
  readonly kind = 'postgres' as const;
  constructor(
    private readonly cacheDir: string,
    private readonly runId: string,
    private readonly db: Db,
    private readonly chunkBytes = CHUNK_BYTES,
  ) {}

  writeDir(kind: ArtifactKind, version: number): string {
    return join(this.cacheDir, this.runId, kind, versionDirName(version));
  }

  async put(
    kind: ArtifactKind,
    version: number,
    db: Executor = this.db,
    written?: readonly ArtifactFile[],
  ): Promise<ArtifactFile[]> {
    const dir = this.writeDir(kind, version);
    const files = written ? [...written] : await describeDir(dir);
    const write = async (tx: Executor) => {
      await this.deleteRows(tx, kind, version);
      let total = 0;
      for (const f of files) {
        const fh = await fs.open(join(dir, f.name), 'r');
        try {
          const buf = Buffer.allocUnsafe(Math.min(this.chunkBytes, Math.max(1, f.sizeBytes)));
          const h = createHash('sha256');
          for (let seq = 0, pos = 0; pos < f.sizeBytes || (seq === 0 && f.sizeBytes === 0); seq++) {
            const { bytesRead } = await fh.read(buf, 0, Math.min(buf.length, f.sizeBytes - pos), pos);
            const data = Buffer.from(buf.subarray(0, bytesRead));
            h.update(data);
            await sql`insert into policy_chunks (run_id, kind, version, name, seq, data) values (${this.runId}, ${kind}, ${version}, ${f.name}, ${seq}, ${data})`.execute(
              tx,
            );
            pos += bytesRead;
            if (bytesRead === 0) break;
          }
          // the bytes stored are the bytes hashed (the file did not change under us)
          const stored = h.digest('hex');
          if (stored !== f.sha256)
            throw new IntegrityError(
              `${kind} version ${version}: ${join(dir, f.name)} changed while it was being stored (sha256 ${f.sha256}, then ${stored})`,
              { path: join(dir, f.name), expected: f.sha256, actual: stored },
            );
        } finally {
          await fh.close();
        }
        total += f.sizeBytes;
      }
      await writeManifest(tx, this.runId, kind, version, files, (f) =>
        Math.max(1, Math.ceil(f.sizeBytes / this.chunkBytes)),
      );
      await sql`insert into policy_artifacts (run_id, kind, version, files, size_bytes) values (${this.runId}, ${kind}, ${version}, ${files.length}, ${total})`.execute(
        tx,
      );
    };
    if (db.isTransaction) await write(db);
    else await (db as Db).transaction().execute(write);
    return files;
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
    // (re)fill the cache: download into a temporary directory, check every file, rename into place
    const tmp = `${dir}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
    await fs.mkdir(tmp, { recursive: true });
    try {
      for (const f of recorded) {
        const fh = await fs.open(join(tmp, f.name), 'w');
        const h = createHash('sha256');
        try {
          for (let seq = 0; seq < f.chunks; seq++) {
            const row = (
              await sql<{
                data: Buffer;
              }>`select data from policy_chunks where run_id = ${this.runId} and kind = ${kind} and version = ${version} and name = ${f.name} and seq = ${seq}`.execute(
                db,
              )
            ).rows[0];
            if (!row)
              throw new IntegrityError(
                `${kind} version ${version}: chunk ${seq} of ${f.name} is missing from policy_chunks in the run's database`,
                { path: `policy_chunks/${kind}/${version}/${f.name}#${seq}`, expected: f.sha256, actual: 'missing' },
              );
            h.update(row.data);
            await fh.write(row.data);
          }
          await fh.sync();
        } finally {
          await fh.close();
        }
        const actual = h.digest('hex');
        if (actual !== f.sha256) {
          throw new IntegrityError(
            `${kind} version ${version}: ${f.name} stored in the run's database (policy_chunks) has sha256 ${actual}, but ${f.sha256} was recorded when it was written — the stored bytes are damaged`,
            { path: `policy_chunks/${kind}/${version}/${f.name}`, expected: f.sha256, actual },
          );
        }
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
  }

  private async deleteRows(db: Executor, kind: ArtifactKind, version: number): Promise<void> {
    await sql`delete from policy_artifacts where run_id = ${this.runId} and kind = ${kind} and version = ${version}`.execute(
      db,
    );
    await deleteManifest(db, this.runId, kind, version);
    await sql`delete from policy_chunks where run_id = ${this.runId} and kind = ${kind} and version = ${version}`.execute(
      db,
    );
  }
}
