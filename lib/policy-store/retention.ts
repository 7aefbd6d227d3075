/**
 * Which stored versions the update stage may prune (pure). A version is still needed when it is:
 * the reference (v0, the KL reference and a checkpoint's reference/), the newest or the one before
 * it (a retried batch or a restart resumes from the last committed version), within
 * pipeline.max_staleness of the newest (a rollout may still sample with it, the advantage stage
 * read its critic), one a validation round still evaluates (published, not finished), the version
 * of a checkpoint that is kept (trainer.save_limit), or among the
 * trainer.keep_policy_versions newest of the rest. Everything else goes.
 */
export interface RetentionOptions {
  newest: number;
  maxStaleness: number;
  /** Steps of the checkpoints kept (after trainer.save_limit). */
  checkpointSteps: readonly number[];
  /** trainer.keep_policy_versions: versions kept beyond those needed. */
  keepExtra: number;
  /** Versions still in use elsewhere (validation rounds published and not finished). */
  inUse?: readonly number[];
}

/**
 * The oldest version a rollout may still sample a training batch with when `newest` is the
 * newest version: the batches not sampled yet are for steps after `newest`, and a batch of step k
 * samples with a version at least k − 1 − pipeline.max_staleness. A version kept in memory only
 * (policy.version_files = checkpoints) is held from here to the newest.
 */
export function oldestSampledVersion(newest: number, maxStaleness: number): number {
  return Math.max(0, newest - maxStaleness);
}

export function neededVersions(o: RetentionOptions): Set<number> {
  const keep = new Set<number>([0, ...o.checkpointSteps, ...(o.inUse ?? [])]);
  for (let v = Math.max(0, o.newest - o.maxStaleness - 1); v <= o.newest; v++) keep.add(v);
  return keep;
}

export function versionsToPrune(versions: readonly number[], o: RetentionOptions): number[] {
  const keep = neededVersions(o);
  // never touch a version beyond the newest (a writer ahead of this one's view)
  const candidates = [...versions].filter((v) => !keep.has(v) && v < o.newest).sort((a, b) => b - a);
  return candidates.slice(o.keepExtra).sort((a, b) => a - b);
}

/** The checkpoints kept under trainer.save_limit (-1: all). */
export function keptCheckpointSteps(steps: readonly number[], saveLimit: number): number[] {
  const sorted = [...steps].sort((a, b) => a - b);
  return saveLimit > 0 ? sorted.slice(Math.max(0, sorted.length - saveLimit)) : sorted;
}

/**
 * Which stored optimizer states may go: they are the trainer state of a checkpoint, needed only
 * while that checkpoint is kept (`checkpointSteps`); one beyond the newest version (a writer ahead
 * of this one's view) is never touched.
 */
export function optimizerStatesToPrune(versions: readonly number[], o: RetentionOptions): number[] {
  const keep = new Set(o.checkpointSteps);
  return versions.filter((v) => !keep.has(v) && v < o.newest).sort((a, b) => a - b);
}
