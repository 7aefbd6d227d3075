/**
 * Rollout logic (pure): turns prompt groups into generation requests with deterministic sample
 * ids, and the generations back into trajectory groups. Randomness is keyed by the sample id, so
 * a sample's tokens do not depend on which replica or batch generated it.
 */
import type {
  PromptBatch,
  TrajectoryGroup,
  TrajectorySample,
  FinishReason,
  Episode,
  GeneratedImage,
} from '../../lib/contracts/index.ts';
import { sampleIdFor } from '../../lib/contracts/index.ts';

/** `greedy`: the remax baseline response (temperature 0, argmax), sample_index = n, never trained on. */
export interface GenRequest {
  id: string;
  prompt: Int32Array;
  groupIndex: number;
  sampleIndex: number;
  greedy: boolean;
}
export interface GenResult {
  id: string;
  tokens: Int32Array;
  logprobs: Float32Array;
  finishReason: 'eos' | 'length';
  /** Multi-turn episodes: 1 = sampled by the policy, 0 = environment tokens, and the episode's record. */
  mask?: Uint8Array;
  episode?: Episode;
  /** Image policies: the generated image and its denoising trajectory (tokens index its stochastic steps). */
  generated?: GeneratedImage;
}

export interface RequestOptions {
  /**
   * remax (Li et al. 2023): also one greedy response per training group, with the same policy
   * version, whose reward is the group's baseline. Its id is the sample id of index n.
   */
  greedyBaseline?: boolean;
}

/**
 * One request per sample of every group of the batches (in batch, group, sample order; with
 * `greedyBaseline`, each training group's greedy request follows its n samples).
 */
export function generationRequests(
  batches: PromptBatch[],
  opts: RequestOptions = {},
): { requests: GenRequest[]; groups: Array<{ batch: PromptBatch; group: PromptBatch['groups'][number] }> } {
  const requests: GenRequest[] = [];
  const groups: Array<{ batch: PromptBatch; group: PromptBatch['groups'][number] }> = [];
  for (const b of batches) {
    for (const g of b.groups) {
      const gi = groups.length;
      groups.push({ batch: b, group: g });
      for (let i = 0; i < g.n; i++)
        requests.push({
          id: sampleIdFor(b.kind, b.run_id, b.step, g.prompt_index, i),
          prompt: g.prompt_ids,
          groupIndex: gi,
          sampleIndex: i,
          greedy: false,
        });
      if (opts.greedyBaseline && b.kind === 'train')
        requests.push({
          id: sampleIdFor(b.kind, b.run_id, b.step, g.prompt_index, g.n),
          prompt: g.prompt_ids,
          groupIndex: gi,
          sampleIndex: g.n,
          greedy: true,
        });
    }
  }
  return { requests, groups };
}

/**
 * Sampling settings of a request: the batch's, or greedy (temperature 0, no truncation) for a
 * remax baseline request.
 */
export function requestSampling(batch: PromptBatch, req: GenRequest): PromptBatch['sampling'] {
  return req.greedy
    ? { temperature: 0, top_p: 1, top_k: 0, max_new_tokens: batch.sampling.max_new_tokens }
    : batch.sampling;
}

/**
 * Assembles trajectory groups from generations (the stop token stays in the tokens; the text is
 * the decoding of the tokens before it, without special tokens: sampling masks every special but
 * the stop ids, so a response holds none before its end, and decode drops specials anyway). A
 * greedy request's generation becomes the group's `baseline`, not one of its samples.
 */
export function trajectoryGroups(
  groups: Array<{ batch: PromptBatch; group: PromptBatch['groups'][number] }>,
  requests: GenRequest[],
  results: GenResult[],
  decode: (ids: Int32Array) => string,
  stopIds: number | readonly number[],
): TrajectoryGroup[] {
  const stop = new Set(typeof stopIds === 'number' ? [stopIds] : stopIds);
  const samples: TrajectorySample[][] = groups.map(() => []);
  const baselines: Array<TrajectorySample | null> = groups.map(() => null);
  requests.forEach((r, i) => {
    const res = results[i];
    if (res.id !== r.id) throw new Error(`generation ${i} is for ${res.id}, expected ${r.id}`);
    // an episode's text is its whole transcript (the environment's messages included)
    const textIds =
      !res.episode && res.finishReason === 'eos' && res.tokens.length > 0 && stop.has(res.tokens[res.tokens.length - 1])
        ? res.tokens.subarray(0, res.tokens.length - 1)
        : res.tokens;
    const finish: FinishReason = res.finishReason === 'eos' ? 'stop' : 'length';
    const sample: TrajectorySample = {
      id: r.id,
      sample_index: r.sampleIndex,
      prompt_index: groups[r.groupIndex].group.prompt_index,
      response_ids: res.tokens,
      // an image policy's tokens index its denoising steps: no text
      response_text: res.generated ? '' : decode(textIds),
      behaviour_logprobs: res.logprobs,
      response_mask: res.mask ? Buffer.from(res.mask.buffer, res.mask.byteOffset, res.mask.length) : Buffer.alloc(0),
      finish_reason: finish,
      episode: res.episode ?? null,
      generated: res.generated ?? null,
    };
    if (r.greedy) baselines[r.groupIndex] = sample;
    else samples[r.groupIndex].push(sample);
  });
  return groups.map(({ batch, group }, gi) => ({
    run_id: batch.run_id,
    id: group.id,
    step: batch.step,
    policy_version: batch.policy_version,
    prompt_index: group.prompt_index,
    dataset_index: group.dataset_index,
    prompt_ids: group.prompt_ids,
    prompt_text: group.prompt_text,
    images: group.images,
    data_source: group.data_source,
    ground_truth: group.ground_truth,
    extra_info: group.extra_info,
    group_uid: group.group_uid,
    kind: batch.kind,
    epoch: batch.epoch,
    attempt: batch.attempt,
    samples: samples[gi],
    baseline: baselines[gi],
  }));
}
