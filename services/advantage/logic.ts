/**
 * Advantage logic (pure). A training step's groups arrive one by one (first draw, then refills);
 * `settle` decides when the step is complete, which groups are kept (online filtering, reward
 * failures) and how many more prompts to ask the controller for. `computeStep` turns the kept
 * groups into per-token advantages with the configured estimator (verl conventions, lib/rl),
 * applying overlong shaping and KL-in-reward when enabled.
 */
import type { ScoredGroup, UpdateGroup, UpdateSample } from '../../lib/contracts/index.ts';
import {
  computeAdvantage,
  onlineFilters,
  applyOverlongShaping,
  applyKlPenalty,
  makeKlController,
  klPenalty,
  tensor2d,
  turnRewardsOf,
  vppoStage,
  TURN_REWARD_PREFIX,
  type KlController,
  type OverlongConfig,
  type VppoStageConfig,
} from '../../lib/rl/index.ts';
import { ConfigError } from '../../lib/errors.ts';
import { controlEvent, refillId, type ControlEventOf } from '../../lib/contracts/index.ts';
import type { Config } from '../../lib/config/index.ts';
import { ADV_ESTIMATOR_NAMES } from '../../lib/rl/advantage.ts';
import { sampleRow } from '../../lib/pipeline/rows.ts';
import type { VppoScores } from '../../lib/pipeline/vppo.ts';
import type { PromptImageRow, TrajectoryRow } from '../../lib/store/port.ts';
import { pngSize } from '../../lib/data/image-hash.ts';

/** Names the stages log under reward/ themselves; a reward component with one of them is logged as reward/details/<name>. */
export const RESERVED_REWARD_METRICS: ReadonlySet<string> = new Set([
  'mean',
  'std',
  'max',
  'min',
  'baseline_mean',
  'minus_baseline_mean',
  'failures',
  'scored',
  'retries',
  'remote_requests',
  'remote_failures_total',
  'details',
]);

export interface AdvantageSettings {
  rolloutBatchSize: number;
  estimator: string;
  gamma: number;
  lam: number;
  normAdvByStd: boolean;
  /**
   * The group std of grpo: an image policy's divides by n with ε = 1e-4 (Flow-GRPO's
   * stat_tracking), a language policy's by n − 1 with ε = 1e-6 (verl).
   */
  groupStd: 'unbiased' | 'population';
  onlineFiltering: boolean;
  filterSemantics: string;
  filterKey: string;
  filterLow: number;
  filterHigh: number;
  overlong: { enable: boolean; maxLength: number; bufferLength: number; penaltyFactor: number };
  useKlInReward: boolean;
  klPenalty: string;
  klType: 'fixed' | 'adaptive';
  klCoef: number;
  klTarget: number;
  klHorizon: number;
}

export interface AdvantageState {
  /** Steps whose update batch was published. */
  done: number[];
  /** Refill requests made per step: needed group counts, in request order. */
  refills: Record<string, number[]>;
  /** Adaptive KL coefficient (in-reward), carried across steps. */
  klValue: number | null;
  /** The KL coefficient after each recent step (the update stage records it in the step's checkpoint). */
  klByStep?: Record<string, number>;
  /**
   * The newest policy version announced on the policy topic (read only when a step must be scored
   * with the weights that generated it: VPPO, the critic's values), and the steps waiting for a
   * version not announced yet, in order. A replay's recorded groups all arrive at once, before its
   * update stage has trained the versions they need.
   */
  policySeen?: number;
  deferred?: number[];
}

/**
 * Whether a step scored with its generating weights must wait: the version its kept groups were
 * generated with is newer than any announced, or an earlier step already waits (steps settle in
 * order: the KL controller carries from one to the next).
 */
export function mustDefer(keptVersions: readonly number[], policySeen: number, earlierDeferred: boolean): boolean {
  return earlierDeferred || Math.max(...keptVersions) > policySeen;
}

