/**
 * The reward server: node:http speaking the `/score` protocol.
 *
 *   POST /score   {"image"?: "<base64 PNG>", "prompt": "<text>", "response"?, "ground_truth"?, "id"?, …}
 *              → 200 {"vlm_score": 0.85, "ocr_confidence": 0.92, …}   (whatever the scorer returns)
 *   POST /score   {"items": [ <request>, … ]}  (batch form, ≤ max_batch items)
 *              → 200 {"results": [ <result>, … ]}
 *   GET  /healthz → 200 {"status": "ok", …}; 503 {"status": "draining"} while shutting down
 *
 * Bad input gets 400 `{"error": "<what is wrong and where>"}` (not JSON, zod validation, invalid
 * base64, not a PNG); a body over the limit gets 413; a scorer that throws or returns non-finite
 * numbers gets 500. The server keeps serving after any of these. `close()` stops accepting, lets
 * in-flight requests finish (up to a grace period) and then closes every connection.
 */
import { readBody } from '../http/body.ts';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from 'pino';
import { z } from 'zod';
import { silentLogger } from '../log.ts';
import { invalidResult, type ScoreRequest, type Scorer } from './scorer.ts';

export interface RewardServerOptions {
  scorer: Scorer;
  host: string;
  /** 0 = an ephemeral port. */
  port: number;
  maxBodyBytes: number;
  maxBatch: number;
  /** A logger, or one made once the port is known (per-port log files with `--port 0`). */
  log: Logger | ((port: number) => Logger);
}

export interface RewardServer {
  url: string;
  port: number;
  inFlight(): number;
  /** Graceful stop; resolves true when every in-flight request finished within `graceMs`. */
  close(graceMs: number): Promise<boolean>;
}

const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

const itemSchema = z.looseObject({
  prompt: z.string({
    error: (iss) => (iss.input === undefined ? 'is required (a string)' : `must be a string, got ${typeof iss.input}`),
  }),
  image: z.string({ error: 'must be a base64-encoded PNG string' }).optional(),
  response: z.string({ error: 'must be a string' }).optional(),
  ground_truth: z.string({ error: 'must be a string' }).optional(),
  id: z.union([z.string(), z.number()], { error: 'must be a string or a number' }).optional(),
});
type Item = z.infer<typeof itemSchema>;

function batchSchema(maxBatch: number) {
  return z.strictObject({
    items: z
      .array(itemSchema, { error: 'must be an array of requests' })
      .min(1, { error: 'must not be empty' })
      .max(maxBatch, { error: `has more than ${maxBatch} requests (the server's --max-batch)` }),
  });
}

/** Base64 (standard alphabet, padded; whitespace and a `data:image/png;base64,` prefix allowed) → bytes, or null. */
export function decodeBase64Strict(s: string): Buffer | null {
  const t = s.replace(/^data:image\/png;base64,/, '').replace(/\s+/g, '');
  if (t.length === 0 || t.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(t)) return null;
  return Buffer.from(t, 'base64');
}

function zodReason(err: z.ZodError, prefix: string): string {
  return err.issues
    .slice(0, 5)
    .map((i) => {
      const path = [prefix, ...i.path.map(String)].filter(Boolean).join('.');
      return `${path || 'body'}: ${i.message}`;
    })
    .join('; ');
}

class BadRequest extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** The client closed the connection before sending the whole body (e.g. it timed out). */
class ClientGone extends Error {}

function toScoreRequest(item: Item, where: string): ScoreRequest {
  const { prompt, image, response, ground_truth, id, ...extra } = item;
  let png: Buffer | undefined;
  if (image !== undefined) {
    const bytes = decodeBase64Strict(image);
    if (!bytes)
      throw new BadRequest(
        400,
        `${where}image: not valid base64 (expected the standard alphabet A–Z a–z 0–9 + / with = padding)`,
      );
    if (bytes.length < PNG_SIGNATURE.length || !bytes.subarray(0, PNG_SIGNATURE.length).equals(PNG_SIGNATURE))
      throw new BadRequest(
        400,
        `${where}image: decodes to ${bytes.length} bytes that are not a PNG (missing the PNG signature)`,
      );
    png = bytes;
  }
  return { prompt, response, ground_truth, id, image: png, extra };
}

