/**
 * The trainers a run config implies, derived in one place: AdamW and the learning-rate schedule of
 * actor.optim and critic.optim, the options the actor and critic trainers run with, and the
 * policy and value losses. The update stage (lib/pipeline/learner.ts) and SFT (app/sft.ts) build
 * their trainers from these.
 */
import type { Config } from '../config/index.ts';
import type { LossConfigInput, OptimConfig, TrainerOptions } from '../model/index.ts';
import type { LrScheduleConfig } from '../optim/lr-schedule.ts';

type OptimSection = Config['actor']['optim'];

/** What one trainer (actor or critic) runs with, besides its model, loss and weights. */
export interface RoleSettings {
  /** createTrainer options (threads, device, micro-batch, AdamW, …). */
  trainer: Omit<TrainerOptions, 'model' | 'loss'>;
  /** The learning rate of each 1-based optimizer step (lib/optim/lr-schedule.ts lrAt). */
  schedule: LrScheduleConfig;
}

export interface TrainerSettings {
  actor: RoleSettings;
  critic: RoleSettings;
  /** The update stage's policy loss (PPO family, NFT, …); SFT uses its own. */
  policyLoss: LossConfigInput;
  /** The critic's clipped value loss. */
  valueLoss: LossConfigInput;
  /** actor.entropy_coeff → actor.entropy_coeff_end over the optimizer steps (lr-schedule.ts linearCoefAt); null: constant. */
  entropySchedule: { start: number; end: number } | null;
}

function adamW(o: OptimSection): Partial<OptimConfig> {
  return {
    betas: o.betas as [number, number],
    eps: o.eps,
    weightDecay: o.weight_decay,
    maxGradNorm: o.max_grad_norm,
    visionLrScale: o.vision_lr_scale,
  };
}

function lrSchedule(o: OptimSection): LrScheduleConfig {
  return {
    lr: o.lr,
    scheduler: o.lr_scheduler,
    warmupSteps: o.lr_warmup_steps,
    warmupRatio: o.lr_warmup_ratio,
    minLrRatio: o.min_lr_ratio,
  };
}

/**
 * nft with neg_weight < 0 is NVlabs NFT's DAPO-like variant: the PPO clipped loss on the (GRPO)
 * advantages, not the NFT loss on ±1 outcomes.
 */
export function isDapoLikeNft(cfg: Config): boolean {
  return cfg.algorithm.policy_loss === 'nft' && cfg.algorithm.nft.neg_weight < 0;
}

/** Whether the policy trains with the NFT loss, which reads each sample's ±1 outcome and group accuracy. */
export function trainsNft(cfg: Config): boolean {
  return cfg.algorithm.policy_loss === 'nft' && !isDapoLikeNft(cfg);
}

export function trainerSettings(cfg: Config): TrainerSettings {
  const a = cfg.algorithm;
  const dapoLikeNft = isDapoLikeNft(cfg);
  return {
    actor: {
      trainer: {
        threads: cfg.actor.threads,
        device: cfg.actor.device,
        microBatchSize: cfg.actor.micro_batch_size_per_device_for_update,
        seed: cfg.data.seed,
        freezeVisionTower: cfg.actor.model.freeze_vision_tower,
        gradientCheckpointing: cfg.actor.model.enable_gradient_checkpointing,
        optim: adamW(cfg.actor.optim),
      },
      schedule: lrSchedule(cfg.actor.optim),
    },
    critic: {
      trainer: {
        threads: cfg.actor.threads,
        device: cfg.actor.device,
        microBatchSize: cfg.actor.micro_batch_size_per_device_for_update,
        gradientCheckpointing:
          cfg.critic.model.enable_gradient_checkpointing ?? cfg.actor.model.enable_gradient_checkpointing,
        optim: adamW(cfg.critic.optim),
      },
      schedule: lrSchedule(cfg.critic.optim),
    },
    policyLoss: {
      type: 'policy',
      lossMode: dapoLikeNft ? 'vanilla' : a.policy_loss,
      clipRatioLow: cfg.actor.clip_ratio_low,
      clipRatioHigh: cfg.actor.clip_ratio_high,
      clipRatioC: cfg.actor.clip_ratio_dual,
      tauPos: a.sapo.tau_pos,
      tauNeg: a.sapo.tau_neg,
      lossAggMode: cfg.actor.loss_agg_mode,
      entropyCoeff: cfg.actor.entropy_coeff,
      entropyCoeffInput: cfg.actor.entropy_coeff_end !== null,
      entropyPenaltyCoef: a.entropy_penalty_coef,
      useKlLoss: a.use_kl_loss,
      klLossCoef: a.kl_coef,
      klLossType: a.kl_loss_type ?? a.kl_penalty,
      temperature: cfg.rollout.temperature,
      nft: { negWeight: dapoLikeNft ? 1 : a.nft.neg_weight },
      clipCovRatio: a.clip_cov.ratio,
      clipCovLb: a.clip_cov.lb,
      clipCovUb: a.clip_cov.ub,
      klCovRatio: a.kl_cov.ratio,
      ppoKlCoef: a.kl_cov.ppo_kl_coef,
    },
    valueLoss: { type: 'value', cliprangeValue: cfg.critic.cliprange_value, lossAggMode: cfg.actor.loss_agg_mode },
    entropySchedule:
      cfg.actor.entropy_coeff_end === null
        ? null
        : { start: cfg.actor.entropy_coeff, end: cfg.actor.entropy_coeff_end },
  };
}
