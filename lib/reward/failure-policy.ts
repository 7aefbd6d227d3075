/**
 * `reward.on_failure`: what the reward stage does with a group in which some trajectory could not
 * be scored. Pure: no I/O, no clock. A trajectory that could not be scored is never given a
 * reward; the decision is over the whole group (GRPO-style estimators need every member):
 *  - all scored                → `emit`;
 *  - `retry`                   → `retry_later` while every failure is retriable and the group's
 *                                later attempts (`reward.max_retries_later`) are not used up, else
 *                                `drop_group` (retrying cannot help, or no attempts are left);
 *  - `drop_group`              → `drop_group` (the controller refills the step);
 *  - `stop`                    → `stop` with a message naming the servers and errors.
 * A trajectory of the group without any outcome counts as a failure (nothing is lost silently).
 */
import type { OnFailurePolicy, RewardOutcome } from './types.ts';

export interface GroupInfo {
  group_id: string;
  /** Ids of every trajectory in the group. */
  expected_ids: readonly string[];
  /** How many times this group has been sent back for scoring already (0 on the first try). */
  attempt: number;
  /** Upper bound on `attempt` for `retry` (`reward.max_retries_later`). */
  max_attempts: number;
}

export interface FailedTrajectory {
  id: string;
  reason: string;
  retriable: boolean;
  server?: string;
  body?: string;
}

export interface FailureDecision {
  action: 'emit' | 'retry_later' | 'drop_group' | 'stop';
  /** Why (absent for `emit`): names the trajectories, servers and errors. */
  message?: string;
  failed: FailedTrajectory[];
}

const LISTED = 3;

function describe(failed: FailedTrajectory[]): string {
  const parts = failed
    .slice(0, LISTED)
    .map((f) => `${f.id}${f.server && !f.reason.includes(f.server) ? ` on ${f.server}` : ''}: ${f.reason}`);
  if (failed.length > LISTED) parts.push(`… and ${failed.length - LISTED} more`);
  return parts.join('; ');
}

/** What produced the failures, by the backend names of lib/reward (fn:…, onnx:…, HTTP servers). */
function whatToFix(failed: FailedTrajectory[]): string {
  const server = failed.find((f) => f.server)?.server;
  if (server?.startsWith('fn:')) return `the reward function ${server.slice(3)}`;
  if (server?.startsWith('onnx:')) return `the reward model ${server.slice(5)}`;
  return 'the reward servers';
}

export function decideOnFailures(
  outcomes: readonly RewardOutcome[],
  group: GroupInfo,
  policy: OnFailurePolicy,
): FailureDecision {
  const expected = new Set(group.expected_ids);
  const best = new Map<string, RewardOutcome>();
  const unexpected: string[] = [];
  for (const o of outcomes) {
    if (!expected.has(o.id)) {
      unexpected.push(o.id);
      continue;
    }
    const prev = best.get(o.id);
    if (!prev || (!prev.ok && o.ok)) best.set(o.id, o);
  }
  if (unexpected.length > 0) {
    return {
      action: 'stop',
      message: `reward: group ${group.group_id} got outcomes for trajectories that are not in it (${unexpected.slice(0, LISTED).join(', ')}${unexpected.length > LISTED ? ', …' : ''}) — a wiring bug; stopping rather than guessing`,
      failed: [],
    };
  }
  const failed: FailedTrajectory[] = [];
  for (const id of group.expected_ids) {
    const o = best.get(id);
    if (!o) failed.push({ id, reason: 'no reward outcome was produced for this trajectory', retriable: true });
    else if (!o.ok) failed.push({ id, reason: o.reason, retriable: o.retriable, server: o.server, body: o.body });
    else if (!Number.isFinite(o.reward))
      failed.push({ id, reason: `reward is not finite (${o.reward})`, retriable: false, server: o.server });
  }
  if (failed.length === 0) return { action: 'emit', failed };

  const head = `reward: ${failed.length} of ${group.expected_ids.length} trajectories in group ${group.group_id} could not be scored (${describe(failed)})`;
  switch (policy) {
    case 'drop_group':
      return { action: 'drop_group', message: `${head}; dropping the group (reward.on_failure: drop_group)`, failed };
    case 'stop':
      return {
        action: 'stop',
        message: `${head}; stopping the run (reward.on_failure: stop) — fix ${whatToFix(failed)}, or set reward.on_failure to retry or drop_group`,
        failed,
      };
    case 'retry': {
      const permanent = failed.filter((f) => !f.retriable);
      if (permanent.length > 0) {
        return {
          action: 'drop_group',
          message: `${head}; dropping the group: ${permanent.length} of these failures cannot succeed on retry (${describe(permanent)})`,
          failed,
        };
      }
      if (group.attempt >= group.max_attempts) {
        return {
          action: 'drop_group',
          message: `${head}; dropping the group after ${group.attempt} later attempts (reward.max_retries_later = ${group.max_attempts})`,
          failed,
        };
      }
      return {
        action: 'retry_later',
        message: `${head}; will retry the group (attempt ${group.attempt + 1} of ${group.max_attempts})`,
        failed,
      };
    }
    default: {
      const never: never = policy;
      throw new Error(`unknown reward.on_failure "${String(never)}" — valid: retry, drop_group, stop`);
    }
  }
}