export function initialAdvantageState(): AdvantageState {
  return { done: [], refills: {}, klValue: null };
}

/** Why a group cannot be trained on (reward failure, online filter), or null. */
export function filterReason(g: ScoredGroup, s: AdvantageSettings): string | null {
  const failed = g.samples.filter((x) => x.failure !== null);
  if (failed.length)
    return `reward failed for ${failed.length}/${g.samples.length} samples: ${failed[0].failure!.message}`.slice(
      0,
      500,
    );
  if (g.baseline?.failure)
    return `reward failed for the greedy baseline (remax): ${g.baseline.failure.message}`.slice(0, 500);
  if (!s.onlineFiltering) return null;
  const values = Float64Array.from(
    g.samples.map((x) => x.reward_details[s.filterKey] ?? (s.filterKey === 'overall' ? x.reward! : NaN)),
  );
  if (values.some((v) => !Number.isFinite(v)))
    return `online filter: reward metric "${s.filterKey}" missing (set algorithm.filter_key to one of: ${Object.keys(g.samples[0]?.reward_details ?? {}).join(', ') || 'overall'})`;
  const keep = onlineFilters.get(s.filterSemantics)(values, { filter_low: s.filterLow, filter_high: s.filterHigh });
  if (keep) return null;
  const mean = values.reduce((a, b) => a + b, 0) / values.length;
  return s.filterSemantics === 'dapo'
    ? `online filter (dapo): all ${s.filterKey} equal (${values[0]})`
    : `online filter (easyr1): mean ${s.filterKey} ${mean.toFixed(4)} not in (${s.filterLow}, ${s.filterHigh})`;
}

/**
 * Why a step is short of usable groups, for the refill request (and the run's message when the
 * refills run out): reward failures with their count and the last real error (sample id, module
 * or server, message), and — only when online filtering is on — what it removed and what to change.
 */
export function shortfallReason(groups: readonly ScoredGroup[], s: AdvantageSettings): string {
  const ordered = [...groups].sort((a, b) => a.attempt - b.attempt || a.prompt_index - b.prompt_index);
  const failed = ordered.flatMap((g) =>
    [...g.samples, ...(g.baseline ? [g.baseline] : [])].filter((x) => x.failure !== null),
  );
  const parts: string[] = [];
  if (failed.length) {
    const last = failed[failed.length - 1];
    const nGroups = ordered.filter((g) => g.samples.some((x) => x.failure) || g.baseline?.failure).length;
    const fn = /^fn:|reward function/.test(last.failure!.message);
    parts.push(
      `the reward failed for ${failed.length} samples in ${nGroups} of ${ordered.length} groups (reward.on_failure dropped them); last error: ${last.id}: ${last.failure!.message} — fix the reward ${fn ? 'function' : 'servers or model'}`,
    );
  }
  if (s.onlineFiltering) {
    const byFilter = ordered
      .map((g) => filterReason(g, s))
      .filter((r): r is string => r !== null && r.startsWith('online filter'));
    if (byFilter.length) {
      const fix =
        s.filterSemantics === 'dapo' ? 'a group needs rewards that differ' : 'widen algorithm.filter_low/filter_high';
      parts.push(
        `online filtering removed ${byFilter.length} of ${ordered.length} groups (${byFilter[0]}) — ${fix}, raise algorithm.max_try_make_batch, or turn off algorithm.online_filtering`,
      );
    }
  }
  return parts.join('; ') || 'too few groups';
}

export type Settlement =
  | { kind: 'wait' }
  | { kind: 'refill'; needed: number }
  | { kind: 'ready'; kept: ScoredGroup[]; filtered: Array<{ group: ScoredGroup; reason: string }> };

/**
 * Given every group received for a step (deduplicated) and the refills asked so far: wait until
 * each draw is complete; then keep the first rollout_batch_size acceptable groups (first draw
 * first, then refills, by prompt index) or ask for the shortfall.
 */
