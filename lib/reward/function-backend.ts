/**
 * Reward backend `reward.type: function`: a built-in reward function (`reward.reward_fn`, or
 * data.task's) or a user module (`reward.reward_fn_path`): a JS/TS module runs in a worker thread
 * with `reward.timeout_s` per sample, so a function that never returns cannot block the stage; a
 * Python module (`*.py`) runs in a pool of long-lived Python workers (lib/reward-fns/python-pool.ts).
 * Multi-turn episodes without a reward function take the environment's rewards (episode-backend.ts).
 * Also the backend of `reward.type: remote` with the servers switched off (debug mode).
 */
import { rewardFns, parseExtraInfo } from '../reward-fns/index.ts';
import { FunctionRewardWorker, type FunctionRewardSpec } from '../reward-fns/function-worker.ts';
import { createPythonRewardBackend, isPythonRewardPath } from '../reward-fns/python-pool.ts';
import { forStage } from '../log.ts';
import { ConfigError } from '../errors.ts';
import type { RewardBackend, RewardBackendContext, RewardOutcome } from './port.ts';
import { createEpisodeRewardBackend } from './episode-backend.ts';

export async function createFunctionRewardBackend({ cfg, log }: RewardBackendContext): Promise<RewardBackend> {
  const r = cfg.reward;
  if (cfg.rollout.multi_turn.enable && r.type === 'function' && !r.reward_fn && !r.reward_fn_path)
    // multi-turn episodes without a reward function: the environment's rewards
    return createEpisodeRewardBackend();
  if (r.reward_fn_path && isPythonRewardPath(r.reward_fn_path)) {
    const warnLog = forStage(log, 'reward');
    return createPythonRewardBackend({ ...r, reward_fn_path: r.reward_fn_path }, (m) => warnLog.warn(m));
  }
  let fn: FunctionRewardSpec;
  let name: string;
  // remote servers switched off: the reward function (or data.task's reward, as the config loader fills it)
  const fnName =
    r.reward_fn ??
    (r.type === 'remote' && cfg.data.task !== null && rewardFns.has(cfg.data.task) ? cfg.data.task : null);
  if (r.reward_fn_path) {
    fn = { path: r.reward_fn_path, name: r.reward_fn_name };
    name = `fn:${r.reward_fn_path}`;
  } else if (fnName) {
    rewardFns.get(fnName);
    fn = { path: null, name: fnName };
    name = `fn:${fnName}`;
  } else if (r.type === 'remote') {
    throw new ConfigError(
      `reward.type = remote with the reward servers switched off (${r.remote.enabled === false ? 'reward.remote.enabled: false' : 'DISABLE_RL_REWARD_MODEL=true'}) needs a reward function: set reward.reward_fn (built-in: ${rewardFns.names().join(', ')}) or reward.reward_fn_path, or turn the servers back on`,
    );
  } else {
    fn = { path: null, name: 'exact_match' };
    name = 'fn:exact_match';
  }
  const kwargs = r.reward_fn_kwargs as Record<string, unknown>;
  const worker = new FunctionRewardWorker(fn, r.timeout_s * 1000);
  await worker.start();
  return {
    name,
    async score(items) {
      const out: RewardOutcome[] = [];
      for (const it of items) {
        const o = await worker.score({
          prompt: it.prompt_text,
          response: it.response_text,
          ground_truth: it.ground_truth ?? '',
          data_source: it.data_source ?? '',
          extra_info: parseExtraInfo(it.extra_info),
          kwargs,
          ...(it.images?.length ? { images: it.images } : {}),
        });
        out.push(
          o.ok
            ? { id: it.id, ok: true, reward: o.reward, details: o.metrics, server: name }
            : { id: it.id, ok: false, reason: o.reason, retriable: false, server: name },
        );
      }
      return out;
    },
    close: () => worker.close(),
  };
}
