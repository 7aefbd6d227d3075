/**
 * The OpenAI-compatible policy server (node:http) behind `rlstream serve-policy`:
 *
 *   POST /v1/completions       prompt as text or token ids → choices (text, token_ids, log-probs)
 *   POST /v1/chat/completions  messages through the chat template → choices
 *   GET  /v1/models            the served model
 *   GET  /health               200 while serving
 *   GET  /metrics              Prometheus text (prom-client)
 *   POST /update_weights_from_disk  SGLang's reload request: {model_path, weight_version?}
 *
 * Every response names the policy version that produced it (`policy_version`, header
 * `x-rlstream-policy-version`). Sampling is the Sampler's (lib/model/sample.ts): a sequence's
 * randomness is keyed by (seed, sequence id), the sequence id being `request_id` (choice i of
 * several: `request_id:i`), so a request with `request_id` and `rlstream_seed` returns exactly
 * what the rollout stage's own sampler draws. `logprobs` are the Sampler's behaviour log-probs: of
 * the temperature-scaled distribution before top-k/top-p (greedy: untempered); `top_logprobs`
 * (chat, 0..20) and completions' `logprobs: k` (0..20) add the k most likely tokens of that same
 * distribution at each position.
 *
 * Generation is continuously batched (batcher.ts) on a decode thread of its own (decode-thread.ts):
 * a request joins the running batch at the next decode step. `stream: true` answers as server-sent
 * events, one chunk per token, written as soon as the decode step that sampled it returns, then
 * `data: [DONE]`.
 *
 * Bad requests get OpenAI-style `{"error": {message, type, param, code}}` with a 4xx status
 * (404 unknown model or path, 400 invalid values, prompt longer than the context, malformed JSON,
 * 413 body over the limit); slow clients are cut off by the request timeout.
 */
import { readBody } from '../http/body.ts';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { ConfigError, RlError } from '../errors.ts';
import { silentLogger } from '../log.ts';
import type { SamplingParamsInput } from '../model/sample.ts';
import type { ChatMessage } from '../model/chat-template.ts';
import type { SampledToken } from './batcher.ts';
import { ThreadedBatcher } from './decode-thread.ts';
import { ChoiceText } from './choice-text.ts';
import {
  chatRequestSchema,
  completionRequestSchema,
  updateWeightsSchema,
  zodMessage,
  type ChatRequest,
  type CompletionRequest,
} from './openai-schemas.ts';
import type { PolicyRef } from './policy-weights.ts';
import { runPolicyVersions, type ServedPolicy } from './served-policy.ts';
import { policyDir } from '../pipeline/policy.ts';

export interface PolicyServerOptions {
  policy: ServedPolicy;
  /** The version served first (its weights are loaded on the decode thread before the server listens). */
  initial: PolicyRef;
  host?: string;
  /** 0 = an ephemeral port. */
  port: number;
  maxBodyBytes?: number;
  /** Cut off a client that has not sent its whole request within this (ms). */
  requestTimeoutMs?: number;
  /** Poll the run directory for new policy versions every this many ms (run directories only; 0 = off). */
  followMs?: number;
  /** ORT threads of the sampler. */
  threads?: number;
  maxBatchSize?: number;
  /** How long an idle server waits for more requests before starting a batch (ms, default 5). */
  batchWindowMs?: number;
  /** Decode steps between admissions of new requests (default 1: a request joins at the next token, streams token by token). */
  stepsPerRun?: number;
  /** Sample at temperature × this (testing a deliberately mismatched engine; 1 = exact). */
  temperatureScale?: number;
  log?: Logger;
}

export interface PolicyServer {
  url: string;
  port: number;
  version(): number;
  close(): Promise<void>;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
  }
  body(): string {
    const type = this.status === 404 ? 'NotFoundError' : this.status >= 500 ? 'InternalServerError' : 'BadRequestError';
    return JSON.stringify({
      error: { message: this.message, type, param: this.param, code: this.code ?? this.status },
      object: 'error',
      message: this.message,
    });
  }
}

interface Choice {
  index: number;
  promptIds: number[];
  /** Per token, the requested most likely tokens (empty without top_logprobs). */
  top: SampledToken['top'][];
  text: ChoiceText;
}

/** One sampled token of a choice, with the text it releases. */
interface TokenEvent {
  token: number;
  logprob: number;
  top: SampledToken['top'];
  delta: string;
  /** The choice ended with this token. */
  done: boolean;
}

interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

