/**
 * The HTTP layer of the reward client: one request → `{status, body}` or a thrown RlError whose
 * `retriable` flag says whether another attempt may help (timeouts, refused/reset connections).
 * Two implementations with the same contract:
 *  - `nodeHttpTransport()`: node:http(s) with keep-alive agents (the default: measured to add less
 *    latency per request than undici's fetch, see bench/reward.ts);
 *  - `fetchTransport(fetch)`: WHATWG fetch (Node's global undici fetch, or an injected one in tests).
 */
import http from 'node:http';
import https from 'node:https';
import { RlError, TransientError } from '../errors.ts';

export interface TransportRequest {
  url: string;
  method: 'GET' | 'POST';
  headers: Record<string, string>;
  body?: string;
  timeoutMs: number;
}

export interface TransportResponse {
  status: number;
  /** `Retry-After`, when the server sent one. */
  retryAfter?: string;
  body: string;
}

export interface Transport {
  request(req: TransportRequest): Promise<TransportResponse>;
  close(): void;
}

/** Responses larger than this are cut off and reported as malformed (a reward is a few numbers). */
export const MAX_RESPONSE_BYTES = 8 * 1024 * 1024;

function timeoutError(url: string, ms: number): TransientError {
  return new TransientError(`no response within ${ms} ms (timeout)`, { code: 'ETIMEDOUT', details: { url } });
}

/** A network-level failure (no HTTP response at all): always worth another attempt. */
function networkError(err: unknown): RlError {
  const e = err as { code?: string; message?: string; cause?: { code?: string; message?: string } };
  const code = e?.cause?.code ?? e?.code ?? 'ENETWORK';
  const detail = e?.cause?.message ?? e?.message ?? String(err);
  return new TransientError(`connection failed: ${code}${detail && !detail.includes(code) ? ` (${detail})` : ''}`, {
    code,
    cause: err,
  });
}

export function nodeHttpTransport(opts: { maxSockets?: number } = {}): Transport {
  const agentOpts = {
    keepAlive: true,
    keepAliveMsecs: 1000,
    maxSockets: opts.maxSockets ?? 256,
    scheduling: 'lifo' as const,
  };
  const httpAgent = new http.Agent(agentOpts);
  const httpsAgent = new https.Agent(agentOpts);

  const once = (req: TransportRequest, u: URL): Promise<TransportResponse> =>
    new Promise((resolve, reject) => {
      const isHttps = u.protocol === 'https:';
      const headers: Record<string, string | number> = { ...req.headers };
      const payload = req.body !== undefined ? Buffer.from(req.body, 'utf8') : undefined;
      if (payload) headers['content-length'] = payload.length;
      let settled = false;
      const finish = (fn: () => void) => {
        if (!settled) {
          settled = true;
          clearTimeout(timer);
          fn();
        }
      };
      const r = (isHttps ? https : http).request(
        u,
        { method: req.method, headers, agent: isHttps ? httpsAgent : httpAgent },
        (res) => {
          const chunks: Buffer[] = [];
          let size = 0;
          res.on('data', (c: Buffer) => {
            size += c.length;
            if (size > MAX_RESPONSE_BYTES) {
              r.destroy();
              finish(() =>
                resolve({
                  status: res.statusCode ?? 0,
                  body: `${Buffer.concat(chunks).toString('utf8')}… (response larger than ${MAX_RESPONSE_BYTES} bytes, cut off)`,
                }),
              );
              return;
            }
            chunks.push(c);
          });
          res.on('end', () =>
            finish(() =>
              resolve({
                status: res.statusCode ?? 0,
                retryAfter: header(res.headers['retry-after']),
                body: Buffer.concat(chunks).toString('utf8'),
              }),
            ),
          );
          res.on('error', (e) => finish(() => reject(networkError(e))));
          res.on('close', () => {
            if (!res.complete)
              finish(() =>
                reject(
                  networkError(
                    Object.assign(new Error('connection closed before the response was complete'), {
                      code: 'ECONNRESET',
                    }),
                  ),
                ),
              );
          });
        },
      );
      const timer = setTimeout(() => {
        finish(() => reject(timeoutError(req.url, req.timeoutMs)));
        r.destroy();
      }, req.timeoutMs);
      r.on('error', (e: Error & { code?: string }) => {
        // A keep-alive socket closed by the server just as we reused it: Node's documented retry case.
        if (!settled && r.reusedSocket && e.code === 'ECONNRESET') {
          finish(() => reject(Object.assign(e, { staleSocket: true })));
          return;
        }
        finish(() => reject(networkError(e)));
      });
      r.end(payload);
    });

  return {
    async request(req) {
      let u: URL;
      try {
        u = new URL(req.url);
      } catch {
        throw new RlError(`invalid URL ${req.url}`, { code: 'ERR_CONFIG' });
      }
      try {
        return await once(req, u);
      } catch (e) {
        if ((e as { staleSocket?: boolean }).staleSocket) {
          try {
            return await once(req, u);
          } catch (e2) {
            throw (e2 as { staleSocket?: boolean }).staleSocket ? networkError(e2) : e2;
          }
        }
        throw e;
      }
    },
    close() {
      httpAgent.destroy();
      httpsAgent.destroy();
    },
  };
}

function header(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

export type FetchLike = (
  url: string,
  init: { method: string; headers: Record<string, string>; body?: string; signal: AbortSignal },
) => Promise<{ status: number; headers: { get(name: string): string | null }; text(): Promise<string> }>;

export function fetchTransport(fetchImpl: FetchLike): Transport {
  return {
    async request(req) {
      const ac = new AbortController();
      const timer = setTimeout(() => ac.abort(), req.timeoutMs);
      try {
        const res = await fetchImpl(req.url, {
          method: req.method,
          headers: req.headers,
          body: req.body,
          signal: ac.signal,
        });
        const text = await res.text();
        const body =
          text.length > MAX_RESPONSE_BYTES
            ? `${text.slice(0, MAX_RESPONSE_BYTES)}… (response larger than ${MAX_RESPONSE_BYTES} bytes, cut off)`
            : text;
        return { status: res.status, retryAfter: res.headers.get('retry-after') ?? undefined, body };
      } catch (e) {
        if (ac.signal.aborted) throw timeoutError(req.url, req.timeoutMs);
        if (e instanceof RlError) throw e;
        throw networkError(e);
      } finally {
        clearTimeout(timer);
      }
    },
    close() {
      /* fetch's global dispatcher is shared; nothing to release */
    },
  };
}
