/**
 * Trajectory rows (lib/store) from the pipeline's records: one place maps a group header and one
 * of its scored samples onto the store's columns, for the advantage stage (training samples and
 * remax baselines) and the controller (validation samples).
 */
import { storedRewardDetails, type GroupHeader, type SampleScore, type TrajectorySample } from '../contracts/index.ts';
import type { TrajectoryRow } from '../store/index.ts';
import { imageHashOf } from '../data/image-hash.ts';

/** What a row takes from the stage beyond the group and sample: the step, and the training fields (none by default). */
export type RowFields = Pick<TrajectoryRow, 'step'> &
  Partial<
    Pick<
      TrajectoryRow,
      | 'refLogprobs'
      | 'oldLogprobs'
      | 'advantages'
      | 'advantage'
      | 'returns'
      | 'filtered'
      | 'filterReason'
      | 'staleness'
      | 'vppoPerturbedLogprobs'
      | 'vppoTokenMask'
      | 'vppoScalingFactor'
      | 'vppoEntropies'
    >
  >;

/** The store row of sample `x` of group `g`; `rewardText` are its text reward details (scored.v3), if any. */
export function sampleRow(
  runId: string,
  g: GroupHeader,
  x: Omit<TrajectorySample, 'episode'> & SampleScore,
  rewardText: Readonly<Record<string, string>> | undefined,
  f: RowFields,
): TrajectoryRow {
  return {
    id: x.id,
    runId,
    step: f.step,
    epoch: g.epoch,
    kind: g.kind,
    groupUid: g.group_uid,
    promptIndex: g.prompt_index,
    sampleIndex: x.sample_index,
    policyVersion: g.policy_version,
    promptTokens: g.prompt_ids,
    responseTokens: x.response_ids,
    promptText: g.prompt_text,
    responseText: x.response_text,
    groundTruth: g.ground_truth,
    behaviourLogprobs: x.behaviour_logprobs,
    refLogprobs: f.refLogprobs ?? null,
    oldLogprobs: f.oldLogprobs ?? null,
    advantages: f.advantages ?? null,
    advantage: f.advantage ?? null,
    returns: f.returns ?? null,
    reward: x.reward,
    rewardDetails: storedRewardDetails(x.reward_details, rewardText),
    rewardFailure: x.failure ? x.failure.message : null,
    finishReason: x.finish_reason,
    filtered: f.filtered ?? false,
    filterReason: f.filterReason ?? null,
    staleness: f.staleness ?? 0,
    // the prompt's images by hash (prompt_images): the PNG bytes every topic carries hash to it
    imageHashes: g.images.map(imageHashOf),
    vppoPerturbedLogprobs: f.vppoPerturbedLogprobs ?? null,
    vppoTokenMask: f.vppoTokenMask ?? null,
    vppoScalingFactor: f.vppoScalingFactor ?? null,
    vppoEntropies: f.vppoEntropies ?? null,
    // an image policy's sample: the image it generated, stored by hash in prompt_images
    generatedImageHash: x.generated?.hash ?? null,
  };
}
