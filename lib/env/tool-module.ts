/**
 * Tool executor: a JS/TS module, loaded like reward.reward_fn_path, that exports one function per
 * tool, named as the tool: `export function calc(args, ctx) { … }` (args = the call's arguments
 * object, ctx = {episode_id}; may return a promise). A thrown error or a call past the timeout is
 * the tool's error (answered to the model); a busy loop blocks the stage's thread (use HTTP tools
 * for code you do not trust).
 */
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { ConfigError, errorMessage } from '../errors.ts';
import { withTimeout } from './port.ts';
import { ToolError, type ToolExecutor } from './tools.ts';

type ToolFn = (args: Record<string, unknown>, ctx: { episode_id: string }) => unknown;

export async function loadModuleTools(
  path: string,
  toolNames: readonly string[],
  opts: { timeoutMs: number },
): Promise<ToolExecutor> {
  const abs = resolve(path);
  if (!existsSync(abs)) throw new ConfigError(`multi_turn.tool_executor.path: ${abs} does not exist`);
  let mod: Record<string, unknown>;
  try {
    mod = (await import(pathToFileURL(abs).href)) as Record<string, unknown>;
  } catch (e) {
    throw new ConfigError(`multi_turn.tool_executor.path: cannot load ${abs} (${errorMessage(e)})`);
  }
  const fns = new Map<string, ToolFn>();
  const missing: string[] = [];
  for (const n of toolNames) {
    const f = mod[n] ?? (mod.default as Record<string, unknown> | undefined)?.[n];
    if (typeof f === 'function') fns.set(n, f as ToolFn);
    else missing.push(n);
  }
  if (missing.length)
    throw new ConfigError(
      `multi_turn.tool_executor.path: ${abs} must export a function per tool; missing: ${missing.join(', ')} (exports: ${Object.keys(mod).join(', ') || 'nothing'})`,
    );
  const name = `module:${path}`;
  return {
    name,
    async call(tool, args, ctx) {
      const f = fns.get(tool);
      if (!f) throw new ToolError(`unknown tool "${tool}" (tools: ${[...fns.keys()].join(', ')})`);
      try {
        return await withTimeout(
          Promise.resolve().then(() => f(args, ctx)),
          opts.timeoutMs,
          `tool ${tool}`,
        );
      } catch (e) {
        throw new ToolError(errorMessage(e));
      }
    },
  };
}
