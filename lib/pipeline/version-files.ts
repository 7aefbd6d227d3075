/**
 * Which trained steps become checkpoints and which policy versions are written as files
 * (policy.version_files). Pure: the update stage (services/update) decides with it, and
 * lib/pipeline/update-commit.ts applies it.
 *
 * The rule: a version is written every step when a reader needs its files — a reader outside this
 * process (the rollout as its own process or as several replicas, an inference engine that loads
 * each version, rollout.engine other than onnx), or a reader in it that reads files only (a LoRA
 * policy's readers merge the adapter files into the base; an image policy's versions are model
 * directories, lib/image/checkpoint.ts). Otherwise the embedded rollout takes each version from
 * memory, and only the versions a checkpoint or a validation round needs are written.
 */
import type { Config, VersionFiles } from '../config/index.ts';
import { totalSteps, valScheduled, type ControllerPlan } from './plan.ts';

/** Whether to write a full checkpoint after `step` (save_freq ≤ 0: only at the end). */
export function shouldCheckpoint(step: number, totalSteps: number, saveFreq: number): boolean {
  if (step === totalSteps) return true;
  return saveFreq > 0 && step % saveFreq === 0;
}

/** The config keys versionFilesOf reads. */
export interface VersionReadersConfig {
  policy: Pick<Config['policy'], 'version_files'>;
  rollout: Pick<Config['rollout'], 'replicas' | 'engine'>;
  actor: { model: Pick<Config['actor']['model'], 'lora' | 'kind'> };
}

/**
 * Whether every version must be a file whatever policy.version_files says: the policy's readers
 * read files only (LoRA: they merge the adapter files; an image policy: its versions are model
 * directories; rollout.engine other than onnx: the engine, another process, loads each version).
 */
function readsFilesOnly(cfg: VersionReadersConfig): boolean {
  return !!cfg.actor.model.lora || cfg.actor.model.kind === 'image' || cfg.rollout.engine !== 'onnx';
}

/**
 * policy.version_files as the update stage applies it: every_step whenever a reader reads the
 * files only (readsFilesOnly); otherwise as set, and `auto` is every_step when the rollout is
 * outside this process (rlstream serve, several rollout replicas) and checkpoints when it runs in
 * it (rlstream train).
 */
export function versionFilesOf(cfg: VersionReadersConfig, rolloutInProcess: boolean): VersionFiles {
  if (readsFilesOnly(cfg)) return 'every_step';
  if (cfg.policy.version_files !== 'auto') return cfg.policy.version_files;
  const readerOutside = !rolloutInProcess || cfg.rollout.replicas !== 1;
  return readerOutside ? 'every_step' : 'checkpoints';
}

/**
 * Whether the update stage writes policy version `step` as a file (policy.version_files, resolved:
 * versionFilesOf). checkpoints: a checkpoint step and the pipeline.max_staleness versions before one
 * (a rollout restarted at that checkpoint may still sample with them: oldestSampledVersion), and a
 * version a validation round samples with; every other version is kept in memory only.
 */
export function writesVersionFile(
  step: number,
  files: VersionFiles,
  cfg: { trainer: Pick<Config['trainer'], 'save_freq'>; pipeline: Pick<Config['pipeline'], 'max_staleness'> },
  plan: ControllerPlan,
): boolean {
  if (files === 'every_step' || valScheduled(plan, step)) return true;
  const total = totalSteps(plan);
  for (let c = step; c <= Math.min(total, step + cfg.pipeline.max_staleness); c++)
    if (shouldCheckpoint(c, total, cfg.trainer.save_freq)) return true;
  return false;
}
