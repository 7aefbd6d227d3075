/**
 * The policy-store port: where policy versions live (and the critic and EMA versions written next
 * to them) — each an artifact (kind, version) of a few files (model.safetensors and config.json;
 * at checkpoint steps an optimizer artifact holding optimizer.safetensors). Three adapters, one contract suite
 * (test/support/policy-store-contract.ts):
 *
 *  - `filesystem-store.ts` (pipeline.policy_store = filesystem, the default): the files under
 *    <run_dir>/<kind>/vNNNNNN, where the writer put them; in distributed mode run_dir is a volume
 *    shared by the stages. The store's database records each file's sha256 (policy_files).
 *  - `postgres-store.ts` (policy_store = postgres): the files' bytes in the run's database
 *    (policy_chunks), so no stage needs a shared volume; each process reads versions through a
 *    local cache directory (an emptyDir is enough: it is verified, refilled when damaged or lost).
 *
 *  - `s3-store.ts` (policy_store = s3): the files as objects in an S3-compatible bucket (multipart
 *    uploads), their sha256 in the run's database; read through a local cache like postgres.
 *
 * All: a version is written (`put`) before the event that names it is published; every read
 * (`get`) checks each file against the sha256 recorded when it was put and stops with an
 * IntegrityError naming the file and both hashes; `remove` prunes (lib/policy-store/retention.ts
 * says which). `db` is the executor to use: a stage inside a batch passes the batch's transaction
 * (PGlite has one connection; embedded, the manifest commits with the batch).
 */
import type { Executor } from '../db/database.ts';
import { RlError } from '../errors.ts';

/**
 * policy, critic, ema, sampler: weights-only versions (what sampling and scoring read), one per
 * step; sampler is DiffusionNFT's soft-updated sampling policy of an image policy.
 * optimizer, critic-optimizer: the AdamW state of the policy and of the critic (optimizer.safetensors
 * alone), written only at checkpoint steps and kept while their checkpoint is.
 */
export type ArtifactKind = 'policy' | 'critic' | 'ema' | 'sampler' | 'optimizer' | 'critic-optimizer';
export const ARTIFACT_KINDS: readonly ArtifactKind[] = [
  'policy',
  'critic',
  'ema',
  'sampler',
  'optimizer',
  'critic-optimizer',
];
/** The kinds that are trainer state of a checkpoint, not a version anyone samples or scores with. */
export const OPTIMIZER_KINDS: readonly ArtifactKind[] = ['optimizer', 'critic-optimizer'];

export interface ArtifactFile {
  name: string;
  sha256: string;
  sizeBytes: number;
}

export type { Executor };

export interface PolicyStore {
  readonly kind: 'filesystem' | 'postgres' | 's3';
  /** Where a writer puts version `version`'s files before `put` (filesystem: their final place; postgres: the local cache). */
  writeDir(kind: ArtifactKind, version: number): string;
  /**
   * Stores the files of writeDir(kind, version) as that artifact, replacing an existing one:
   * durable and readable by every process once `db` commits (outside a transaction: on return).
   * `written`: the files as their writer described them (sha256 of the bytes it wrote, which it
   * had in memory), recorded without reading the files back; without it they are read and hashed.
   */
  put(kind: ArtifactKind, version: number, db?: Executor, written?: readonly ArtifactFile[]): Promise<ArtifactFile[]>;
  /**
   * A local directory holding the artifact's files, each verified against its recorded sha256
   * (IntegrityError otherwise); null when the store has no such artifact (not written yet, pruned).
   */
  get(kind: ArtifactKind, version: number, db?: Executor): Promise<string | null>;
  /** The recorded files of an artifact (empty when none is recorded). */
  files(kind: ArtifactKind, version: number, db?: Executor): Promise<ArtifactFile[]>;
  /** Versions of one kind the store holds, ascending. */
  versions(kind: ArtifactKind, db?: Executor): Promise<number[]>;
  /** Deletes an artifact (its files, manifest and cached copy). */
  remove(kind: ArtifactKind, version: number, db?: Executor): Promise<void>;
}

/** A stored file whose bytes are not the ones recorded: never retried, never used. */
export class IntegrityError extends RlError {
  /** The stage's files are damaged, not the message it was processing: never dead-lettered (`stageFault`). */
  readonly stopsStage = true;
  constructor(message: string, details: { path: string; expected: string; actual: string }) {
    super(message, { retriable: false, code: 'ERR_INTEGRITY', details });
    this.name = 'IntegrityError';
  }
}

export function versionDirName(version: number): string {
  return `v${String(version).padStart(6, '0')}`;
}
