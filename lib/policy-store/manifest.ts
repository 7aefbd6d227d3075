/** The policy_files manifest rows both adapters record (migrations/20261125_0007_policy_store.sql). */
import { sql } from 'kysely';
import type { ArtifactFile, ArtifactKind, Executor } from './port.ts';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { sha256File } from './hash.ts';

export async function writeManifest(
  db: Executor,
  runId: string,
  kind: ArtifactKind,
  version: number,
  files: readonly ArtifactFile[],
  chunks: (f: ArtifactFile) => number,
): Promise<void> {
  await sql`delete from policy_files where run_id = ${runId} and kind = ${kind} and version = ${version}`.execute(db);
  for (const f of files) {
    await sql`insert into policy_files (run_id, kind, version, name, size_bytes, sha256, chunks) values (${runId}, ${kind}, ${version}, ${f.name}, ${f.sizeBytes}, ${f.sha256}, ${chunks(f)})`.execute(
      db,
    );
  }
}

export async function readManifest(
  db: Executor,
  runId: string,
  kind: ArtifactKind,
  version: number,
): Promise<Array<ArtifactFile & { chunks: number }>> {
  const rows = (
    await sql<{
      name: string;
      sha256: string;
      size_bytes: number;
      chunks: number;
    }>`select name, sha256, size_bytes, chunks from policy_files where run_id = ${runId} and kind = ${kind} and version = ${version} order by name`.execute(
      db,
    )
  ).rows;
  return rows.map((r) => ({ name: r.name, sha256: r.sha256, sizeBytes: Number(r.size_bytes), chunks: r.chunks }));
}

export async function deleteManifest(db: Executor, runId: string, kind: ArtifactKind, version: number): Promise<void> {
  await sql`delete from policy_files where run_id = ${runId} and kind = ${kind} and version = ${version}`.execute(db);
}

/** A run's stored versions of `kind`, ascending. */
export async function storedVersions(db: Executor, runId: string, kind: ArtifactKind): Promise<number[]> {
  const r = await sql<{
    version: number;
  }>`select version from policy_artifacts where run_id = ${runId} and kind = ${kind} order by version`.execute(db);
  return r.rows.map((x) => x.version);
}

/** A version's recorded files (name, sha256, size). */
export async function manifestFiles(
  db: Executor,
  runId: string,
  kind: ArtifactKind,
  version: number,
): Promise<ArtifactFile[]> {
  return (await readManifest(db, runId, kind, version)).map(({ name, sha256, sizeBytes }) => ({
    name,
    sha256,
    sizeBytes,
  }));
}

/** Whether a local copy holds exactly the recorded files (a damaged or partial copy is not used). */
export async function cachedCopyMatches(dir: string, recorded: readonly ArtifactFile[]): Promise<boolean> {
  if (!existsSync(dir)) return false;
  for (const f of recorded) {
    const path = join(dir, f.name);
    if (!existsSync(path) || (await sha256File(path)) !== f.sha256) return false;
  }
  return true;
}
