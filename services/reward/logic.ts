/**
 * Reward logic (pure): builds a scored group from a trajectory group and one outcome per sample.
 * A sample whose scoring failed carries `reward: null` and the failure — never a zero — and the
 * group's fate follows reward.on_failure (decided in lib/reward/failure-policy.ts).
 */
import type { TrajectoryGroup, TrajectorySample, ScoredGroup, ScoredSample } from '../../lib/contracts/index.ts';
import type { RewardOutcome } from '../../lib/reward/types.ts';
import type { RewardItem } from '../../lib/reward/port.ts';

/** The samples to score: the group's, then its remax greedy baseline when it has one (scored like any other). */
export function samplesToScore(g: TrajectoryGroup): TrajectorySample[] {
  return g.baseline ? [...g.samples, g.baseline] : g.samples;
}

/**
 * One item per sample to score: its texts (functions, HTTP servers) and its token ids (reward
 * models). The images are the prompt's, or for an image policy's sample the image it generated
 * (the `image` a `/score` server receives).
 */
export function rewardItems(g: TrajectoryGroup): RewardItem[] {
  return samplesToScore(g).map((s) => ({
    id: s.id,
    step: g.step,
    prompt_text: g.prompt_text,
    response_text: s.response_text,
    ground_truth: g.ground_truth,
    images: s.generated ? [s.generated.png] : g.images,
    prompt_ids: g.prompt_ids,
    response_ids: s.response_ids,
    data_source: g.data_source,
    extra_info: g.extra_info,
    episode: s.episode,
  }));
}

/** Longest text detail kept (characters); longer ones are cut and end with "…". */
export const REWARD_TEXT_MAX = 4096;

/**
 * A reward's details split for scored.v3: finite numbers (booleans as 1/0) into reward_details —
 * the metrics, filters and NFT read those — and everything else into reward_text: strings as
 * they are, other JSON values (objects, arrays, null) as JSON text, each cut to REWARD_TEXT_MAX.
 * A non-finite number is dropped (NaN is no metric; the reward itself is checked elsewhere).
 */
export function splitDetails(details: Record<string, unknown>): {
  numbers: Record<string, number>;
  text: Record<string, string>;
} {
  const numbers: Record<string, number> = {};
  const text: Record<string, string> = {};
  for (const [k, v] of Object.entries(details)) {
    if (typeof v === 'number') {
      if (Number.isFinite(v)) numbers[k] = v;
      continue;
    }
    if (typeof v === 'boolean') {
      numbers[k] = v ? 1 : 0;
      continue;
    }
    if (v === undefined || typeof v === 'function' || typeof v === 'symbol' || typeof v === 'bigint') continue;
    let t: string;
    try {
      t = typeof v === 'string' ? v : JSON.stringify(v);
    } catch {
      continue;
    }
    if (typeof t !== 'string') continue;
    text[k] = t.length > REWARD_TEXT_MAX ? `${t.slice(0, REWARD_TEXT_MAX - 1)}…` : t;
  }
  return { numbers, text };
}

export function scoredGroup(
  g: TrajectoryGroup,
  outcomes: readonly RewardOutcome[],
  rewardFn: string,
  attempts: number,
): ScoredGroup {
  const byId = new Map(outcomes.map((o) => [o.id, o]));
  const scored = ({ episode: _episode, ...s }: TrajectorySample): ScoredSample => {
    const o = byId.get(s.id);
    if (!o)
      return {
        ...s,
        reward: null,
        reward_details: {},
        reward_text: {},
        failure: { code: 'ERR_REWARD_MISSING', message: `no reward outcome for ${s.id}`, retriable: false, attempts },
      };
    if (o.ok) {
      const d = splitDetails(o.details);
      return { ...s, reward: o.reward, reward_details: d.numbers, reward_text: d.text, failure: null };
    }
    return {
      ...s,
      reward: null,
      reward_details: {},
      reward_text: {},
      failure: {
        code: o.retriable ? 'ERR_REWARD_RETRIABLE' : 'ERR_REWARD',
        message:
          `${o.server && !o.reason.includes(o.server) ? `${o.server}: ` : ''}${o.reason}${o.body ? ` (body: ${o.body.slice(0, 200)})` : ''}`.slice(
            0,
            2000,
          ),
        retriable: o.retriable,
        attempts,
      },
    };
  };
  const { samples: _drop, baseline, ...header } = g;
  return {
    ...header,
    reward_fn: rewardFn,
    samples: g.samples.map(scored),
    baseline: baseline ? scored(baseline) : null,
  };
}

/**
 * Samples of the groups left without a reward (`reward/failures`). The reward statistics
 * (reward/mean|std|max|min and each numeric component) are the advantage stage's: it sees a
 * step's groups together, after filtering.
 */
export function failedSamples(groups: readonly ScoredGroup[]): number {
  let n = 0;
  for (const g of groups) for (const s of g.samples) if (s.reward === null) n++;
  return n;
}