export function settle(groups: readonly ScoredGroup[], refills: readonly number[], s: AdvantageSettings): Settlement {
  const expected = [s.rolloutBatchSize, ...refills];
  const got = new Array(expected.length).fill(0);
  for (const g of groups) if (g.attempt < got.length) got[g.attempt]++;
  for (let a = 0; a < expected.length; a++) if (got[a] < expected[a]) return { kind: 'wait' };
  const ordered = [...groups].sort((a, b) => a.attempt - b.attempt || a.prompt_index - b.prompt_index);
  const kept: ScoredGroup[] = [];
  const filtered: Array<{ group: ScoredGroup; reason: string }> = [];
  for (const g of ordered) {
    const why = filterReason(g, s);
    if (why) filtered.push({ group: g, reason: why });
    else if (kept.length < s.rolloutBatchSize) kept.push(g);
    else filtered.push({ group: g, reason: 'surplus: the step already had rollout_batch_size groups' });
  }
  if (kept.length < s.rolloutBatchSize) return { kind: 'refill', needed: s.rolloutBatchSize - kept.length };
  return { kind: 'ready', kept, filtered };
}

export interface StepResult {
  updates: UpdateGroup[];
  metrics: Record<string, number>;
  klValue: number | null;
}

/**
 * Per-token advantages for the kept groups of a step. `refLogprobs` maps sample id → reference
 * log-probs (needed for KL in reward). Rows are ordered by sample id; outcome rewards sit on the
 * last response token (verl's token_level_scores).
 */
