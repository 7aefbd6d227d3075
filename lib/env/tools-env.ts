/**
 * Environment adapter: tools. Wraps an optional inner environment (module or HTTP); every
 * assistant message is parsed for tool calls in the template's format (tool-calls.ts):
 *
 * - with calls: each is run by the executor (at most max_parallel_calls per message, concurrently)
 *   and answered with a `tool` message holding its result; reward 0, not done;
 * - without calls: the inner environment's answer to the message; without an inner environment the
 *   episode is done (the message is the final answer, scored by the reward function).
 *
 * A malformed call, an unknown tool, a call past the limit or a tool's error is answered as a
 * `tool` message `Error: …` and recorded (EnvStep.tools: name, arguments, error, latency), never an
 * episode failure. The inner environment's failures stay episode failures.
 */
import { toolCallParser } from './tool-calls.ts';
import { ToolError, toolResultText, type ToolExecutor } from './tools.ts';
import type { EnvEpisode, EnvMessage, EnvRow, EnvStep, Environment, ToolCallRecord } from './port.ts';

export interface ToolsEnvOptions {
  format: string;
  executor: ToolExecutor;
  /** The tools the policy is shown (their schemas' names); a call to another is answered with an error. */
  tools: readonly string[];
  inner: Environment | null;
  /** Calls run per assistant message at most; the rest are answered with an error. */
  maxParallelCalls: number;
  now?: () => number;
}

export function createToolsEnvironment(o: ToolsEnvOptions): Environment {
  const parse = toolCallParser(o.format);
  const now = o.now ?? (() => performance.now());
  return {
    name: `tools:${o.executor.name}${o.inner ? `+${o.inner.name}` : ''}`,
    async start(row: EnvRow): Promise<EnvEpisode> {
      const inner = o.inner ? await o.inner.start(row) : null;
      return {
        async step(message): Promise<EnvStep> {
          const p = parse(message.content);
          if (p.calls.length === 0 && p.malformed.length === 0) {
            if (inner) return inner.step(message);
            return { messages: [], reward: 0, done: true, metrics: {} };
          }
          const run = async (c: (typeof p.calls)[number], i: number) => {
            const t0 = now();
            const args = JSON.stringify(c.arguments);
            if (!o.tools.includes(c.name)) {
              const error = `unknown tool "${c.name}" (tools: ${o.tools.join(', ')})`;
              return { name: c.name, args, text: `Error: ${error}`, error, latency: 0 };
            }
            if (i >= o.maxParallelCalls) {
              const error = `only ${o.maxParallelCalls} tool call(s) per message are run; this one was not`;
              return { name: c.name, args, text: `Error: ${error}`, error, latency: 0 };
            }
            try {
              const v = await o.executor.call(c.name, c.arguments, { episode_id: row.episode_id });
              return { name: c.name, args, text: toolResultText(v), error: null, latency: now() - t0 };
            } catch (e) {
              if (!(e instanceof ToolError)) throw e;
              return { name: c.name, args, text: `Error: ${e.message}`, error: e.message, latency: now() - t0 };
            }
          };
          const done = await Promise.all(p.calls.map(run));
          const messages: EnvMessage[] = [];
          const tools: ToolCallRecord[] = [];
          for (const d of done) {
            tools.push({
              message: messages.length,
              name: d.name,
              arguments: d.args,
              error: d.error,
              latency_ms: d.latency,
            });
            messages.push({ role: 'tool', name: d.name, content: d.text });
          }
          for (const m of p.malformed) {
            const error = `malformed tool call: ${m.reason}`;
            tools.push({ message: messages.length, name: null, arguments: m.text, error, latency_ms: 0 });
            messages.push({ role: 'tool', content: `Error: ${error}` });
          }
          return { messages, reward: 0, done: false, metrics: {}, tools };
        },
        async close() {
          await inner?.close();
        },
      };
    },
    async close() {
      await o.inner?.close();
    },
  };
}
