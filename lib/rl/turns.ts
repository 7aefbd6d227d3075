/**
 * Per-turn rewards of multi-turn episodes for token-level estimators (gae).
 *
 * An episode's response is `sampled₁ | env₁ | sampled₂ | … | sampledₖ`; the environment's answer
 * to assistant turn t carries a reward r_t. For GAE the reward r_t sits on the last token the
 * policy sampled in turn t (the token whose action the environment answered), and the recursion
 * δ_k = r_k + γ·V_next − V_k, A_k = δ_k + γλ·A_next runs over policy tokens only: an environment
 * token (response mask 0) carries V_next and A_next unchanged (computeGaeAdvantageReturn), so turn
 * boundaries cost no discount steps (SkyRL / verl multi-turn GAE).
 *
 * The reward stage passes r_t in the sample's reward details as `turn_reward/<k>` = r_t, k = the
 * index in response_ids of turn t's last sampled token.
 */

/** Prefix of the reward-detail keys that carry per-turn rewards (`turn_reward/<token index>`). */
export const TURN_REWARD_PREFIX = 'turn_reward/';

/** Reward details `turn_reward/<k>` → [k, r] pairs (k within 0..length-1; others are refused). */
export function turnRewardsOf(details: Readonly<Record<string, number>>, length: number): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (const [key, r] of Object.entries(details)) {
    if (!key.startsWith(TURN_REWARD_PREFIX)) continue;
    const k = Number(key.slice(TURN_REWARD_PREFIX.length));
    if (!Number.isInteger(k) || k < 0 || k >= length)
      throw new RangeError(`reward detail ${key}: token index outside the response (length ${length})`);
    out.push([k, r]);
  }
  return out;
}

/**
 * The `turn_reward/<k>` details of an episode from its turns (role, start, end, reward): each
 * non-assistant turn's reward goes to the assistant turn before it; an assistant turn with no
 * tokens passes its reward on to the last policy token before it (or the first after it, for
 * turn 0). Turns without a reward give no key.
 */
export function turnRewardDetails(
  turns: ReadonlyArray<{ role: string; start: number; end: number; reward: number }>,
): Record<string, number> {
  const out: Record<string, number> = {};
  let lastEnd = -1; // last sampled token of the latest assistant turn
  let pending = 0;
  for (const t of turns) {
    if (t.role === 'assistant') {
      if (t.end > t.start) {
        lastEnd = t.end - 1;
        if (pending !== 0) {
          out[TURN_REWARD_PREFIX + lastEnd] = (out[TURN_REWARD_PREFIX + lastEnd] ?? 0) + pending;
          pending = 0;
        }
      }
      continue;
    }
    if (t.reward === 0) continue;
    if (lastEnd < 0) pending += t.reward;
    else out[TURN_REWARD_PREFIX + lastEnd] = (out[TURN_REWARD_PREFIX + lastEnd] ?? 0) + t.reward;
  }
  return out;
}