export function computeStep(
  kept: readonly ScoredGroup[],
  filtered: ReadonlyArray<{ group: ScoredGroup; reason: string }>,
  refLogprobs: ReadonlyMap<string, Float32Array> | null,
  s: AdvantageSettings,
  klValue: number | null,
  values: ReadonlyMap<string, Float32Array> | null = null,
): StepResult {
  const rows = kept
    .flatMap((g) => g.samples.map((x) => ({ g, x })))
    .sort((a, b) => (a.x.id < b.x.id ? -1 : a.x.id > b.x.id ? 1 : 0));
  const bs = rows.length;
  const T = Math.max(1, ...rows.map((r) => r.x.response_ids.length));
  const mask = new Float32Array(bs * T);
  const scores = new Float32Array(bs * T);
  let rewards: Float64Array = Float64Array.from(rows.map((r) => r.x.reward!));
  const lengths = rows.map((r) => r.x.response_ids.length);
  const metrics: Record<string, number> = {};
  const overlong = {
    max_response_length: s.overlong.maxLength,
    overlong_buffer_len: s.overlong.bufferLength,
    overlong_penalty_factor: s.overlong.penaltyFactor,
  };
  if (s.overlong.enable) {
    const sh = applyOverlongShaping(rewards, lengths, overlong);
    rewards = sh.rewards;
    Object.assign(metrics, sh.metrics);
  }
  const baselines = s.estimator === 'remax' ? remaxBaselines(kept, s.overlong.enable ? overlong : null) : null;
  rows.forEach((r, i) => {
    const L = lengths[i];
    // multi-turn: environment tokens (response_mask 0) get no advantage, KL or loss
    const rm = r.x.response_mask;
    for (let t = 0; t < L; t++) mask[i * T + t] = rm.length ? rm[t] : 1;
    if (L === 0) return;
    const turns = s.estimator === 'gae' ? turnRewardsOf(r.x.reward_details, L) : [];
    if (turns.length === 0) {
      scores[i * T + L - 1] = rewards[i];
      return;
    }
    // gae over an episode: each turn's reward on its last sampled token (lib/rl/turns.ts); what
    // shaping added to the reward goes on the last token
    for (const [k, v] of turns) scores[i * T + k] += v;
    scores[i * T + L - 1] += rewards[i] - r.x.reward!;
  });
  let tokenRewards = tensor2d(scores, bs, T);
  const maskT = { data: mask, bs, T };
  let nextKl = klValue;
  if (s.useKlInReward) {
    if (!refLogprobs) throw new Error('KL in reward needs reference log-probs');
    const old = new Float32Array(bs * T),
      ref = new Float32Array(bs * T);
    rows.forEach((r, i) => {
      old.set(r.x.behaviour_logprobs, i * T);
      ref.set(refLogprobs.get(r.x.id)!, i * T);
    });
    const controller: KlController = makeKlController({
      type: s.klType,
      kl_coef: klValue ?? s.klCoef,
      target_kl: s.klTarget,
      horizon: s.klHorizon,
    });
    const k = applyKlPenalty(
      {
        token_level_scores: tokenRewards,
        old_log_probs: tensor2d(old, bs, T),
        ref_log_prob: tensor2d(ref, bs, T),
        response_mask: maskT,
      },
      { kl_penalty: s.klPenalty, controller },
    );
    tokenRewards = k.token_level_rewards;
    metrics['kl/mean'] = k.current_kl;
    metrics['kl/coef'] = k.beta;
    nextKl = k.next_controller.value;
  } else if (refLogprobs) {
    const old = new Float32Array(bs * T),
      ref = new Float32Array(bs * T);
    rows.forEach((r, i) => {
      old.set(r.x.behaviour_logprobs, i * T);
      ref.set(refLogprobs.get(r.x.id)!, i * T);
    });
    const kl = klPenalty(tensor2d(old, bs, T), tensor2d(ref, bs, T), s.klPenalty);
    let sum = 0,
      n = 0;
    for (let i = 0; i < bs * T; i++)
      if (mask[i]) {
        sum += kl.data[i];
        n++;
      }
    metrics['kl/mean'] = n ? sum / n : 0;
    metrics['kl/coef'] = s.klCoef;
  }
  let valuesT: ReturnType<typeof tensor2d> | undefined;
  if (values) {
    const v = new Float32Array(bs * T);
    rows.forEach((r, i) => v.set(values.get(r.x.id)!, i * T));
    valuesT = tensor2d(v, bs, T);
  }
  const out = computeAdvantage(
    s.estimator,
    {
      token_level_rewards: tokenRewards,
      response_mask: maskT,
      index: rows.map((r) => r.g.group_uid),
      values: valuesT,
      reward_baselines: baselines ? rows.map((r) => baselines.get(r.g.id)!) : undefined,
    },
    {
      gamma: s.gamma,
      lam: s.lam,
      norm_adv_by_std_in_grpo: s.normAdvByStd,
      ...(s.groupStd === 'population' ? { group_std: 'population' as const, epsilon: 1e-4 } : {}),
    },
  );
  const perSample = new Map<string, { adv: Float32Array; ret: Float32Array }>();
  rows.forEach((r, i) => {
    const L = lengths[i];
    // environment tokens (mask 0) get advantage 0 whatever the estimator leaves there (gae carries
    // the next policy token's advantage across them and whitens every position)
    const adv = Float32Array.from(out.advantages.data.subarray(i * T, i * T + L));
    for (let t = 0; t < L; t++) if (!mask[i * T + t]) adv[t] = 0;
    perSample.set(r.x.id, {
      adv,
      ret: Float32Array.from(out.returns.data.subarray(i * T, i * T + L)),
    });
  });
  const all = rows.map((r) => r.x.reward!);
  const mean = all.reduce((a, b) => a + b, 0) / Math.max(1, all.length);
  metrics['reward/mean'] = mean;
  metrics['reward/std'] = Math.sqrt(all.reduce((a, b) => a + (b - mean) ** 2, 0) / Math.max(1, all.length));
  metrics['reward/max'] = Math.max(...all);
  metrics['reward/min'] = Math.min(...all);
  // the reward's numeric components over the same samples (reward/accuracy, reward/format, …);
  // a component named like a reward/* metric of the pipeline goes under reward/details/
  const parts = new Map<string, { sum: number; n: number }>();
  for (const r of rows) {
    for (const [k, v] of Object.entries(r.x.reward_details)) {
      if (k.startsWith(TURN_REWARD_PREFIX)) continue; // per-token placement, not a metric
      const d = parts.get(k) ?? { sum: 0, n: 0 };
      d.sum += v;
      d.n++;
      parts.set(k, d);
    }
  }
  for (const [k, d] of parts)
    metrics[RESERVED_REWARD_METRICS.has(k) ? `reward/details/${k}` : `reward/${k}`] = d.sum / d.n;
  if (baselines) {
    const bs = kept.map((g) => baselines.get(g.id)!);
    metrics['reward/baseline_mean'] = bs.reduce((a, b) => a + b, 0) / Math.max(1, bs.length);
    // how much the sampled responses beat the greedy one, on average (ReMax's advantage before masking)
    metrics['reward/minus_baseline_mean'] =
      rows.reduce((a, r, i) => a + rewards[i] - baselines.get(r.g.id)!, 0) / Math.max(1, rows.length);
  }
  metrics['response_length/mean'] = lengths.reduce((a, b) => a + b, 0) / Math.max(1, bs);
  metrics['response_length/max'] = Math.max(...lengths);
  const advAll = [...perSample.values()].flatMap((v) => Array.from(v.adv));
  metrics['critic/advantages/mean'] = advAll.reduce((a, b) => a + b, 0) / Math.max(1, advAll.length);
  metrics['critic/advantages/max'] = advAll.length ? Math.max(...advAll) : 0;
  metrics['critic/advantages/min'] = advAll.length ? Math.min(...advAll) : 0;
  metrics['filter/kept_groups'] = kept.length;
  metrics['filter/filtered_groups'] = filtered.length;
  metrics['filter/kept_fraction'] = kept.length / Math.max(1, kept.length + filtered.length);
  const updates: UpdateGroup[] = [];
  const toUpdate = (g: ScoredGroup, isFiltered: boolean, reason: string | null): UpdateGroup => {
    const rs = g.samples.filter((x) => x.reward !== null).map((x) => x.reward!);
    const m = rs.length ? rs.reduce((a, b) => a + b, 0) / rs.length : null;
    // reward_text stays out of the update batch (updates.v1 has no such field; the store gets it from the scored group)
    const samples: UpdateSample[] = g.samples.map(({ reward_text: _text, ...x }) => {
      const L = x.response_ids.length;
      const a = perSample.get(x.id);
      return {
        ...x,
        advantages: a?.adv ?? new Float32Array(L),
        returns: a?.ret ?? new Float32Array(L),
        ref_logprobs: refLogprobs?.get(x.id) ?? new Float32Array(0),
        values: values?.get(x.id) ?? new Float32Array(0),
        loss_weights: isFiltered ? new Float32Array(L) : policyTokenWeights(x.response_mask, L),
        // VPPO's mask and scaling are attached afterwards (attachVppo) when algorithm.vppo.enable
        vppo: null,
      };
    });
    // the remax greedy baseline is never trained on: it is not part of the update group
    const { samples: _s, baseline: _b, ...header } = g;
    return {
      ...header,
      estimator: s.estimator,
      filtered: isFiltered,
      filter_reason: reason,
      reward_mean: m,
      reward_std: m === null ? null : Math.sqrt(rs.reduce((a, b) => a + (b - m) ** 2, 0) / rs.length),
      samples,
    };
  };
  for (const g of kept) updates.push(toUpdate(g, false, null));
  for (const f of filtered) updates.push(toUpdate(f.group, true, f.reason));
  return { updates, metrics, klValue: nextKl };
}

