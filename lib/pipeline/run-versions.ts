/**
 * The update stage's view of a run's stored versions (policy, critic, EMA) in the policy store
 * (lib/policy-store): writing one as a complete model directory (a PEFT adapter for a LoRA
 * policy), finding one with every file checked against its recorded sha256, the policy record a
 * version is published as, and pruning the versions no longer needed. A damaged or missing
 * version stops the stage saying how to go on from the last good checkpoint.
 */
import { resolve } from 'node:path';
import { policyId, type PolicyVersion } from '../contracts/index.ts';
import { ConfigError, RlError } from '../errors.ts';
import {
  checkpointSha256,
  MODEL_FILE,
  saveAdapter,
  saveCheckpoint,
  saveOptimizer,
  writeDirAtomic,
} from '../model/checkpoint.ts';
import { ADAPTER_MODEL_FILE } from '../model/lora.ts';
import { handOff, inMemorySha, retainHandOffs } from '../policy-store/handoff.ts';
import type { ModelConfig, OptimizerState, Weights } from '../model/index.ts';
import {
  ARTIFACT_KINDS,
  IntegrityError,
  OPTIMIZER_KINDS,
  optimizerStatesToPrune,
  versionsToPrune,
  type ArtifactFile,
  type ArtifactKind,
  type Executor,
  type PolicyStore,
} from '../policy-store/index.ts';
import type { PolicyLora } from './policy.ts';
import { roundedToBf16 } from '../model/safetensors.ts';
import { sealWeights } from '../model/seal.ts';
import { memMark } from './mem-trace.ts';
import type { HfDtype } from '../model/hf-layout.ts';
import type { PolicyDtype } from '../config/index.ts';
import { resumeHint, type RunCheckpoints } from './run-checkpoints.ts';
import { txOf } from './stage-state.ts';
import { crashPoint } from './crash-points.ts';

/** policy.dtype's names as the dtypes a model directory is stored in. */
const HF_DTYPE_OF: Record<PolicyDtype, HfDtype> = { f32: 'float32', bf16: 'bfloat16' };

/** What a version is written with besides its weights (a version never holds optimizer state: putOptimizer). */
export interface VersionWrite {
  metadata?: Record<string, string>;
  /**
   * A full policy's version kept in memory only (policy.version_files = checkpoints): handed off
   * to the readers in this process and named by the sha256 of the bytes it would be stored as,
   * with no file written.
   */
  inMemoryOnly?: boolean;
}

export class RunVersions {
  constructor(
    private readonly policies: PolicyStore,
    private readonly checkpoints: RunCheckpoints,
    private readonly o: {
      /** LoRA policy: its versions are the adapters, in PEFT layout, over this base. */
      lora: PolicyLora | null;
      /** actor.model.path: its generation config and tokenizer files go with every version. */
      assetsFrom: string | null;
      /** The database handle outside a batch. */
      db: Executor;
      /** policy.dtype: the dtype policy versions' weights are stored in (default f32). */
      policyDtype?: PolicyDtype;
    },
  ) {}

  /**
   * A stored version's directory, every file checked against the sha256 recorded when it was
   * written; null when there is none. A damaged one stops the stage saying how to resume from the
   * last good checkpoint.
   */
  async find(kind: ArtifactKind, version: number, db: Executor = this.o.db): Promise<string | null> {
    try {
      return await this.policies.get(kind, version, db);
    } catch (e) {
      if (e instanceof IntegrityError)
        throw new RlError(`${e.message}. ${await resumeHint(this.checkpoints, txOf(db))}`, {
          code: 'ERR_INTEGRITY',
          cause: e,
          details: e.details,
        });
      throw e;
    }
  }

  /** find(), for a version that must be there. */
  async dir(kind: ArtifactKind, version: number, db: Executor = this.o.db): Promise<string> {
    const dir = await this.find(kind, version, db);
    if (!dir)
      throw new ConfigError(
        `${kind} version ${version} of run ${this.checkpoints.runId} is not in the policy store (${this.policies.kind === 'filesystem' ? this.policies.writeDir(kind, version) : this.policies.kind === 's3' ? 'the S3 bucket, pipeline.s3' : "the run's database"}); it was never written or was pruned. ${await resumeHint(this.checkpoints, txOf(db))}`,
      );
    return dir;
  }

  /** Where a version of `kind` is written before it is stored (a filesystem store: its final place). */
  writeDir(kind: ArtifactKind, version: number): string {
    return this.policies.writeDir(kind, version);
  }