interface SseStream {
  write(chunk: unknown): void;
  end(): void;
  /** The client has gone. */
  closed(): boolean;
}

export async function startPolicyServer(o: PolicyServerOptions): Promise<PolicyServer> {
  const { policy } = o;
  const tok = policy.tokenizer;
  const c = policy.config;
  const log = o.log ?? silentLogger();
  const limit = o.maxBodyBytes ?? 16 * 1024 * 1024;
  const tScale = o.temperatureScale ?? 1;
  let current = o.initial;

  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  const R = [registry];
  const mRequests = new Counter({
    name: 'rlstream_policy_server_requests_total',
    help: 'HTTP requests by endpoint and status',
    labelNames: ['endpoint', 'status'],
    registers: R,
  });
  const mPrompt = new Counter({
    name: 'rlstream_policy_server_prompt_tokens_total',
    help: 'Prompt tokens of served sequences',
    registers: R,
  });
  const mGen = new Counter({
    name: 'rlstream_policy_server_generation_tokens_total',
    help: 'Tokens generated',
    registers: R,
  });
  const mBatch = new Histogram({
    name: 'rlstream_policy_server_batch_sequences',
    help: 'Sequences per decode run of the running batch',
    buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256],
    registers: R,
  });
  const mPrefill = new Histogram({
    name: 'rlstream_policy_server_prefill_sequences',
    help: 'Sequences prefilled together as they join the running batch',
    buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256],
    registers: R,
  });
  const mLatency = new Histogram({
    name: 'rlstream_policy_server_request_seconds',
    help: 'Generation request latency',
    labelNames: ['endpoint'],
    buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: R,
  });
  const mVersion = new Gauge({
    name: 'rlstream_policy_server_policy_version',
    help: 'The policy version served',
    registers: R,
  });
  const mPending = new Gauge({
    name: 'rlstream_policy_server_pending_sequences',
    help: 'Sequences waiting for a batch',
    registers: R,
    collect() {
      this.set(batcher.pending);
    },
  });
  void mPending;
  mVersion.set(current.version);

  // the running batch decodes on a thread of its own (decode-thread.ts); this one serves HTTP
  const batcher = new ThreadedBatcher(c, {
    threads: o.threads,
    windowMs: o.batchWindowMs ?? 5,
    maxBatchSize: o.maxBatchSize,
    stepsPerRun: o.stepsPerRun,
    stats: { onBatch: (n) => mBatch.observe(n), onPrefill: (n) => mPrefill.observe(n) },
  });
  try {
    await batcher.setPolicy(current);
  } catch (e) {
    await batcher.close();
    throw e;
  }

  // weight swaps happen one at a time, each read by the decode thread (the only copy of the
  // weights); a failed one leaves the version before serving; a batch keeps the weights it started with
  let loading: Promise<unknown> = Promise.resolve();
  const swap = (next: PolicyRef): Promise<PolicyRef> => {
    const p = loading
      .then(() => batcher.setPolicy(next))
      .then(() => {
        current = next;
        mVersion.set(next.version);
        log.info({ version: next.version, dir: next.dir }, `serving policy version ${next.version}`);
        return next;
      });
    loading = p.catch(() => undefined);
    return p;
  };

  let followTimer: NodeJS.Timeout | null = null;
  if (policy.runDir && (o.followMs ?? 500) > 0) {
    const runDir = policy.runDir;
    let busy = false;
    followTimer = setInterval(() => {
      if (busy) return;
      const vs = runPolicyVersions(runDir);
      const newest = vs[vs.length - 1];
      if (newest === undefined || newest <= current.version) return;
      busy = true;
      swap({ version: newest, dir: policyDir(runDir, newest) })
        .catch((e: unknown) =>
          log.warn({ err: (e as Error).message }, `loading policy version ${newest} failed; retrying`),
        )
        .finally(() => (busy = false));
    }, o.followMs ?? 500);
    followTimer.unref();
  }

  const checkModel = (name: string) => {
    if (name !== policy.name)
      throw new ApiError(
        404,
        `The model \`${name}\` does not exist. Served: ${policy.name}`,
        'model',
        'model_not_found',
      );
  };

  const checkIds = (ids: number[], where: string) => {
    for (const v of ids)
      if (v >= c.vocabSize)
        throw new ApiError(400, `${where}: token id ${v} is outside the vocabulary (${c.vocabSize} ids)`, 'prompt');
  };

  /** Samples `n` choices for each prompt; `onToken` sees each token as it is sampled (streaming). */
  async function sample(
    prompts: number[][],
    r: CompletionRequest | ChatRequest,
    maxTokensIn: number | null | undefined,
    top: number,
    onToken?: (ch: Choice, e: TokenEvent, version: number) => boolean,
  ): Promise<{ version: number; choices: Choice[] }> {
    const maxPos = c.maxPositionEmbeddings;
    for (const p of prompts) {
      if (p.length === 0) throw new ApiError(400, 'the prompt encodes to no tokens', 'prompt');
      const want = p.length + (maxTokensIn ?? 1);
      if (want > maxPos)
        throw new ApiError(
          400,
          `This model's maximum context length is ${maxPos} tokens. However, you requested ${want} tokens (${p.length} in the prompt, ${maxTokensIn ?? 1} in the completion). Please reduce the length of the prompt or the completion.`,
          'max_tokens',
          'context_length_exceeded',
        );
    }
    const maxTokens = maxTokensIn ?? Math.min(...prompts.map((p) => maxPos - p.length));
    const T = r.temperature ?? 1;
    const eos = [...new Set([...(r.ignore_eos ? [] : policy.stopIds), ...(r.stop_token_ids ?? [])])];
    for (const e of eos)
      if (e >= c.vocabSize) throw new ApiError(400, `stop_token_ids: ${e} is outside the vocabulary`, 'stop_token_ids');
    const params: SamplingParamsInput = {
      temperature: T * tScale,
      topP: r.top_p ?? 1,
      topK: r.top_k !== null && r.top_k !== undefined && r.top_k > 0 ? r.top_k : 0,
      maxNewTokens: maxTokens,
      seed: r.rlstream_seed ?? r.seed ?? 0,
      eosTokenIds: eos,
    };
    const base = r.request_id ?? (r.seed !== null && r.seed !== undefined ? `seed-${r.seed}` : randomUUID());
    const total = prompts.length * r.n;
    const seqs = prompts.flatMap((p, pi) =>
      Array.from({ length: r.n }, (_, i) => ({ id: total === 1 ? base : `${base}:${pi * r.n + i}`, prompt: p })),
    );
    const stops = typeof r.stop === 'string' ? [r.stop] : (r.stop ?? []);
    const eosSet = new Set(eos);
    const choices: Choice[] = seqs.map((s, k) => ({
      index: k,
      promptIds: s.prompt,
      top: [],
      // a response sent whole decodes each choice's text once, at the end
      text: new ChoiceText(tok, stops, eosSet, maxTokens, onToken !== undefined),
    }));
    let res;
    try {
      res = await batcher.submit(seqs, params, {
        topLogprobs: top,
        onToken: (k, t, version) => {
          const ch = choices[k];
          const { delta, done } = ch.text.push(t.token, t.logprob);
          if (top) ch.top.push(t.top);
          const gone = onToken?.(ch, { token: t.token, logprob: t.logprob, top: t.top, delta, done }, version) ?? false;
          return done || gone;
        },
      });
    } catch (e) {
      if (e instanceof ConfigError) throw new ApiError(400, e.message);
      throw e;
    }
    for (const ch of choices) {
      if (!ch.text.finish) ch.text.end('length');
      mPrompt.inc(ch.promptIds.length);
      mGen.inc(ch.text.tokens.length);
    }
    return { version: res.version, choices };
  }

  const created = () => Math.floor(Date.now() / 1000);
  const tokenText = (t: number) => tok.decode([t]);
  const bytesOf = (s: string) => Array.from(Buffer.from(s, 'utf8'));
  /** OpenAI's top_logprobs count of a request (0..20), checked. */
  const topOf = (n: number | null | undefined, on: boolean, what: string): number => {
    if (n === null || n === undefined || n === 0) return 0;
    if (!on) throw new ApiError(400, `${what}: needs logprobs to be set`, what);
    return n;
  };

  /** A completions choice's `logprobs` object for tokens [from, to) (OpenAI's legacy shape). */
  function completionLogprobs(ch: Choice, from: number, to: number, offset0: number) {
    const tokens = ch.text.tokens.slice(from, to).map(tokenText);
    let at = offset0;
    return {
      tokens,
      token_logprobs: ch.text.logprobs.slice(from, to),
      // the `logprobs` most likely tokens and the sampled one (OpenAI: up to logprobs + 1 entries)
      top_logprobs: tokens.map((s, k) => {
        const d: Record<string, number> = {};
        for (const x of ch.top[from + k] ?? []) d[tokenText(x.token)] ??= x.logprob;
        d[s] ??= ch.text.logprobs[from + k];
        return d;
      }),
      text_offset: tokens.map((s) => {
        const o = at;
        at += s.length;
        return o;
      }),
    };
  }

  /** Chat `logprobs.content` entries for tokens [from, to). */
  function chatLogprobs(ch: Choice, from: number, to: number) {
    return ch.text.tokens.slice(from, to).map((t, k) => {
      const s = tokenText(t);
      return {
        token: s,
        logprob: ch.text.logprobs[from + k],
        bytes: bytesOf(s),
        top_logprobs: (ch.top[from + k] ?? []).map((x) => {
          const xs = tokenText(x.token);
          return { token: xs, logprob: x.logprob, bytes: bytesOf(xs) };
        }),
      };
    });
  }

  /**
   * Runs `sample`, answering as one JSON body, or with `stream` as server-sent events: each token's
   * chunk is written as soon as its decode step returns (the headers with the first token, when the
   * serving policy version is known).
   */
  async function answer(
    send: Sender,
    stream: boolean,
    run: (
      onToken?: (ch: Choice, e: TokenEvent, version: number) => boolean,
    ) => Promise<{ version: number; choices: Choice[] }>,
    chunk: {
      start?: (ch: Choice, version: number) => unknown;
      token: (ch: Choice, e: TokenEvent, version: number) => unknown;
      usage: (u: Usage, version: number) => unknown;
    },
    whole: (version: number, choices: Choice[], usage: Usage) => unknown,
    includeUsage: boolean,
  ): Promise<void> {
    if (!stream) {
      const { version, choices } = await run();
      return send.json(200, version, whole(version, choices, usageOf(choices)));
    }
    let out: SseStream | null = null;
    const begun = new Set<number>();
    const open = (version: number) => (out ??= send.sse(version));
    const { version, choices } = await run((ch, e, v) => {
      const s = open(v);
      if (chunk.start && !begun.has(ch.index)) {
        begun.add(ch.index);
        s.write(chunk.start(ch, v));
      }
      s.write(chunk.token(ch, e, v));
      return s.closed();
    });
    const s = open(version);
    if (includeUsage) s.write(chunk.usage(usageOf(choices), version));
    s.end();
  }

  async function completions(raw: unknown, send: Sender): Promise<void> {
    const p = completionRequestSchema.safeParse(raw);
    if (!p.success) {
      const z = zodMessage(p.error);
      throw new ApiError(400, z.message, z.param);
    }
    const r = p.data;
    checkModel(r.model);
    const pr = r.prompt;
    const prompts: number[][] =
      typeof pr === 'string'
        ? [Array.from(tok.encode(pr, { addSpecialTokens: true }))]
        : typeof pr[0] === 'number'
          ? [pr as number[]]
          : typeof pr[0] === 'string'
            ? (pr as string[]).map((s) => Array.from(tok.encode(s, { addSpecialTokens: true })))
            : (pr as number[][]);
    prompts.forEach((ids, i) => checkIds(ids, `prompt ${i}`));
    const wantLp = r.logprobs !== null && r.logprobs !== undefined;
    const id = `cmpl-${randomUUID()}`;
    const head = (version: number) => ({
      id,
      object: 'text_completion',
      created: created(),
      model: policy.name,
      policy_version: version,
    });
    const offsets = new Map<number, number>();
    await answer(
      send,
      r.stream ?? false,
      (onToken) => sample(prompts, r, r.max_tokens, r.logprobs ?? 0, onToken),
      {
        token: (ch, e, v) => {
          const k = ch.text.tokens.length - 1;
          const off = offsets.get(ch.index) ?? 0;
          offsets.set(ch.index, off + tokenText(e.token).length);
          return {
            ...head(v),
            choices: [
              {
                index: ch.index,
                text: e.delta,
                logprobs: wantLp ? completionLogprobs(ch, k, k + 1, off) : null,
                finish_reason: e.done ? ch.text.finish : null,
                ...(r.return_token_ids
                  ? { token_ids: [e.token], ...(k === 0 ? { prompt_token_ids: ch.promptIds } : {}) }
                  : {}),
              },
            ],
          };
        },
        usage: (usage, v) => ({ ...head(v), choices: [], usage }),
      },
      (version, choices, usage) => ({
        ...head(version),
        choices: choices.map((ch) => ({
          index: ch.index,
          text: ch.text.text,
          logprobs: wantLp ? completionLogprobs(ch, 0, ch.text.tokens.length, 0) : null,
          finish_reason: ch.text.finish,
          stop_reason: null,
          ...(r.return_token_ids ? { token_ids: ch.text.tokens, prompt_token_ids: ch.promptIds } : {}),
        })),
        usage,
      }),
      r.stream_options?.include_usage ?? false,
    );
  }

  function usageOf(choices: Choice[]): Usage {
    const promptTokens = [...new Set(choices.map((ch) => ch.promptIds))].reduce((n, p) => n + p.length, 0);
    const completion = choices.reduce((n, ch) => n + ch.text.tokens.length, 0);
    return { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion };
  }

  async function chat(raw: unknown, send: Sender): Promise<void> {
    const p = chatRequestSchema.safeParse(raw);
    if (!p.success) {
      const z = zodMessage(p.error);
      throw new ApiError(400, z.message, z.param);
    }
    const r = p.data;
    checkModel(r.model);
    if (!policy.chatTemplate)
      throw new ApiError(
        400,
        `the model ${policy.name} has no chat template (tokenizer_config.json chat_template); use /v1/completions or start serve-policy with --chat-template FILE`,
        'messages',
      );
    const top = topOf(r.top_logprobs, r.logprobs ?? false, 'top_logprobs');
    const messages: ChatMessage[] = r.messages.map((m) => ({
      ...m,
      role: m.role,
      content: typeof m.content === 'string' ? m.content : (m.content ?? []).map((x) => x.text).join(''),
    }));
    let text: string;
    try {
      text = policy.chatTemplate.render(messages, {
        addGenerationPrompt: r.add_generation_prompt ?? true,
        kwargs: { ...(r.tools ? { tools: r.tools } : {}), ...(r.chat_template_kwargs ?? {}) },
      });
    } catch (e) {
      throw new ApiError(400, (e as Error).message, 'messages');
    }
    const promptIds = Array.from(tok.encode(text, { addSpecialTokens: false }));
    const id = `chatcmpl-${randomUUID()}`;
    const head = (version: number) => ({
      id,
      object: 'chat.completion.chunk',
      created: created(),
      model: policy.name,
      policy_version: version,
    });
    await answer(
      send,
      r.stream ?? false,
      (onToken) => sample([promptIds], r, r.max_completion_tokens ?? r.max_tokens, top, onToken),
      {
        start: (ch, v) => ({
          ...head(v),
          choices: [{ index: ch.index, delta: { role: 'assistant', content: '' }, finish_reason: null }],
        }),
        token: (ch, e, v) => {
          const k = ch.text.tokens.length - 1;
          return {
            ...head(v),
            choices: [
              {
                index: ch.index,
                delta: { content: e.delta },
                logprobs: r.logprobs ? { content: chatLogprobs(ch, k, k + 1) } : null,
                finish_reason: e.done ? ch.text.finish : null,
                ...(r.return_token_ids ? { token_ids: [e.token] } : {}),
              },
            ],
          };
        },
        usage: (usage, v) => ({ ...head(v), choices: [], usage }),
      },
      (version, choices, usage) => ({
        ...head(version),
        object: 'chat.completion',
        choices: choices.map((ch) => ({
          index: ch.index,
          message: { role: 'assistant', content: ch.text.text, tool_calls: [] },
          logprobs: r.logprobs ? { content: chatLogprobs(ch, 0, ch.text.tokens.length) } : null,
          finish_reason: ch.text.finish,
          ...(r.return_token_ids ? { token_ids: ch.text.tokens } : {}),
        })),
        ...(r.return_token_ids ? { prompt_token_ids: promptIds } : {}),
        usage,
      }),
      r.stream_options?.include_usage ?? false,
    );
  }

  async function updateWeights(raw: unknown, send: Sender): Promise<void> {
    const p = updateWeightsSchema.safeParse(raw);
    if (!p.success) {
      const z = zodMessage(p.error);
      throw new ApiError(400, z.message, z.param);
    }
    const r = p.data;
    const named = r.weight_version ?? /v(\d+)\/?$/.exec(r.model_path)?.[1];
    const version =
      named !== undefined && named !== null && /^\d+$/.test(String(named)) ? Number(named) : current.version + 1;
    try {
      const w = await swap({ version, dir: r.model_path });
      send.json(200, w.version, {
        success: true,
        message: `loaded ${r.model_path} as policy version ${w.version}`,
        num_paused_requests: 0,
        policy_version: w.version,
      });
    } catch (e) {
      const status = e instanceof RlError && e.code === 'ERR_NO_MODEL_PATH' ? 404 : 400;
      send.json(status, current.version, { success: false, message: (e as Error).message, num_paused_requests: 0 });
    }
  }

  interface Sender {
    json(status: number, version: number, body: unknown): void;
    sse(version: number): SseStream;
  }

  const server = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const endpoint = [
      '/v1/completions',
      '/v1/chat/completions',
      '/v1/models',
      '/health',
      '/metrics',
      '/update_weights_from_disk',
    ].includes(path)
      ? path
      : 'other';
    const t0 = performance.now();
    const send: Sender = {
      json(status, version, body) {
        mRequests.inc({ endpoint, status: String(status) });
        res.writeHead(status, { 'content-type': 'application/json', 'x-rlstream-policy-version': String(version) });
        res.end(JSON.stringify(body));
      },
      sse(version) {
        mRequests.inc({ endpoint, status: '200' });
        res.writeHead(200, {
          'content-type': 'text/event-stream',
          'cache-control': 'no-cache',
          'x-rlstream-policy-version': String(version),
        });
        res.flushHeaders();
        return {
          write: (chunk) => void res.write(`data: ${JSON.stringify(chunk)}\n\n`),
          end: () => void res.end('data: [DONE]\n\n'),
          closed: () => res.destroyed || res.writableEnded,
        };
      },
    };
    const fail = (e: unknown) => {
      const err =
        e instanceof ApiError
          ? e
          : new ApiError(500, `internal error: ${(e as Error)?.message ?? String(e)}`, null, 'internal_error');
      if (err.status >= 500) log.error({ err: (e as Error)?.message }, 'request failed');
      if (res.headersSent) {
        // a stream already under way ends with the error as its last event
        if (!res.writableEnded) res.end(`data: ${err.body()}\n\ndata: [DONE]\n\n`);
        return;
      }
      mRequests.inc({ endpoint, status: String(err.status) });
      res.writeHead(err.status, {
        'content-type': 'application/json',
        ...(err.status === 413 ? { connection: 'close' } : {}),
      });
      res.end(err.body());
    };
    if (req.method === 'GET') {
      if (path === '/health') return send.json(200, current.version, { status: 'ok', policy_version: current.version });
      if (path === '/v1/models')
        return send.json(200, current.version, {
          object: 'list',
          data: [
            {
              id: policy.name,
              object: 'model',
              created: created(),
              owned_by: 'rlstream',
              root: current.dir,
              max_model_len: c.maxPositionEmbeddings,
              policy_version: current.version,
            },
          ],
        });
      if (path === '/metrics') {
        registry.metrics().then(
          (text) => {
            res.writeHead(200, { 'content-type': registry.contentType });
            res.end(text);
          },
          (e: unknown) => fail(e),
        );
        return;
      }
    }
    const handler =
      path === '/v1/completions'
        ? completions
        : path === '/v1/chat/completions'
          ? chat
          : path === '/update_weights_from_disk'
            ? updateWeights
            : null;
    if (!handler)
      return fail(
        new ApiError(
          404,
          `no route ${req.method} ${path}; endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics, POST /update_weights_from_disk`,
        ),
      );
    if (req.method !== 'POST') return fail(new ApiError(405, `${path} takes POST`));
    readBody(
      req,
      limit,
      (m) => new ApiError(413, m),
      (m) => new ApiError(400, m),
    )
      .then((buf) => {
        let body: unknown;
        try {
          body = JSON.parse(buf.toString('utf8'));
        } catch (e) {
          throw new ApiError(400, `the body is not valid JSON (${(e as Error).message})`);
        }
        if (body === null || typeof body !== 'object' || Array.isArray(body))
          throw new ApiError(400, 'the body must be a JSON object');
        return handler(body, send);
      })
      .then(() => {
        if (endpoint !== '/update_weights_from_disk') mLatency.observe({ endpoint }, (performance.now() - t0) / 1000);
      })
      .catch(fail);
  });
  server.requestTimeout = o.requestTimeoutMs ?? 60_000;
  server.headersTimeout = Math.min(server.requestTimeout, 20_000);
  server.keepAliveTimeout = 5000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(o.port, o.host ?? '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  return {
    port,
    url: `http://${o.host && o.host !== '0.0.0.0' ? o.host : '127.0.0.1'}:${port}`,
    version: () => current.version,
    close: () =>
      new Promise<void>((r) => {
        if (followTimer) clearInterval(followTimer);
        server.closeAllConnections();
        server.close(() => void batcher.close().then(() => r()));
      }),
  };
}
