/**
 * The reward backends by `reward.type`. The registry holds one loader per name of REWARD_TYPES
 * (types.ts, the list the config schema's enum is): a name missing here, or one not in that list,
 * fails the typecheck. Each loader imports its adapter on use, so naming the backends costs no
 * import of onnxruntime or the HTTP client; an unknown name lists the valid ones.
 */
import { Registry } from '../util/registry.ts';
import type { RewardType } from './types.ts';
import type { RewardBackend, RewardBackendContext, RewardBackendFactory } from './port.ts';

type Loader = () => Promise<RewardBackendFactory>;

const LOADERS: Record<RewardType, Loader> = {
  function: async () => (await import('./function-backend.ts')).createFunctionRewardBackend,
  remote: async () => (await import('./http-backend.ts')).createHttpRewardBackend,
  model: async () => (await import('./onnx-backend.ts')).createOnnxRewardBackend,
};

export const rewardBackends = new Registry<Loader>('reward.type', LOADERS);

/** The backend of `ctx.cfg.reward.type` (or of `type`, to build another one for the same run). */
export async function createRewardBackend(
  ctx: RewardBackendContext,
  type: string = ctx.cfg.reward.type,
): Promise<RewardBackend> {
  const factory = await rewardBackends.get(type)();
  return factory(ctx);
}
