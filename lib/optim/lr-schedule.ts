/**
 * Learning-rate schedules, computed outside the training graph and fed in each step.
 *  - constant: lr (after warmup);
 *  - cosine: lr · (min_ratio + (1 − min_ratio) · ½(1 + cos(π · progress))) after warmup
 *    (as in verl's/HF's cosine-with-warmup);
 * Warmup is linear from 0 to lr over `warmupSteps` (or ⌊warmupRatio · totalSteps⌋) steps.
 * Steps are 1-based optimizer steps.
 */
import { ConfigError } from '../errors.ts';

export interface LrScheduleConfig {
  lr: number;
  scheduler: 'constant' | 'cosine';
  warmupSteps?: number | null;
  warmupRatio?: number;
  minLrRatio?: number;
}

export function warmupStepsOf(cfg: LrScheduleConfig, totalSteps: number): number {
  if (cfg.warmupSteps != null && cfg.warmupSteps >= 0) return Math.floor(cfg.warmupSteps);
  return Math.floor((cfg.warmupRatio ?? 0) * totalSteps);
}

export function lrAt(cfg: LrScheduleConfig, step: number, totalSteps: number): number {
  if (!(step >= 1)) throw new ConfigError(`lr schedule: optimizer step must be ≥ 1, got ${step}`);
  const warm = warmupStepsOf(cfg, totalSteps);
  if (warm > 0 && step <= warm) return cfg.lr * (step / warm);
  if (cfg.scheduler === 'constant') return cfg.lr;
  const span = Math.max(1, totalSteps - warm);
  const progress = Math.min(1, Math.max(0, (step - warm) / span));
  const minRatio = cfg.minLrRatio ?? 0;
  return cfg.lr * (minRatio + (1 - minRatio) * 0.5 * (1 + Math.cos(Math.PI * progress)));
}

/**
 * A coefficient that goes linearly from `start` at optimizer step 1 to `end` at `totalSteps`
 * (held at `end` after it): actor.entropy_coeff → actor.entropy_coeff_end.
 */
export function linearCoefAt(start: number, end: number, step: number, totalSteps: number): number {
  if (!(step >= 1)) throw new ConfigError(`coefficient schedule: optimizer step must be ≥ 1, got ${step}`);
  if (totalSteps <= 1) return end;
  const progress = Math.min(1, (step - 1) / (totalSteps - 1));
  return start * (1 - progress) + end * progress;
}
