/**
 * Shared fixtures of the advantage stage's unit tests: its settings (GRPO, no filtering, no KL,
 * overridable) and scored samples and groups of run 'r', step 1, policy version 0.
 */
import { groupId, hashId, sampleId, type ScoredGroup, type ScoredSample } from '../../../lib/contracts/index.ts';
import type { AdvantageSettings } from '../../../services/advantage/logic.ts';

export function advantageSettings(over: Partial<AdvantageSettings> = {}): AdvantageSettings {
  return {
    rolloutBatchSize: 2,
    estimator: 'grpo',
    gamma: 1,
    lam: 1,
    normAdvByStd: true,
    groupStd: 'unbiased',
    onlineFiltering: false,
    filterSemantics: 'easyr1',
    filterKey: 'overall',
    filterLow: 0.01,
    filterHigh: 0.99,
    overlong: { enable: false, maxLength: 4, bufferLength: 2, penaltyFactor: 1 },
    useKlInReward: false,
    klPenalty: 'kl',
    klType: 'fixed',
    klCoef: 0,
    klTarget: 0.1,
    klHorizon: 10000,
    ...over,
  };
}

/**
 * Sample `i` of prompt `p`; a null reward is a reward failure with `failureMessage`. By default
 * one response token (3) with log-prob −1 and no reward details.
 */
export function scoredSample(
  p: number,
  i: number,
  reward: number | null,
  o: {
    responseIds?: Int32Array;
    logprobs?: Float32Array;
    details?: Record<string, number>;
    failureMessage?: string;
  } = {},
): ScoredSample {
  return {
    id: sampleId('r', 1, p, i),
    sample_index: i,
    prompt_index: p,
    response_ids: o.responseIds ?? Int32Array.from([3]),
    response_text: 'x',
    behaviour_logprobs: o.logprobs ?? Float32Array.from([-1]),
    response_mask: Buffer.alloc(0),
    finish_reason: 'stop',
    reward,
    reward_details: o.details ?? {},
    reward_text: {},
    failure:
      reward === null
        ? { code: 'ERR_REWARD', message: o.failureMessage ?? 'boom', retriable: false, attempts: 1 }
        : null,
    generated: null,
  };
}

/** The training group of prompt `p` with `samples` (prompt [1], no images, no baseline unless overridden). */
export function scoredGroup(p: number, samples: ScoredSample[], over: Partial<ScoredGroup> = {}): ScoredGroup {
  const id = groupId('r', 1, p);
  return {
    run_id: 'r',
    id,
    step: 1,
    policy_version: 0,
    group_uid: hashId(id),
    kind: 'train',
    epoch: 0,
    attempt: 0,
    prompt_index: p,
    dataset_index: p,
    prompt_ids: Int32Array.from([1]),
    prompt_text: 'q',
    images: [],
    data_source: 't',
    ground_truth: '1',
    extra_info: '{}',
    reward_fn: 'fn:t',
    samples,
    baseline: null,
    ...over,
  };
}