  /**
   * Writes a version of `kind` into the policy store (before any event names it). Returns the
   * sha256 of its weights file. The files are recorded with the sha256 of the bytes written (not
   * read back). A full policy's weights are stored in policy.dtype (bf16: rounded to nearest even;
   * the checkpoint's optimizer artifact keeps the f32 masters: putOptimizer). A full policy's `weights` are handed to the readers in this process
   * (lib/policy-store/handoff.ts: the embedded rollout samples with them without reading the
   * version back): the caller must not modify them afterwards.
   */
  async put(
    kind: ArtifactKind,
    version: number,
    model: ModelConfig,
    weights: Weights,
    extra: VersionWrite,
    db: Executor = this.o.db,
  ): Promise<string> {
    const { lora, assetsFrom } = this.o;
    const dir = this.policies.writeDir(kind, version);
    if (kind === 'policy' && lora) {
      // LoRA: a policy version is the adapter only, in PEFT layout (`weights` are the adapters)
      const w = await saveAdapter(dir, model, lora.config, weights, {
        ...extra,
        overwrite: true,
        basePath: resolve(lora.baseDir),
        beforeRename: () => crashPoint('update:version-half-written', `${kind} ${version}`),
      });
      await this.policies.put(kind, version, db, w.files);
      return w.weightsSha256;
    }
    // a complete model directory: the source's generation config and tokenizer files go with the weights
    const dtype = kind === 'policy' ? HF_DTYPE_OF[this.o.policyDtype ?? 'f32'] : 'float32';
    const { inMemoryOnly, ...write } = extra;
    if (kind === 'policy' && inMemoryOnly) {
      if (lora)
        throw new ConfigError('a LoRA policy version is written to the policy store, never kept in memory only');
      // sha256 and bf16 rounding in a worker thread when the weights are packed in one buffer (lib/model/seal.ts)
      const sealed = await sealWeights(model, weights, {
        ...write,
        dtype,
        whileSealing: () => crashPoint('update:sealing', `${kind} ${version}`),
      });
      memMark('update:sealed', { version });
      handOff(this.policies, version, MODEL_FILE, sealed.sha256, sealed.stored, false);
      return sealed.sha256;
    }
    const w = await saveCheckpoint(dir, model, weights, {
      ...write,
      overwrite: true,
      assetsFrom,
      dtype,
      beforeRename: () => crashPoint('update:version-half-written', `${kind} ${version}`),
    });
    await this.policies.put(kind, version, db, w.files);
    // the readers in this process sample with the weights as stored (bf16: rounded, as a reader of the files gets them)
    if (kind === 'policy') handOff(this.policies, version, MODEL_FILE, w.weightsSha256, this.asStored(weights));
    return w.weightsSha256;
  }

  /**
   * Writes a version of `kind` given as its files (an image policy's model directory or AdamW
   * state, lib/image/checkpoint.ts) into the policy store; returns the sha256 of `weightsFile`.
   * `handOffWeights`: a policy version's weights, handed to the readers in this process as put() does.
   */
  async putFiles(
    kind: ArtifactKind,
    version: number,
    files: ReadonlyMap<string, Uint8Array | string>,
    weightsFile: string,
    db: Executor = this.o.db,
    handOffWeights: Weights | null = null,
  ): Promise<string> {
    const written = await writeDirAtomic(this.policies.writeDir(kind, version), files, true);
    await this.policies.put(kind, version, db, written);
    const sha = written.find((f) => f.name === weightsFile)?.sha256 ?? '';
    if (handOffWeights) handOff(this.policies, version, weightsFile, sha, handOffWeights);
    return sha;
  }

  /**
   * Hands a full policy's version `version` (weights `weights`, named by `sha`) to the readers in
   * this process in memory only, as stored (policy.dtype); the caller must not modify them
   * afterwards. A LoRA policy's versions are always written (its readers merge the adapter files).
   */
  handOver(version: number, weights: Weights, sha: string): void {
    if (this.o.lora)
      throw new ConfigError('a LoRA policy version is written to the policy store, never kept in memory only');
    handOff(this.policies, version, MODEL_FILE, sha, this.asStored(weights), false);
  }

  /**
   * Drops the versions handed to this process's readers below `from`, except those in `keep` (no
   * reader can ask for them any more; a stored one is read from the store); returns how many.
   */
  retainInMemory(from: number, keep: readonly number[] = []): number {
    return retainHandOffs(this.policies, (v) => v >= from || keep.includes(v));
  }

