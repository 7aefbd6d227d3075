/**
 * Reward backend for multi-turn episodes with no reward function configured (`reward.type:
 * function`, `rollout.multi_turn.enable`, neither `reward_fn` nor `reward_fn_path`): the reward is
 * the environment's (discounted) reward sum the rollout recorded with the episode.
 */
import type { RewardBackend, RewardItem, RewardOutcome } from './port.ts';
import { turnRewardDetails } from '../rl/turns.ts';

const NAME = 'env:episode';

/**
 * An episode that failed (environment timeout, crash, bad reply, unreachable) is a failed outcome
 * with the reason, never a 0. Details: the turns, the environment's summed turn metrics and
 * each turn's reward at its last sampled token (`turn_reward/<k>`, for gae: lib/rl/turns.ts).
 */
export function episodeOutcome(it: RewardItem, server: string = NAME): RewardOutcome {
  const e = it.episode;
  if (!e)
    return { id: it.id, ok: false, reason: 'not a multi-turn episode (no episode record)', retriable: false, server };
  if (e.failure !== null)
    return { id: it.id, ok: false, reason: `episode failed: ${e.failure}`, retriable: false, server };
  return {
    id: it.id,
    ok: true,
    reward: e.reward,
    details: { turns: e.assistant_turns, done: e.done ? 1 : 0, ...e.metrics, ...turnRewardDetails(e.turns) },
    server,
  };
}

export function createEpisodeRewardBackend(): RewardBackend {
  return {
    name: NAME,
    score: async (items) => items.map((it) => episodeOutcome(it)),
    close: async () => {},
  };
}