/**
 * ReMax baselines (Li et al. 2023, arXiv 2310.10505): group id → reward of the group's greedy
 * response (shaped like the samples' rewards when overlong shaping is on). Every kept group must
 * carry one: the rollout stage generates it when algorithm.adv_estimator = remax.
 */
export function remaxBaselines(kept: readonly ScoredGroup[], overlong: OverlongConfig | null): Map<string, number> {
  const missing = kept.filter((g) => g.baseline == null || g.baseline.reward === null);
  if (missing.length) {
    throw new ConfigError(
      `algorithm.adv_estimator = remax needs the reward of a greedy rollout per prompt, but group ${missing[0].id} (and ${missing.length - 1} more) has none: ` +
        'its trajectories were generated without algorithm.adv_estimator = remax (e.g. a replay of another run); replay such a run with another estimator, or train it anew with remax',
    );
  }
  let rewards: Float64Array = Float64Array.from(kept.map((g) => g.baseline!.reward!));
  if (overlong)
    rewards = applyOverlongShaping(
      rewards,
      kept.map((g) => g.baseline!.response_ids.length),
      overlong,
    ).rewards;
  return new Map(kept.map((g, i) => [g.id, rewards[i]]));
}

/** What the scorer gave for one sample's response under its perturbed image (VPPO). */
export interface PerturbedScore {
  /** (L,) log-probs of the response tokens with the perturbed image. */
  logprobs: Float32Array;
  /** (L,) token entropies with the real image; needed with algorithm.vppo.enable_entropy_filtering. */
  entropies?: Float32Array | null;
}

