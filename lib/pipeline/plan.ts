/**
 * The run plan shared by the stages: how many steps an epoch has and how many steps the run
 * has, from the data size and the config (verl's drop_last dataloader: an incomplete final batch
 * is dropped).
 */
import type { Config } from '../config/index.ts';

export interface ControllerPlan {
  runId: string;
  trainSize: number;
  valSize: number;
  rolloutBatchSize: number;
  valBatchSize: number;
  totalEpochs: number;
  /** Explicit cap on steps (trainer.max_steps), or null. */
  maxSteps: number | null;
  maxStaleness: number;
  valFreq: number;
  valBeforeTrain: boolean;
  valOnly: boolean;
  shuffle: boolean;
  seed: number;
  maxTryMakeBatch: number;
  /** algorithm.filter_semantics and filter_key, for the message when online filtering runs out of tries. */
  filterSemantics?: 'easyr1' | 'dapo';
  filterKey?: string;
  /** A replay: the controller runs the validation rounds only (the training groups are the source's). */
  replayValidation?: boolean;
}

export function planFromConfig(cfg: Config, runId: string, trainSize: number, valSize: number): ControllerPlan {
  return {
    runId,
    trainSize,
    valSize,
    rolloutBatchSize: cfg.data.rollout_batch_size,
    valBatchSize: cfg.data.val_batch_size,
    totalEpochs: cfg.trainer.total_epochs,
    maxSteps: cfg.trainer.max_steps,
    maxStaleness: cfg.pipeline.max_staleness,
    valFreq: cfg.trainer.val_freq,
    valBeforeTrain: cfg.trainer.val_before_train,
    valOnly: cfg.trainer.val_only,
    shuffle: cfg.data.shuffle,
    seed: cfg.data.seed,
    maxTryMakeBatch: cfg.algorithm.max_try_make_batch,
    filterSemantics: cfg.algorithm.filter_semantics,
    filterKey: cfg.algorithm.filter_key,
  };
}

export function stepsPerEpoch(plan: Pick<ControllerPlan, 'trainSize' | 'rolloutBatchSize'>): number {
  return Math.floor(plan.trainSize / plan.rolloutBatchSize);
}

export function totalSteps(
  plan: Pick<ControllerPlan, 'trainSize' | 'rolloutBatchSize' | 'totalEpochs' | 'maxSteps' | 'valOnly'>,
): number {
  if (plan.valOnly) return 0;
  const full = stepsPerEpoch(plan) * plan.totalEpochs;
  return plan.maxSteps != null ? Math.min(plan.maxSteps, full) : full;
}

/**
 * The line said at start when trainer.max_steps asks for more steps than trainer.total_epochs
 * gives (the run stops at the smaller), naming both numbers and the key to change; null otherwise.
 */
export function stepCapNotice(
  plan: Pick<ControllerPlan, 'trainSize' | 'rolloutBatchSize' | 'totalEpochs' | 'maxSteps' | 'valOnly'>,
): string | null {
  if (plan.valOnly || plan.maxSteps == null) return null;
  const per = stepsPerEpoch(plan);
  const full = per * plan.totalEpochs;
  if (plan.maxSteps <= full) return null;
  const why = `${plan.trainSize} training rows / data.rollout_batch_size ${plan.rolloutBatchSize} = ${per} step${per === 1 ? '' : 's'} per epoch`;
  if (per === 0)
    return `trainer.max_steps = ${plan.maxSteps}, but an epoch has no full batch (${why}), so the run trains 0 steps: lower data.rollout_batch_size or add rows`;
  const need = Math.ceil(plan.maxSteps / per);
  return `trainer.max_steps = ${plan.maxSteps}, but trainer.total_epochs = ${plan.totalEpochs} gives only ${full} steps (${why}), so the run stops at step ${full}: set trainer.total_epochs=${need} to train ${plan.maxSteps} steps`;
}

/** Whether the controller runs a validation round with policy version `version` (val_before_train, val_freq, the last step). */
export function valScheduled(plan: ControllerPlan, version: number): boolean {
  if (plan.valSize === 0) return false;
  if (plan.valOnly) return version === 0;
  if (version === 0) return plan.valBeforeTrain;
  if (version === totalSteps(plan)) return true;
  return plan.valFreq > 0 && version % plan.valFreq === 0;
}
