/**
 * Environments by config: `rollout.multi_turn.interaction.type` names the adapter (one list,
 * ENV_TYPES; an unknown name lists the valid ones).
 */
import { ConfigError } from '../errors.ts';
import { createHttpEnvironment } from './http-env.ts';
import { loadModuleEnvironment } from './module-env.ts';
import type { Environment } from './port.ts';
import { loadModuleTools } from './tool-module.ts';
import { createHttpTools } from './tool-http.ts';
import { loadToolSchemas, type ToolExecutor, type ToolSchema } from './tools.ts';
import { createToolsEnvironment } from './tools-env.ts';

export * from './port.ts';
export { loadToolSchemas, type ToolSchema } from './tools.ts';
export { TOOL_CALL_FORMATS, toolCallParser, formatToolCall } from './tool-calls.ts';

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

export interface ToolExecutorConfig {
  type: string;
  path: string | null;
  url: string | null;
  timeout_s: number;
  max_retries: number;
}

const TOOL_EXECUTORS: Record<string, (c: ToolExecutorConfig, names: string[]) => Promise<ToolExecutor>> = {
  module: async (c, names) => {
    if (!c.path) throw new ConfigError('multi_turn.tool_executor.type = module needs multi_turn.tool_executor.path');
    return loadModuleTools(c.path, names, { timeoutMs: c.timeout_s * 1000 });
  },
  http: async (c) => {
    if (!c.url) throw new ConfigError('multi_turn.tool_executor.type = http needs multi_turn.tool_executor.url');
    return createHttpTools({ url: c.url, timeoutMs: c.timeout_s * 1000, maxRetries: c.max_retries });
  },
};

export const TOOL_EXECUTOR_TYPES = Object.keys(TOOL_EXECUTORS) as readonly string[];

export interface MultiTurnEnvConfig {
  interaction: InteractionConfig;
  format: string;
  tool_config_path: string | null;
  tools: readonly unknown[];
  max_parallel_calls: number;
  tool_executor: ToolExecutorConfig;
}

/** Whether the run's episodes have an environment of their own (interaction.path or url set). */
export function hasInteraction(c: InteractionConfig): boolean {
  return c.type === 'module' ? c.path !== null : c.url !== null;
}

/**
 * The environment of a multi-turn run: the interaction, wrapped by the tools environment when
 * tools are configured (then the interaction is optional: without it an episode ends at the
 * first message without a tool call).
 */
export async function createMultiTurnEnvironment(c: MultiTurnEnvConfig): Promise<Environment> {
  const schemas: ToolSchema[] = loadToolSchemas(c);
  if (schemas.length === 0) return createEnvironment(c.interaction);
  const inner = hasInteraction(c.interaction) ? await createEnvironment(c.interaction) : null;
  const make = TOOL_EXECUTORS[c.tool_executor.type];
  if (!make)
    throw new ConfigError(
      `unknown multi_turn.tool_executor.type "${c.tool_executor.type}" (valid: ${TOOL_EXECUTOR_TYPES.join(', ')})`,
    );
  const names = schemas.map((s) => s.function.name);
  return createToolsEnvironment({
    format: c.format,
    executor: await make(c.tool_executor, names),
    tools: names,
    inner,
    maxParallelCalls: c.max_parallel_calls,
  });
}