/**
 * VPPO (arXiv 2510.09285) on a step's update groups: for the samples of the kept (not filtered)
 * groups, the token mask and trajectory scaling factor of lib/rl/vppo-stage.ts from their old
 * log-probs (`oldLogprobs` when the stage recomputed them, else the behaviour log-probs), the
 * perturbed log-probs and entropies in `perturbed`, and their advantages. Returns the groups with
 * each kept sample's `vppo` set (advantages left unscaled: the update applies the factor) and the
 * actor/* metrics. Filtered groups are not trained on and keep vppo = null.
 */
export function attachVppo(
  updates: readonly UpdateGroup[],
  perturbed: ReadonlyMap<string, PerturbedScore>,
  cfg: VppoStageConfig,
  oldLogprobs: ReadonlyMap<string, Float32Array> | null = null,
): { updates: UpdateGroup[]; metrics: Record<string, number> } {
  const kept = updates.filter((g) => !g.filtered).flatMap((g) => g.samples);
  const missing = kept.filter((x) => !perturbed.has(x.id));
  if (missing.length)
    throw new ConfigError(
      `algorithm.vppo.enable: no perturbed-image log-probs for sample ${missing[0].id}${missing.length > 1 ? ` (and ${missing.length - 1} more)` : ''}; every trained sample needs them`,
    );
  if (kept.length === 0) return { updates: [...updates], metrics: {} };
  const r = vppoStage(
    kept.map((x) => {
      const p = perturbed.get(x.id)!;
      return {
        id: x.id,
        old_logprobs: oldLogprobs?.get(x.id) ?? x.behaviour_logprobs,
        perturbed_logprobs: p.logprobs,
        entropies: p.entropies ?? null,
        advantages: x.advantages,
        response_mask: x.response_mask,
      };
    }),
    cfg,
  );
  const out = updates.map((g) =>
    g.filtered
      ? g
      : {
          ...g,
          samples: g.samples.map((x): UpdateSample => {
            const v = r.samples.get(x.id)!;
            return {
              ...x,
              vppo: {
                perturbed_logprobs: perturbed.get(x.id)!.logprobs,
                token_mask: Buffer.from(v.token_mask),
                scaling_factor: v.scaling_factor,
              },
            };
          }),
        },
  );
  return { updates: out, metrics: r.metrics };
}

