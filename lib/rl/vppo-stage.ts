/**
 * VPPO as the advantage stage applies it (arXiv 2510.09285; the math is lib/rl/vppo.ts, reused
 * here, not repeated): the step's kept samples — each with its response's log-probs under the real
 * image (old), under the perturbed image (aug), optional token entropies and its advantages — are
 * padded into (bs, T) tensors, and vppoReweight gives
 *  - the token mask: per response the top ⌈n·top_p_perception_tokens⌉ tokens by visual dependency
 *    S_t, unioned with the top ⌈n·top_p_entropy_tokens⌉ by entropy when enable_entropy_filtering;
 *  - the trajectory scaling factor α_i (batch mean 1 over samples with a response token).
 * The update stage multiplies the mask into its per-token loss weights and α into the advantages
 * (services/update/logic.ts applyVppoToSample); the advantages stored with a trajectory stay unscaled, so a replay can
 * switch VPPO on or off. Metrics under MTRL's names (actor/…).
 */
import { ConfigError } from '../errors.ts';
import { vppoReweight, type VppoConfig } from './vppo.ts';

export interface VppoStageConfig {
  top_p_perception_tokens: number;
  enable_entropy_filtering: boolean;
  top_p_entropy_tokens: number;
  advantage_scaling_min: number;
}

export interface VppoSampleInput {
  id: string;
  /** (L,) log π_old of the response tokens with the real image. */
  old_logprobs: Float32Array;
  /** (L,) log-probs of the same tokens with the perturbed image. */
  perturbed_logprobs: Float32Array;
  /** (L,) token entropies; needed when enable_entropy_filtering. */
  entropies?: Float32Array | null;
  /** (L,) the estimator's advantages (unscaled). */
  advantages: Float32Array;
  /** 1 = a policy token, 0 = an environment token (multi-turn); absent or empty = all the policy's. */
  response_mask?: Uint8Array | null;
}

export interface VppoSampleOutput {
  /** (L,) 1 = the token's gradient is kept. */
  token_mask: Uint8Array;
  /** α_i: the factor the update multiplies into this trajectory's advantages. */
  scaling_factor: number;
  /** (L,) S_t, the token visual dependency. */
  dependency: Float32Array;
}

export interface VppoStageResult {
  samples: Map<string, VppoSampleOutput>;
  /** actor/entropy_token_fraction, actor/perception_token_fraction, actor/sensitivity_score_mean, actor/scaling_factor_mean. */
  metrics: Record<string, number>;
}

/** Token masks and trajectory scaling factors for one step's kept samples (pure). */
export function vppoStage(samples: readonly VppoSampleInput[], cfg: VppoStageConfig): VppoStageResult {
  const bs = samples.length;
  const T = Math.max(1, ...samples.map((s) => s.advantages.length));
  const mask = new Float64Array(bs * T),
    adv = new Float64Array(bs * T),
    old = new Float64Array(bs * T),
    aug = new Float64Array(bs * T);
  const ent = cfg.enable_entropy_filtering ? new Float64Array(bs * T) : null;
  samples.forEach((s, i) => {
    const L = s.advantages.length;
    for (const [name, a] of [
      ['old_logprobs', s.old_logprobs],
      ['perturbed_logprobs', s.perturbed_logprobs],
    ] as const) {
      if (a.length !== L)
        throw new ConfigError(`vppo: sample ${s.id} has ${a.length} ${name} for ${L} response tokens`);
    }
    if (ent) {
      if (!s.entropies || s.entropies.length !== L)
        throw new ConfigError(
          `vppo: algorithm.vppo.enable_entropy_filtering needs the token entropies of every response; sample ${s.id} has ${s.entropies ? `${s.entropies.length} for ${L} tokens` : 'none'} (or set enable_entropy_filtering=false)`,
        );
      ent.set(s.entropies, i * T);
    }
    // multi-turn: only the policy's tokens compete for the perception and entropy selections
    const rm = s.response_mask;
    for (let t = 0; t < L; t++) mask[i * T + t] = rm && rm.length ? rm[t] : 1;
    adv.set(s.advantages, i * T);
    old.set(s.old_logprobs, i * T);
    aug.set(s.perturbed_logprobs, i * T);
  });
  const vc: VppoConfig = {
    top_p_perception_tokens: cfg.top_p_perception_tokens,
    top_p_entropy_tokens: cfg.enable_entropy_filtering ? cfg.top_p_entropy_tokens : null,
    advantage_scaling_min: cfg.advantage_scaling_min,
  };
  const r = vppoReweight(
    {
      advantages: { data: adv, bs, T },
      response_mask: { data: mask, bs, T },
      old_log_prob: { data: old, bs, T },
      aug_log_prob: { data: aug, bs, T },
      entropy: ent ? { data: ent, bs, T } : null,
    },
    vc,
  );
  const out = new Map<string, VppoSampleOutput>();
  samples.forEach((s, i) => {
    const L = s.advantages.length;
    const keep = new Uint8Array(L);
    for (let t = 0; t < L; t++) keep[t] = r.keep_mask.data[i * T + t] !== 0 ? 1 : 0;
    out.set(s.id, {
      token_mask: keep,
      scaling_factor: r.alpha[i],
      dependency: Float32Array.from(r.dependency.data.subarray(i * T, i * T + L)),
    });
  });
  return {
    samples: out,
    metrics: {
      'actor/entropy_token_fraction': r.metrics.entropy_token_fraction,
      'actor/perception_token_fraction': r.metrics.perception_token_fraction,
      'actor/sensitivity_score_mean': r.metrics.sensitivity_score_mean,
      'actor/scaling_factor_mean': r.metrics.scaling_factor_mean,
    },
  };
}
