/**
 * Environment adapter: the HTTP environment protocol (JSON over POST), so environments can be
 * written in any language (examples/guess-number/env_server.py uses only Python's standard
 * library).
 *
 *   POST <url>/reset {episode_id, row}               → {} (or {messages: []}, ignored)
 *   POST <url>/step  {episode_id, turn, message}     → {messages, reward?, done, metrics?}
 *   POST <url>/close {episode_id}                    → anything (best effort)
 *
 * `turn` counts the assistant messages from 0; a server answers a repeated (episode_id, turn)
 * with the answer it gave (so a retried request is not applied twice), and a repeated reset
 * starts the episode over. Like the reward servers' client: a request that gets no connection,
 * a 5xx or 429 is retried with exponential backoff (max_retries); a 4xx or a body that is not
 * the shape above is a failure at once; each request has the interaction timeout.
 */
import { errorMessage } from '../errors.ts';
import { EnvError, parseStepReply, type EnvEpisode, type EnvRow, type Environment } from './port.ts';

export interface HttpEnvOptions {
  url: string;
  timeoutMs: number;
  maxRetries: number;
  /** First backoff (doubles per retry). */
  backoffMs?: number;
  fetch?: typeof fetch;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * One JSON POST to `<url><path>` with the timeout, retries and failure kinds above (EnvError);
 * the tools' HTTP executor (tool-http.ts) uses it too.
 */
export async function postJson(o: HttpEnvOptions, path: string, body: unknown): Promise<unknown> {
  const base = o.url.replace(/\/+$/, '');
  const name = `http:${base}`;
  const doFetch = o.fetch ?? fetch;
  let last: EnvError | null = null;
  for (let attempt = 0; attempt <= o.maxRetries; attempt++) {
    if (attempt > 0) await sleep((o.backoffMs ?? 100) * 2 ** (attempt - 1));
    let res: Response;
    try {
      res = await doFetch(`${base}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(o.timeoutMs),
      });
    } catch (e) {
      const timedOut = (e as Error).name === 'TimeoutError' || (e as Error).name === 'AbortError';
      last = timedOut
        ? new EnvError('timeout', `${name}${path}: no answer within ${o.timeoutMs} ms`)
        : new EnvError('unreachable', `${name}${path}: ${errorMessage((e as Error).cause ?? e)}`);
      if (timedOut) throw last; // a hung environment is not asked again (its episode fails with the timeout)
      continue;
    }
    let text: string;
    try {
      text = await res.text();
    } catch (e) {
      last = new EnvError('unreachable', `${name}${path}: the answer broke off (${errorMessage(e)})`);
      continue;
    }
    if (res.status >= 500 || res.status === 429) {
      last = new EnvError('crash', `${name}${path}: HTTP ${res.status}: ${text.slice(0, 200)}`, { retriable: true });
      continue;
    }
    if (res.status >= 400)
      throw new EnvError('bad_reply', `${name}${path}: HTTP ${res.status}: ${text.slice(0, 200)}`, {
        retriable: false,
      });
    try {
      return text.trim() === '' ? {} : JSON.parse(text);
    } catch {
      throw new EnvError('bad_reply', `${name}${path}: the answer is not JSON: ${text.slice(0, 200)}`, {
        retriable: false,
      });
    }
  }
  throw new EnvError(last!.kind, `${last!.message} (after ${o.maxRetries + 1} attempts)`, {
    retriable: last!.retriable,
  });
}

export function createHttpEnvironment(o: HttpEnvOptions): Environment {
  const name = `http:${o.url.replace(/\/+$/, '')}`;
  const post = (path: string, body: unknown) => postJson(o, path, body);
  return {
    name,
    async start(row: EnvRow): Promise<EnvEpisode> {
      await post('/reset', { episode_id: row.episode_id, row });
      let turn = 0;
      return {
        async step(message) {
          const raw = await post('/step', { episode_id: row.episode_id, turn: turn++, message });
          return parseStepReply(raw, `${name}/step`);
        },
        async close() {
          await post('/close', { episode_id: row.episode_id }).catch(() => undefined);
        },
      };
    },
    async close() {},
  };
}