/** 1 for each token the policy sampled, 0 for environment tokens (response_mask; empty = all the policy's). */
export function policyTokenWeights(responseMask: Uint8Array, L: number): Float32Array {
  const w = new Float32Array(L).fill(1);
  if (responseMask.length) for (let t = 0; t < L; t++) w[t] = responseMask[t];
  return w;
}

/** The advantage stage's settings from the run's config. */
export function advantageSettings(cfg: Config): AdvantageSettings {
  const a = cfg.algorithm;
  return {
    rolloutBatchSize: cfg.data.rollout_batch_size,
    estimator: a.adv_estimator,
    gamma: a.gamma,
    lam: a.lam,
    normAdvByStd: a.norm_adv_by_std_in_grpo,
    groupStd: cfg.actor.model.kind === 'image' ? 'population' : 'unbiased',
    onlineFiltering: a.online_filtering,
    filterSemantics: a.filter_semantics,
    filterKey: a.filter_key,
    filterLow: a.filter_low,
    filterHigh: a.filter_high,
    overlong: {
      enable: a.overlong.enable,
      maxLength: a.overlong.max_length ?? cfg.data.max_response_length,
      bufferLength: a.overlong.buffer_length,
      penaltyFactor: a.overlong.penalty_factor,
    },
    useKlInReward: a.use_kl_in_reward,
    klPenalty: a.kl_penalty,
    klType: a.kl_type,
    klCoef: a.kl_coef,
    klTarget: a.kl_target,
    klHorizon: a.kl_horizon,
  };
}

/** Estimators whose extra inputs the pipeline does not produce yet, and what they need. */
const NOT_IN_PIPELINE: Readonly<Record<string, string>> = {
  optimal_token_baseline: 'Σπ² per position from full distributions (sum_pi_squared)',
  tir_optimal_token_baseline: 'Σπ² per position from full distributions (sum_pi_squared)',
};

/** Why the pipeline cannot train with algorithm.adv_estimator = `estimator` (it lacks an input), or null. */
export function estimatorRefusal(estimator: string): string | null {
  const need = NOT_IN_PIPELINE[estimator];
  if (!need) return null;
  const usable = ADV_ESTIMATOR_NAMES.filter((n) => !(n in NOT_IN_PIPELINE));
  return `algorithm.adv_estimator = ${estimator} is in lib/rl but the pipeline does not compute its extra input yet: ${need}; use ${usable.slice(0, -1).join(', ')} or ${usable[usable.length - 1]}`;
}

/** The stage_pending bucket of a training step's scored groups (zero-padded: buckets sort by step). */
export function stepBucket(step: number): string {
  return `step:${String(step).padStart(8, '0')}`;
}

/**
 * `vppo`: what the stage's VPPO passes computed besides the update — log π_old with the real image
 * (trajectories.old_logprobs) and, with entropy filtering, the token entropies (vppo_entropies).
 */
export function trajectoryRows(
  runId: string,
  u: UpdateGroup,
  step: number,
  rewardText: ReadonlyMap<string, Record<string, string>>,
  vppo: VppoScores | null,
): TrajectoryRow[] {
  return u.samples.map((x) =>
    sampleRow(runId, u, x, rewardText.get(x.id), {
      step,
      refLogprobs: x.ref_logprobs.length ? x.ref_logprobs : null,
      oldLogprobs: vppo?.old.get(x.id) ?? null,
      advantages: u.filtered ? null : x.advantages,
      advantage: u.filtered || x.advantages.length === 0 ? null : x.advantages[0],
      returns: u.filtered ? null : x.returns,
      filtered: u.filtered,
      filterReason: u.filter_reason,
      staleness: Math.max(0, step - 1 - u.policy_version),
      vppoPerturbedLogprobs: x.vppo?.perturbed_logprobs ?? null,
      vppoTokenMask: x.vppo ? x.vppo.token_mask : null,
      vppoScalingFactor: x.vppo?.scaling_factor ?? null,
      vppoEntropies: (x.vppo && vppo?.perturbed.get(x.id)?.entropies) ?? null,
    }),
  );
}

