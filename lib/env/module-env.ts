/**
 * Environment adapter: a JS/TS module, loaded like reward.reward_fn_path. It exports
 *   start(row) → state                          (any value; may be a promise)
 *   step(state, assistant_message) → { messages, reward?, done, metrics? }
 * and optionally close(state). `row` is an EnvRow (port.ts); the state object is the module's
 * own (mutate it or return a fresh one in `state` of the step answer). Calls run in the stage's
 * thread with the interaction timeout: an awaited call that never resolves becomes a timeout
 * failure, but a busy loop blocks the stage (use the HTTP adapter to isolate such code).
 */
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { ConfigError, errorMessage } from '../errors.ts';
import {
  EnvError,
  parseStepReply,
  withTimeout,
  type EnvEpisode,
  type EnvRow,
  type EnvStep,
  type Environment,
} from './port.ts';

interface EnvModule {
  start(row: EnvRow): unknown;
  step(state: unknown, message: { role: 'assistant'; content: string }): unknown;
  close?(state: unknown): unknown;
}

export async function loadModuleEnvironment(path: string, opts: { timeoutMs: number }): Promise<Environment> {
  const abs = resolve(path);
  if (!existsSync(abs)) throw new ConfigError(`multi_turn.interaction.path: ${abs} does not exist`);
  let mod: Record<string, unknown>;
  try {
    mod = (await import(pathToFileURL(abs).href)) as Record<string, unknown>;
  } catch (e) {
    throw new ConfigError(`multi_turn.interaction.path: cannot load ${abs} (${errorMessage(e)})`);
  }
  const m = (typeof mod.start === 'function' ? mod : (mod.default as Record<string, unknown> | undefined)) as
    Partial<EnvModule> | undefined;
  if (!m || typeof m.start !== 'function' || typeof m.step !== 'function')
    throw new ConfigError(
      `multi_turn.interaction.path: ${abs} must export start(row) and step(state, assistant_message) (found: ${Object.keys(mod).join(', ') || 'nothing'})`,
    );
  const env = m as EnvModule;
  const name = `module:${path}`;
  const call = async <T>(what: string, f: () => T): Promise<Awaited<T>> => {
    try {
      return await withTimeout(Promise.resolve().then(f), opts.timeoutMs, `${name} ${what}`);
    } catch (e) {
      if (e instanceof EnvError) throw e;
      throw new EnvError('crash', `${name} ${what} threw: ${errorMessage(e)}`, { retriable: false, cause: e });
    }
  };
  return {
    name,
    async start(row: EnvRow): Promise<EnvEpisode> {
      let state = await call('start', () => env.start(row));
      return {
        async step(message): Promise<EnvStep> {
          const raw = await call('step', () => env.step(state, message));
          const out = parseStepReply(raw, `${name} step`);
          if (raw && typeof raw === 'object' && 'state' in raw) state = (raw as { state: unknown }).state;
          return out;
        },
        async close() {
          if (env.close) await call('close', () => env.close!(state)).catch(() => undefined);
        },
      };
    },
    async close() {},
  };
}
