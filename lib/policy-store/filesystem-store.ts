/**
 * Policy store on a filesystem (pipeline.policy_store = filesystem): version v of a kind lives in
 * <run_dir>/<kind>/vNNNNNN (policy/, critic/, ema/), written there atomically by the update stage
 * (lib/model/checkpoint.ts: temporary name, fsync, rename). `put` records each file's sha256 in
 * the run's database; `get` checks the files against it. In distributed mode run_dir must be a
 * volume every stage mounts.
 */
import { promises as fs, existsSync } from 'node:fs';
import { join } from 'node:path';
import type { Db } from '../db/database.ts';
import {
  IntegrityError,
  versionDirName,
  type ArtifactFile,
  type ArtifactKind,
  type Executor,
  type PolicyStore,
} from './port.ts';
import { describeDir, sha256File } from './hash.ts';
import { deleteManifest, readManifest, writeManifest } from './manifest.ts';

/** Checks the files of `dir` against `recorded` (an empty record checks nothing: a version written before manifests existed). */
export async function verifyDir(
  dir: string,
  kind: ArtifactKind,
  version: number,
  recorded: readonly ArtifactFile[],
): Promise<void> {
  for (const f of recorded) {
    const path = join(dir, f.name);
    if (!existsSync(path))
      throw new IntegrityError(
        `${kind} version ${version}: ${path} is missing, but it was recorded (sha256 ${f.sha256}) when the version was written`,
        { path, expected: f.sha256, actual: 'missing' },
      );
    const actual = await sha256File(path);
    if (actual !== f.sha256) {
      throw new IntegrityError(
        `${kind} version ${version}: ${path} has sha256 ${actual}, but ${f.sha256} was recorded when it was written — the file is damaged or was replaced`,
        { path, expected: f.sha256, actual },
      );
    }
  }
}

/** Whether `dir` holds a stored artifact: weights (a version), or an optimizer state (a checkpoint step's). */
function hasWeights(dir: string): boolean {
  return ['model.safetensors', 'adapter_model.safetensors', 'optimizer.safetensors'].some((f) =>
    existsSync(join(dir, f)),
  );
}

export class FilesystemPolicyStore implements PolicyStore {
  readonly kind = 'filesystem' as const;
  constructor(
    private readonly runDir: string,
    private readonly runId: string,
    private readonly db: Db,
  ) {}

  writeDir(kind: ArtifactKind, version: number): string {
    return join(this.runDir, kind, versionDirName(version));
  }

  async put(
    kind: ArtifactKind,
    version: number,
    db: Executor = this.db,
    written?: readonly ArtifactFile[],
  ): Promise<ArtifactFile[]> {
    const files = written ? [...written] : await describeDir(this.writeDir(kind, version));
    await writeManifest(db, this.runId, kind, version, files, () => 0);
    return files;
  }

  async get(kind: ArtifactKind, version: number, db: Executor = this.db): Promise<string | null> {
    const dir = this.writeDir(kind, version);
    if (!hasWeights(dir)) return null;
    await verifyDir(dir, kind, version, await readManifest(db, this.runId, kind, version));
    return dir;
  }

  async files(kind: ArtifactKind, version: number, db: Executor = this.db): Promise<ArtifactFile[]> {
    return (await readManifest(db, this.runId, kind, version)).map(({ name, sha256, sizeBytes }) => ({
      name,
      sha256,
      sizeBytes,
    }));
  }

  async versions(kind: ArtifactKind): Promise<number[]> {
    let names: string[];
    try {
      names = await fs.readdir(join(this.runDir, kind));
    } catch {
      return [];
    }
    return names
      .map((n) => /^v(\d+)$/.exec(n))
      .filter((m): m is RegExpExecArray => m !== null)
      .filter((m) => hasWeights(join(this.runDir, kind, m[0])))
      .map((m) => Number(m[1]))
      .sort((a, b) => a - b);
  }

  async remove(kind: ArtifactKind, version: number, db: Executor = this.db): Promise<void> {
    // the manifest first: a version without files is "not there"; files without a manifest would be trusted unchecked
    await deleteManifest(db, this.runId, kind, version);
    await fs.rm(this.writeDir(kind, version), { recursive: true, force: true });
  }
}