/**
 * The images an image policy generated in these update groups, one row per distinct hash (stored
 * once in prompt_images; trajectories.generated_image_hash names them).
 */
export function generatedImageRows(runId: string, updates: readonly UpdateGroup[]): PromptImageRow[] {
  const rows = new Map<string, PromptImageRow>();
  for (const u of updates)
    for (const x of u.samples)
      if (x.generated && !rows.has(x.generated.hash))
        rows.set(x.generated.hash, {
          runId,
          hash: x.generated.hash,
          ...pngSize(x.generated.png),
          png: x.generated.png,
        });
  return [...rows.values()];
}

/** filter_reason of a stored remax baseline trajectory. */
export const BASELINE_REASON =
  'remax greedy baseline (temperature 0): its reward is the baseline of the group; never trained on';

/**
 * The remax greedy baselines of the step's groups as trajectory rows: stored for analysis (reward,
 * tokens), flagged filtered with a reason saying what they are, since they are never trained on.
 */
export function baselineRows(runId: string, groups: readonly ScoredGroup[], step: number): TrajectoryRow[] {
  return groups.flatMap((g) =>
    (g.baseline ? [g.baseline] : []).map((x) =>
      sampleRow(runId, g, x, x.reward_text, {
        step,
        filtered: true,
        filterReason: BASELINE_REASON,
        staleness: Math.max(0, step - 1 - g.policy_version),
      }),
    ),
  );
}

/**
 * The rows of the groups with a reward failure (a sample's or the remax baseline's), filtered
 * with their reason: such a group is never trained on, so its samples are stored when it arrives
 * (a run that stops because its rewards keep failing never settles the step). Samples first, then
 * the baselines.
 */
export function failureRows(runId: string, groups: readonly ScoredGroup[], s: AdvantageSettings): TrajectoryRow[] {
  const failed = groups.filter((g) => g.samples.some((x) => x.failure) || g.baseline?.failure);
  return [
    ...failed.flatMap((g) =>
      g.samples.map((x) =>
        sampleRow(runId, g, x, x.reward_text, {
          step: g.step,
          filtered: true,
          filterReason: filterReason(g, s),
          staleness: Math.max(0, g.step - 1 - g.policy_version),
        }),
      ),
    ),
    ...failed.flatMap((g) => baselineRows(runId, [g], g.step)),
  ];
}

/** The controller event asking for `needed` more groups of `step` (its `request`-th refill). */
export function refillRequest(
  runId: string,
  step: number,
  request: number,
  needed: number,
  groups: readonly ScoredGroup[],
  s: AdvantageSettings,
  timeMs: number,
): ControlEventOf<'refill_request'> {
  return controlEvent(
    'refill_request',
    { request, needed, filtered_group_ids: groups.map((g) => g.id), reason: shortfallReason(groups, s) },
    {
      run_id: runId,
      id: refillId(runId, step, request),
      step,
      policy_version: groups[0]?.policy_version ?? 0,
      time_ms: timeMs,
    },
  );
}

/** Marks `step` done in the state: its KL controller value recorded (algorithm.kl_coef when there is none), its refills dropped. */
export function stepDone(state: AdvantageState, step: number, klValue: number | null, klCoef: number): void {
  state.klValue = klValue;
  state.klByStep = { ...(state.klByStep ?? {}), [String(step)]: klValue ?? klCoef };
  state.done.push(step);
  delete state.refills[step];
}

/** Bounds the saved state: the 256 newest done steps, the KL values of the 64 newest steps. */
export function trimAdvantageState(state: AdvantageState): void {
  if (state.done.length > 256) state.done = state.done.slice(-256);
  if (state.klByStep)
    state.klByStep = Object.fromEntries(
      Object.entries(state.klByStep)
        .sort((a, b) => Number(a[0]) - Number(b[0]))
        .slice(-64),
    );
}
