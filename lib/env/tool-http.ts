/**
 * Tool executor: HTTP endpoints, one per tool, JSON over POST (tools in any language):
 *
 *   POST <url>/<tool name> {episode_id, arguments}   → {result: any} or {error: string}
 *
 * With the HTTP environment's handling (http-env.ts postJson): each request has the timeout; no
 * connection, a 5xx or 429 is retried with backoff (max_retries); a 4xx, an answer that is not
 * JSON or has neither `result` nor `error`, a timeout or a server that stays unreachable is the
 * call's error, answered to the model as the tool's message (never the episode's failure).
 */
import { errorMessage } from '../errors.ts';
import { postJson } from './http-env.ts';
import { ToolError, type ToolExecutor } from './tools.ts';

export interface HttpToolOptions {
  url: string;
  timeoutMs: number;
  maxRetries: number;
  backoffMs?: number;
  fetch?: typeof fetch;
}

export function createHttpTools(o: HttpToolOptions): ToolExecutor {
  const base = o.url.replace(/\/+$/, '');
  return {
    name: `http:${base}`,
    async call(tool, args, ctx) {
      let raw: unknown;
      try {
        raw = await postJson({ ...o, url: base }, `/${encodeURIComponent(tool)}`, {
          episode_id: ctx.episode_id,
          arguments: args,
        });
      } catch (e) {
        throw new ToolError(errorMessage(e));
      }
      if (raw !== null && typeof raw === 'object' && !Array.isArray(raw)) {
        const r = raw as Record<string, unknown>;
        if (typeof r.error === 'string') throw new ToolError(r.error);
        if ('result' in r) return r.result;
      }
      throw new ToolError(
        `http:${base}/${tool}: a tool answers {result: …} or {error: "…"}; got ${JSON.stringify(raw)?.slice(0, 200)}`,
      );
    },
  };
}
