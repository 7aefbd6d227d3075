/**
 * Update-stage logic (pure): assembling a step's batch, splitting it into PPO mini-batches and
 * micro-batches, deciding when to checkpoint and which checkpoints to prune. No I/O.
 */
import { ConfigError } from '../../lib/errors.ts';

export interface SampleKey { id: string }

/**
 * The step's batch: every sample of every kept group, ordered by deterministic id, duplicates
 * (redelivered groups) dropped — so the batch, and therefore the update, does not depend on
 * arrival order, partitioning or the number of rollout replicas.
 */
export function assembleBatch<S extends SampleKey>(groups: Array<{ samples: S[] }>): { samples: S[]; duplicates: number } {
  const byId = new Map<string, S>();
  let duplicates = 0;
  for (const g of groups) {
    for (const s of g.samples) {
      if (byId.has(s.id)) { duplicates++; continue; }
      byId.set(s.id, s);
    }
  }
  const samples = [...byId.values()].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  return { samples, duplicates };
}

/**
 * Explains the batch arithmetic (rollout_batch_size × n samples per step, split into mini-batches
 * of global_batch_size, each accumulated over micro-batches) and rejects inconsistent sizes.
 */
export function checkBatchArithmetic(a: { rolloutBatchSize: number; n: number; globalBatchSize: number; microBatchSize: number }): { samplesPerStep: number; miniBatches: number; microPerMini: number } {
  const samplesPerStep = a.rolloutBatchSize * a.n;
  const why = `each step has data.rollout_batch_size × rollout.n = ${a.rolloutBatchSize} × ${a.n} = ${samplesPerStep} samples, split into mini-batches of actor.global_batch_size = ${a.globalBatchSize} samples (one optimizer step each), each accumulated over micro-batches of actor.micro_batch_size_per_device_for_update = ${a.microBatchSize}`;
  if (a.globalBatchSize > samplesPerStep) throw new ConfigError(`${why}: the mini-batch is larger than the step; lower actor.global_batch_size to at most ${samplesPerStep}`);
  if (samplesPerStep % a.globalBatchSize !== 0) throw new ConfigError(`${why}: ${samplesPerStep} is not a multiple of ${a.globalBatchSize}; choose a divisor of ${samplesPerStep}`);
  if (a.globalBatchSize % a.microBatchSize !== 0) throw new ConfigError(`${why}: ${a.globalBatchSize} is not a multiple of ${a.microBatchSize}; choose a divisor of ${a.globalBatchSize}`);
  return { samplesPerStep, miniBatches: samplesPerStep / a.globalBatchSize, microPerMini: a.globalBatchSize / a.microBatchSize };
}

/** Mini-batches of `size` consecutive samples (in id order), then micro-batches inside each. */
export function splitBatches<T>(items: T[], miniSize: number, microSize: number): T[][][] {
  const minis: T[][][] = [];
  for (let i = 0; i < items.length; i += miniSize) {
    const mini = items.slice(i, i + miniSize);
    const micros: T[][] = [];
    for (let j = 0; j < mini.length; j += microSize) micros.push(mini.slice(j, j + microSize));
    minis.push(micros);
  }
  return minis;
}

/** Whether to write a full checkpoint after `step` (save_freq ≤ 0: only at the end). */
export function shouldCheckpoint(step: number, totalSteps: number, saveFreq: number): boolean {
  if (step === totalSteps) return true;
  return saveFreq > 0 && step % saveFreq === 0;
}

/** Checkpoint steps to delete so that at most `saveLimit` remain (≤ 0: keep all). The newest are kept. */
export function checkpointsToPrune(steps: number[], saveLimit: number): number[] {
  if (saveLimit <= 0) return [];
  const sorted = [...steps].sort((a, b) => a - b);
  return sorted.slice(0, Math.max(0, sorted.length - saveLimit));
}
