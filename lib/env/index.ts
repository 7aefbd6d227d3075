/**
 * Environments by config: `rollout.multi_turn.interaction.type` names the adapter (one list,
 * ENV_TYPES; an unknown name lists the valid ones).
 */
import { ConfigError } from '../errors.ts';
import { createHttpEnvironment } from './http-env.ts';
import { loadModuleEnvironment } from './module-env.ts';
import type { Environment } from './port.ts';

export * from './port.ts';

export interface InteractionConfig {
  type: string;
  path: string | null;
  url: string | null;
  timeout_s: number;
  max_retries: number;
}

const ADAPTERS: Record<string, (c: InteractionConfig) => Promise<Environment>> = {
  module: async (c) => {
    if (!c.path) throw new ConfigError('multi_turn.interaction.type = module needs multi_turn.interaction.path');
    return loadModuleEnvironment(c.path, { timeoutMs: c.timeout_s * 1000 });
  },
  http: async (c) => {
    if (!c.url) throw new ConfigError('multi_turn.interaction.type = http needs multi_turn.interaction.url');
    return createHttpEnvironment({ url: c.url, timeoutMs: c.timeout_s * 1000, maxRetries: c.max_retries });
  },
};

export const ENV_TYPES = Object.keys(ADAPTERS) as readonly string[];

export async function createEnvironment(c: InteractionConfig): Promise<Environment> {
  const make = ADAPTERS[c.type];
  if (!make) throw new ConfigError(`unknown multi_turn.interaction.type "${c.type}" (valid: ${ENV_TYPES.join(', ')})`);
  return make(c);
}
