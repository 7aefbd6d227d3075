/**
 * The `openai` generation engine: OpenAI-compatible HTTP servers (rlstream serve-policy, vLLM,
 * SGLang) sample the rollout's responses.
 *
 * Per sequence one `POST /v1/completions` with the prompt as token ids, `max_tokens`, the
 * sampling settings, `stop_token_ids`, `logprobs: 0` and `return_token_ids: true`; `request_id`
 * is the sample id and `seed` a 31-bit hash of (run seed, sample id), so every sample has its own
 * random stream on any engine; `rlstream_seed` (the run seed) lets serve-policy draw exactly what
 * the in-process sampler draws. Before a server samples with policy version v it is told to load
 * v's directory (SGLang's `POST /update_weights_from_disk {model_path, weight_version}`), once per
 * version per server, again after the server failed (a restarted server lost it). A response that
 * names another `policy_version` (the server was moved on by someone else) is reloaded and retried.
 *
 * Routing and faults, as the reward servers' client: least-outstanding healthy server, at most
 * `concurrency_per_server` requests each; connection errors, timeouts, 429 and 5xx are retried
 * up to `max_retries` times with exponential backoff, on another server when one is up; a server
 * that failed is avoided for `cooldown_ms`. Other 4xx are final (a non-retriable RlError naming
 * the server's message). When every try failed the call throws a retriable error: the rollout
 * stage retries the batch, so a step completes once an engine is back and nothing is lost.
 */
import { createHash } from 'node:crypto';
import { RlError, TransientError } from '../errors.ts';
import type { Generation, GenerationRequest, SamplingParamsInput } from '../model/sample.ts';
import { nodeHttpTransport, type Transport } from '../reward/transport.ts';
import type { EnginePolicy, GenerationEngine } from './engine-port.ts';

export interface OpenAIEngineOptions {
  urls: readonly string[];
  /** The `model` to request; null = the first of the server's GET /v1/models. */
  model: string | null;
  timeoutMs: number;
  maxRetries: number;
  concurrencyPerServer: number;
  cooldownMs: number;
  /** Send `update_weights_from_disk` before each new version (false: the server follows the run itself). */
  reload: boolean;
  /** Bearer token (vLLM --api-key). */
  apiKey?: string | null;
  transport?: Transport;
  sleep?: (ms: number) => Promise<void>;
}

interface Server {
  url: string;
  outstanding: number;
  downUntil: number;
  loaded: number | null;
  loading: Promise<void> | null;
  waiters: Array<() => void>;
}

/** A 31-bit seed per sample (vLLM and SGLang take an int seed per request). */
export function sampleSeed(seed: number | string, id: string): number {
  return createHash('sha256').update(`${seed}:${id}`).digest().readUInt32BE(0) & 0x7fffffff;
}

export class OpenAIEngine implements GenerationEngine {
  readonly name = 'openai';
  private readonly servers: Server[];
  private readonly transport: Transport;
  private readonly sleep: (ms: number) => Promise<void>;
  private model: string | null;

  constructor(private readonly o: OpenAIEngineOptions) {
    if (!o.urls.length) throw new RlError('rollout.openai.urls: give at least one engine URL', { code: 'ERR_CONFIG' });
    this.servers = o.urls.map((u) => ({
      url: u.replace(/\/+$/, '').replace(/\/v1$/, ''),
      outstanding: 0,
      downUntil: 0,
      loaded: null,
      loading: null,
      waiters: [],
    }));
    this.transport = o.transport ?? nodeHttpTransport();
    this.sleep = o.sleep ?? ((ms) => new Promise((r) => setTimeout(r, ms)));
    this.model = o.model;
  }

  async generate(
    policy: EnginePolicy,
    requests: readonly GenerationRequest[],
    params: SamplingParamsInput,
  ): Promise<Generation[]> {
    if (requests.some((r) => r.images?.length))
      throw new RlError('rollout.engine = openai does not send images; use rollout.engine = onnx for a vision policy', {
        code: 'ERR_CONFIG',
      });
    return Promise.all(requests.map((r) => this.one(policy, r, params)));
  }

  private headers(): Record<string, string> {
    return {
      'content-type': 'application/json',
      ...(this.o.apiKey ? { authorization: `Bearer ${this.o.apiKey}` } : {}),
    };
  }

  /** The healthy server with the fewest requests in flight that has room (waits for room). */
  private async acquire(avoid: Set<Server>): Promise<Server> {
    for (;;) {
      const now = Date.now();
      const up = this.servers.filter((s) => s.downUntil <= now);
      const pool = up.filter((s) => !avoid.has(s)).length
        ? up.filter((s) => !avoid.has(s))
        : up.length
          ? up
          : this.servers;
      const best = pool.reduce((a, b) => (b.outstanding < a.outstanding ? b : a));
      if (best.outstanding < this.o.concurrencyPerServer) {
        best.outstanding++;
        return best;
      }
      await new Promise<void>((r) => best.waiters.push(r));
    }
  }

  private release(s: Server): void {
    s.outstanding--;
    s.waiters.shift()?.();
  }

  private fail(s: Server): void {
    s.downUntil = Date.now() + this.o.cooldownMs;
    s.loaded = null;
  }