  /** The files of a stored version of `kind` with the sha256 recorded when they were written (none: not stored). */
  async recordedFiles(kind: ArtifactKind, version: number, db: Executor = this.o.db): Promise<ArtifactFile[]> {
    return this.policies.files(kind, version, db);
  }

  /** Whether policy version `version` has a weights file in the store (else it is, at most, in memory). */
  async stored(version: number, db: Executor = this.o.db): Promise<boolean> {
    return (await this.policies.files('policy', version, db)).some(
      (f) => f.name === MODEL_FILE || f.name === ADAPTER_MODEL_FILE,
    );
  }

  /** Weights as a reader of a stored policy version gets them (bf16: rounded). */
  private asStored(weights: Weights): Weights {
    return (this.o.policyDtype ?? 'f32') === 'f32'
      ? weights
      : new Map([...weights].map(([k, a]) => [k, roundedToBf16(a)]));
  }

  /**
   * Writes the AdamW state of a checkpoint step into the policy store as artifact `kind`
   * ('optimizer': the policy's, a LoRA policy's adapters' state; 'critic-optimizer': the critic's).
   * A full policy whose versions are stored below f32 (policy.dtype bf16) also keeps its f32
   * `weights` there, as `<param>.master`: a resume restores the trainer from them, not their rounding.
   */
  async putOptimizer(
    kind: 'optimizer' | 'critic-optimizer',
    version: number,
    model: ModelConfig,
    state: OptimizerState,
    weights: Weights,
    db: Executor = this.o.db,
  ): Promise<void> {
    const lora = kind === 'optimizer' ? (this.o.lora?.config ?? null) : null;
    const belowF32 = kind === 'optimizer' && !lora && (this.o.policyDtype ?? 'f32') !== 'f32';
    const files = await saveOptimizer(this.policies.writeDir(kind, version), model, state, {
      lora,
      masters: belowF32 ? weights : null,
    });
    await this.policies.put(kind, version, db, files);
  }

  /** How to go on from the newest intact checkpoint of the run (said when a stored file is damaged). */
  resumeHint(db: Executor = this.o.db): Promise<string> {
    return resumeHint(this.checkpoints, txOf(db));
  }

  /** The `policy` record that publishes policy version `version`. */
  async record(
    version: number,
    nowMs: number,
    extra: Partial<PolicyVersion> = {},
    db: Executor = this.o.db,
  ): Promise<PolicyVersion> {
    const { runId } = this.checkpoints;
    // the weights file's sha256 as recorded when the version was written (files are checked when
    // read), or, for a version kept in memory only, of the bytes it would be written as
    const memory = inMemorySha(this.policies, version);
    const recorded =
      (await this.policies.files('policy', version, db)).find(
        (f) => f.name === MODEL_FILE || f.name === ADAPTER_MODEL_FILE,
      ) ?? (memory === null ? undefined : { sha256: memory });
    const dir = recorded ? this.policies.writeDir('policy', version) : await this.dir('policy', version, db);
    return {
      run_id: runId,
      id: policyId(runId, version),
      step: version,
      policy_version: version,
      parent_version: version === 0 ? null : version - 1,
      checkpoint_path: this.policies.kind === 'filesystem' ? dir : `${this.policies.kind}:policy/${version}`,
      sha256: recorded?.sha256 ?? (await checkpointSha256(dir)),
      format: 'safetensors',
      size_bytes: 0,
      created_ms: nowMs,
      consumed: [],
      groups: 0,
      samples: 0,
      tokens: 0,
      ...extra,
    };
  }

  /**
   * Removes the stored versions no longer needed (lib/policy-store/retention.ts); critic and EMA
   * versions go with their policy version, optimizer states with their checkpoint. Returns the
   * pruned policy versions.
   */
  async prune(keep: Parameters<typeof versionsToPrune>[1], db: Executor): Promise<number[]> {
    const pruned: number[] = [];
    for (const kind of ARTIFACT_KINDS) {
      const prune = OPTIMIZER_KINDS.includes(kind) ? optimizerStatesToPrune : versionsToPrune;
      for (const v of prune(await this.policies.versions(kind, db), keep)) {
        await this.policies.remove(kind, v, db);
        crashPoint('update:pruning', `${kind} ${v}`);
        if (kind === 'policy') pruned.push(v);
      }
    }
    return pruned;
  }
}