export async function startRewardServer(opts: RewardServerOptions): Promise<RewardServer> {
  const { scorer } = opts;
  let log: Logger = typeof opts.log === 'function' ? silentLogger() : opts.log;
  const batch = batchSchema(opts.maxBatch);
  let inFlight = 0;
  let draining = false;
  const stats = { requests: 0, bad_requests: 0, scorer_errors: 0 };
  let idleWaiters: (() => void)[] = [];

  const send = (res: http.ServerResponse, status: number, body: unknown, extraHeaders: Record<string, string> = {}) => {
    if (res.headersSent || res.destroyed) return;
    const text = JSON.stringify(body);
    res.writeHead(status, {
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(text),
      ...(draining ? { connection: 'close' } : {}),
      ...extraHeaders,
    });
    res.end(text);
  };

  async function handleScore(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const t0 = performance.now();
    let raw: Buffer;
    try {
      raw = await readBody(
        req,
        opts.maxBodyBytes,
        (m) => new BadRequest(413, m),
        (m) => new ClientGone(m),
      );
    } catch (e) {
      if (e instanceof BadRequest) {
        stats.bad_requests++;
        log.warn({ status: e.status, reason: e.message }, 'rejected /score request');
        // Answer, then close this connection: the rest of the oversize body is not read.
        send(res, e.status, { error: e.message }, { connection: 'close' });
        req.resume();
        return;
      }
      if (e instanceof ClientGone) {
        log.info({ reason: e.message }, 'client went away');
        return;
      }
      throw e;
    }
    let reqs: ScoreRequest[];
    let isBatch: boolean;
    try {
      let value: unknown;
      try {
        value = JSON.parse(raw.toString('utf8'));
      } catch (e) {
        throw new BadRequest(400, `body is not valid JSON: ${(e as Error).message}`);
      }
      if (value === null || typeof value !== 'object' || Array.isArray(value))
        throw new BadRequest(
          400,
          'body must be a JSON object like {"prompt": "...", "image": "<base64 PNG>"} or {"items": [...]}',
        );
      isBatch = 'items' in value;
      if (isBatch) {
        const p = batch.safeParse(value);
        if (!p.success) throw new BadRequest(400, zodReason(p.error, ''));
        reqs = p.data.items.map((it, i) => toScoreRequest(it, `items.${i}.`));
      } else {
        const p = itemSchema.safeParse(value);
        if (!p.success) throw new BadRequest(400, zodReason(p.error, ''));
        reqs = [toScoreRequest(p.data, '')];
      }
    } catch (e) {
      if (!(e instanceof BadRequest)) throw e;
      stats.bad_requests++;
      log.warn({ status: e.status, reason: e.message }, 'rejected /score request');
      send(res, e.status, { error: e.message });
      return;
    }
    let results: unknown[];
    try {
      results = await scorer.score(reqs);
      if (!Array.isArray(results) || results.length !== reqs.length)
        throw new Error(
          `returned ${Array.isArray(results) ? results.length : typeof results} results for ${reqs.length} requests`,
        );
      for (let i = 0; i < results.length; i++) {
        const why = invalidResult(results[i]);
        if (why) throw new Error(`invalid result${isBatch ? ` for items.${i}` : ''}: ${why}`);
      }
    } catch (e) {
      stats.scorer_errors++;
      const msg = `scorer failed: ${(e as Error)?.message ?? String(e)}`;
      log.error({ err: e, count: reqs.length }, msg);
      send(res, 500, { error: msg });
      return;
    }
    if (res.destroyed)
      log.info({ ms: performance.now() - t0 }, 'client went away before the result was sent (timed out?)');
    send(res, 200, isBatch ? { results } : results[0]);
    log.debug({ ms: Math.round((performance.now() - t0) * 100) / 100, count: reqs.length }, 'scored');
  }

  const server = http.createServer((req, res) => {
    stats.requests++;
    const path = (req.url ?? '/').split('?')[0];
    if (path === '/healthz') {
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        send(res, 405, { error: `${req.method} /healthz is not supported; use GET` }, { allow: 'GET, HEAD' });
        return;
      }
      if (draining) {
        send(res, 503, { status: 'draining', in_flight: inFlight });
        return;
      }
      send(res, 200, {
        status: 'ok',
        scorer: scorer.name,
        in_flight: inFlight,
        batch: true,
        max_batch: opts.maxBatch,
        max_body_bytes: opts.maxBodyBytes,
        ...stats,
      });
      return;
    }
    if (path !== '/score') {
      send(res, 404, { error: `no such endpoint ${path}; use POST /score or GET /healthz` });
      return;
    }
    if (req.method !== 'POST') {
      send(res, 405, { error: `${req.method} /score is not supported; use POST` }, { allow: 'POST' });
      return;
    }
    if (draining) {
      send(res, 503, { error: 'server is shutting down' }, { 'retry-after': '1' });
      req.resume();
      return;
    }
    inFlight++;
    handleScore(req, res)
      .catch((e) => {
        log.error({ err: e }, 'unexpected error while handling /score');
        send(res, 500, { error: `internal error: ${(e as Error)?.message ?? String(e)}` });
      })
      .finally(() => {
        inFlight--;
        if (inFlight === 0) {
          const w = idleWaiters;
          idleWaiters = [];
          w.forEach((f) => f());
        }
      });
  });
  server.keepAliveTimeout = 65_000;
  server.headersTimeout = 66_000;

  await new Promise<void>((resolve, reject) => {
    const onError = (e: Error) => reject(e);
    server.once('error', onError);
    server.listen(opts.port, opts.host, () => {
      server.off('error', onError);
      resolve();
    });
  });
  server.on('error', (e) => log.error({ err: e }, 'server error'));
  const port = (server.address() as AddressInfo).port;
  if (typeof opts.log === 'function') log = opts.log(port);
  const hostForUrl = opts.host.includes(':') ? `[${opts.host}]` : opts.host;

  return {
    url: `http://${hostForUrl}:${port}`,
    port,
    inFlight: () => inFlight,
    async close(graceMs) {
      if (draining) return inFlight === 0;
      draining = true;
      const closed = new Promise<void>((r) => server.close(() => r()));
      server.closeIdleConnections();
      let clean = true;
      if (inFlight > 0) {
        log.info({ in_flight: inFlight, grace_ms: graceMs }, 'draining: waiting for in-flight requests');
        clean = await new Promise<boolean>((resolve) => {
          const t = setTimeout(() => resolve(false), graceMs);
          idleWaiters.push(() => {
            clearTimeout(t);
            resolve(true);
          });
        });
        if (!clean)
          log.warn(
            { in_flight: inFlight },
            `draining: ${inFlight} request(s) still in flight after ${graceMs} ms; closing their connections`,
          );
      }
      // Responses just sent have been flushed to their sockets; drop what is left.
      server.closeIdleConnections();
      setTimeout(() => server.closeAllConnections(), clean ? 50 : 0).unref();
      await closed;
      await scorer.close?.();
      return clean;
    },
  };
}