  private async post(s: Server, path: string, body: unknown): Promise<{ status: number; json: unknown; text: string }> {
    const res = await this.transport.request({
      url: s.url + path,
      method: 'POST',
      headers: this.headers(),
      body: JSON.stringify(body),
      timeoutMs: this.o.timeoutMs,
    });
    let json: unknown = null;
    try {
      json = JSON.parse(res.body);
    } catch {
      json = null;
    }
    return { status: res.status, json, text: res.body };
  }

  private async ensureModel(s: Server): Promise<string> {
    if (this.model) return this.model;
    const res = await this.transport.request({
      url: s.url + '/v1/models',
      method: 'GET',
      headers: this.headers(),
      timeoutMs: this.o.timeoutMs,
    });
    const id = (JSON.parse(res.body) as { data?: Array<{ id?: string }> })?.data?.[0]?.id;
    if (res.status !== 200 || typeof id !== 'string')
      throw new TransientError(`${s.url}/v1/models: no model listed (status ${res.status})`);
    this.model = id;
    return id;
  }

  private async ensureVersion(s: Server, policy: EnginePolicy): Promise<void> {
    if (!this.o.reload || s.loaded === policy.version) return;
    if (!s.loading)
      s.loading = (async () => {
        const dir = await policy.dir();
        const r = await this.post(s, '/update_weights_from_disk', {
          model_path: dir,
          weight_version: String(policy.version),
        });
        const ok = r.status === 200 && (r.json as { success?: boolean })?.success !== false;
        if (!ok) {
          const msg = `${s.url}/update_weights_from_disk ${dir}: status ${r.status}: ${r.text.slice(0, 300)}`;
          if (r.status >= 500 || r.status === 429) throw new TransientError(msg);
          throw new RlError(`${msg} (is the engine's file system the run's? see docs/inference.md)`, {
            code: 'ERR_ENGINE_RELOAD',
          });
        }
        s.loaded = policy.version;
      })().finally(() => (s.loading = null));
    await s.loading;
    if (s.loaded !== policy.version) await this.ensureVersion(s, policy);
  }

  private async one(policy: EnginePolicy, req: GenerationRequest, params: SamplingParamsInput): Promise<Generation> {
    const seed = params.seed ?? 0;
    const topK = params.topK ?? 0;
    const avoid = new Set<Server>();
    let last: unknown = null;
    for (let attempt = 0; attempt <= this.o.maxRetries; attempt++) {
      if (attempt > 0) await this.sleep(Math.min(5000, 100 * 2 ** (attempt - 1)) * (0.5 + Math.random() / 2));
      const s = await this.acquire(avoid);
      try {
        await this.ensureVersion(s, policy);
        const model = await this.ensureModel(s);
        const r = await this.post(s, '/v1/completions', {
          model,
          prompt: Array.from(req.prompt),
          n: 1,
          max_tokens: params.maxNewTokens,
          temperature: params.temperature ?? 1,
          top_p: params.topP ?? 1,
          top_k: topK > 0 ? topK : -1,
          seed: sampleSeed(seed, req.id),
          rlstream_seed: seed,
          request_id: req.id,
          ...(params.eosTokenIds ? { stop_token_ids: params.eosTokenIds } : {}),
          logprobs: 0,
          return_token_ids: true,
          skip_special_tokens: false,
        });
        if (r.status === 429 || r.status >= 500 || r.status === 408)
          throw new TransientError(`${s.url}: status ${r.status}: ${r.text.slice(0, 300)}`);
        if (r.status !== 200)
          throw new RlError(`${s.url}/v1/completions for ${req.id}: status ${r.status}: ${r.text.slice(0, 300)}`, {
            code: 'ERR_ENGINE_REQUEST',
          });
        const body = r.json as {
          policy_version?: number;
          choices?: Array<{ token_ids?: number[]; logprobs?: { token_logprobs?: number[] }; finish_reason?: string }>;
        };
        if (this.o.reload && typeof body?.policy_version === 'number' && body.policy_version !== policy.version) {
          s.loaded = null; // moved on by another client: load ours again
          throw new TransientError(
            `${s.url} answered with policy version ${body.policy_version}, wanted ${policy.version}`,
          );
        }
        const ch = body?.choices?.[0];
        const tokens = ch?.token_ids;
        const lps = ch?.logprobs?.token_logprobs;
        if (!Array.isArray(tokens) || !Array.isArray(lps) || tokens.length !== lps.length || !tokens.length)
          throw new TransientError(
            `${s.url}: the completion for ${req.id} lacks token_ids and logprobs.token_logprobs of equal length (vLLM needs a version with return_token_ids)`,
          );
        return {
          id: req.id,
          tokens: Int32Array.from(tokens),
          logprobs: Float32Array.from(lps, (v) => (v === null ? NaN : v)),
          finishReason: ch?.finish_reason === 'length' ? 'length' : 'eos',
        };
      } catch (e) {
        last = e;
        if (e instanceof RlError && !e.retriable) throw e;
        avoid.add(s);
        if (!(e instanceof TransientError && /answered with policy version/.test(e.message))) this.fail(s);
      } finally {
        this.release(s);
      }
    }
    throw new TransientError(
      `no engine answered ${req.id} after ${this.o.maxRetries + 1} tries (${this.o.urls.join(', ')}): ${(last as Error)?.message ?? last}`,
      { cause: last },
    );
  }

  async close(): Promise<void> {
    this.transport.close();
  }
}
