/**
 * Reward backend `reward.type: remote`: HTTP reward servers through the client of
 * http-client.ts (affinity routing, retries, breakers, per-batch budget). With the servers
 * switched off (`reward.remote.enabled: false`, or `DISABLE_RL_REWARD_MODEL=true` in this
 * process's environment — debug mode) rewards come from the reward function instead.
 */
import { forStage } from '../log.ts';
import { createRemoteRewardClient } from './http-client.ts';
import { isRemoteRewardEnabled } from './types.ts';
import { createFunctionRewardBackend } from './function-backend.ts';
import type { RewardBackend, RewardBackendContext } from './port.ts';

export async function createHttpRewardBackend(ctx: RewardBackendContext): Promise<RewardBackend> {
  const r = ctx.cfg.reward;
  if (!isRemoteRewardEnabled(r.remote, ctx.env)) return createFunctionRewardBackend(ctx);
  const client = createRemoteRewardClient(r.remote as never, {
    replicaIndex: ctx.replicaIndex,
    log: forStage(ctx.log, 'reward'),
    env: ctx.env,
  });
  return {
    name: 'http:remote',
    score: (items) => client.scoreBatch(items),
    async close() {
      client.close();
    },
    // the client's reward/failures counts failed outcomes over the whole run; the stage's
    // per-step reward/failures (samples left without a reward) keeps that name
    metrics: () =>
      Object.fromEntries(
        Object.entries(client.metrics()).map(([k, v]) => [
          k === 'reward/failures' ? 'reward/remote_failures_total' : k,
          v,
        ]),
      ),
  };
}
