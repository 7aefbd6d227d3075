/**
 * HTTP reward client used by the reward stage: scores trajectories with remote reward servers
 * speaking the `/score` protocol (`POST /score {image, prompt}` → `{vlm_score, ocr_confidence}`).
 *
 * Routing: reward replica i prefers server i mod N (one server per training process, as in the
 * seed); when that server is full, unhealthy or already failed this item, the least-outstanding
 * healthy server takes the request (servers that just failed sort last, so a fast-failing server
 * does not attract traffic). At most `concurrency_per_server` requests per server.
 *
 * Faults: per-request timeout; retriable errors (refused/reset, timeout, 429, 5xx, malformed
 * body) are retried up to `max_retries` times with jittered exponential backoff (or the server's
 * Retry-After), on another server when one is healthy; 4xx other than 408/429 are final. A
 * circuit breaker per server opens after consecutive server faults (transport errors, timeouts,
 * 5xx, malformed bodies) of `failure_threshold` distinct inputs: the retries of one input count
 * once, and an input whose server fault repeats on a server that answered other inputs since (a
 * 500 that comes back for the same body) is the input's own failure — it stops counting, so a
 * partial outage that hits some prompts only does not open the breaker for everyone. When a streak
 * reaches the threshold the server is first re-tested with the last body it scored (a canary): if
 * it scores that again, the streak was of inputs it cannot score (e.g. all samples of one bad
 * prompt side by side), which become those inputs' own failures, and the breaker stays closed;
 * only when the canary fails too (or there is none yet) does it open. An input's own failure is
 * not retried again within the call: it fails at once, the others go on at full speed. A
 * multi-item request that fails is retried item by item. While open the
 * server gets `/healthz` probes every `probe_interval_ms`, and a healthy probe at least
 * `reset_timeout_ms` after opening half-opens it (one trial request decides). A whole
 * `scoreBatch` has `batch_budget_ms`. An item that cannot be scored is an `ok: false` outcome
 * with its reason (and the offending body, truncated) — never a zero reward.
 */
import type { Logger } from 'pino';
import { ConfigError, RlError } from '../errors.ts';
import { silentLogger } from '../log.ts';
import { fetchTransport, nodeHttpTransport, type FetchLike, type Transport } from './transport.ts';
import {
  REQUEST_PRESETS,
  REQUEST_PRESET_NAMES,
  TRAJECTORY_FIELDS,
  resolveServerEndpoints,
  truncateBody,
  type RemoteRewardOptions,
  type RewardOutcome,
  type RewardRequestItem,
  type ServerEndpoint,
  type TrajectoryField,
} from './types.ts';

export interface Clock {
  now(): number;
  sleep(ms: number): Promise<void>;
  random(): number;
}

export const realClock: Clock = {
  now: () => performance.now(),
  sleep: (ms) => new Promise((r) => setTimeout(r, ms)),
  random: () => Math.random(),
};

export interface RemoteRewardClient {
  /** One outcome per item, in the items' order. Never rejects for per-item problems. */
  scoreBatch(items: RewardRequestItem[]): Promise<RewardOutcome[]>;
  /** Counters and gauges: `reward/failures`, `reward_server/<host:port>/latency_p99_ms`, … */
  metrics(): Record<string, number>;
  /** Stops probes and closes connections; calls in progress finish their items as failures. */
  close(): void;
}

export interface RemoteRewardClientDeps {
  /** This reward replica's index: it prefers server `replicaIndex mod N`. */
  replicaIndex: number;
  log?: Logger;
  /** Use this fetch instead of the default node:http keep-alive transport. */
  fetchImpl?: FetchLike;
  clock?: Clock;
  /** Environment to read `auth_token_env` from (default process.env). */
  env?: NodeJS.ProcessEnv;
}

type BreakerState = 'closed' | 'open' | 'half_open';

interface Sample {
  t: number;
  ms: number;
  ok: boolean;
}
const SAMPLES = 2048;
const RATE_WINDOW_MS = 10_000;

interface ServerState {
  ep: ServerEndpoint;
  index: number;
  outstanding: number;
  state: BreakerState;
  consecutiveFailures: number;
  openedAt: number;
  trialInFlight: boolean;
  probeTimer?: ReturnType<typeof setInterval>;
  probing: boolean;
  lastError?: string;
  lastFailureAt: number;
  samples: Sample[];
  sampleNext: number;
  requests: number;
  errors: number;
  /** The distinct inputs (item ids) of the current streak of server faults; its size is what opens the breaker. */
  failingInputs: Set<string>;
  /** `results` count at this server's last success. */
  lastSuccess: number;
  /** The body of this server's last successful request: re-sent to tell a bad streak of inputs from a failing server. */
  canary: string | null;
  /** A canary request is in flight (no new requests meanwhile). */
  verifying: boolean;
  opens: number;
}

/** What went wrong with one attempt. */
interface AttemptError {
  reason: string;
  /** Another attempt (possibly on another server) may succeed. */
  retriable: boolean;
  /** Whether the item's final failure, if this is the last error, is worth retrying later. */
  finalRetriable: boolean;
  /** Counts against the server's breaker (server-side faults; not 4xx). */
  serverFault: boolean;
  server?: string;
  /** What the server answered (absent when no response came: refused, reset or timed-out connections). */
  body?: string;
  retryAfterMs?: number;
}

interface Job {
  items: RewardRequestItem[];
  bodies: Record<string, unknown>[];
}

const MAX_BODY_KEPT = 512;

function fieldValue(item: RewardRequestItem, f: TrajectoryField): unknown {
  switch (f) {
    case 'prompt_text':
      return item.prompt_text;
    case 'response_text':
      return item.response_text;
    case 'ground_truth':
      return item.ground_truth;
    case 'image_base64_png':
      return item.images && item.images.length > 0 ? item.images[0].toString('base64') : undefined;
    case 'id':
      return item.id;
    case 'step':
      return item.step;
  }
}

function parseRetryAfter(v: string | undefined, nowMs: number): number | undefined {
  if (!v) return undefined;
  if (/^\d+(\.\d+)?$/.test(v.trim())) return Number(v) * 1000;
  const t = Date.parse(v);
  return Number.isNaN(t) ? undefined : Math.max(0, t - nowMs);
}

function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return 0;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i];
}

/** Checks `reward.remote` and the request/response mapping; ConfigErrors say what to change. */
function validateOptions(opts: RemoteRewardOptions): {
  template: Record<string, TrajectoryField>;
  weights: [string, number][];
  range: readonly [number, number];
} {
  const template = opts.request_template ?? REQUEST_PRESETS[opts.request_preset];
  if (!template)
    throw new ConfigError(
      `reward.remote.request_preset: unknown preset "${opts.request_preset}" — valid: ${REQUEST_PRESET_NAMES.join(', ')}`,
    );
  const fields = Object.entries(template);
  if (fields.length === 0)
    throw new ConfigError(
      'reward.remote.request_template: maps no field — give at least one body field, e.g. {prompt: prompt_text}',
    );
  for (const [k, f] of fields) {
    if (!(TRAJECTORY_FIELDS as readonly string[]).includes(f))
      throw new ConfigError(
        `reward.remote.request_template.${k}: unknown trajectory field "${f}" — valid: ${TRAJECTORY_FIELDS.join(', ')}`,
      );
  }
  const weights = Object.entries(opts.response_mapping?.weights ?? {});
  if (weights.length === 0)
    throw new ConfigError(
      'reward.remote.response_mapping.weights: empty — name at least one response field, e.g. {vlm_score: 1}',
    );
  for (const [k, w] of weights)
    if (typeof w !== 'number' || !Number.isFinite(w))
      throw new ConfigError(`reward.remote.response_mapping.weights.${k}: ${w} is not a finite number`);
  const positive = (name: string, v: number, min = 1) => {
    if (typeof v !== 'number' || !Number.isFinite(v) || v < min)
      throw new ConfigError(`reward.remote.${name}: ${v} must be a number ≥ ${min}`);
  };
  const range = opts.response_mapping.range ?? [0, 1];
  if (range.length !== 2 || !range.every(Number.isFinite) || range[0] > range[1])
    throw new ConfigError(
      `reward.remote.response_mapping.range: [${range.join(', ')}] must be [low, high] with low ≤ high`,
    );
  positive('timeout_ms', opts.timeout_ms);
  positive('max_retries', opts.max_retries, 0);
  positive('backoff_initial_ms', opts.backoff_initial_ms, 0);
  positive('backoff_max_ms', opts.backoff_max_ms, 0);
  positive('concurrency_per_server', opts.concurrency_per_server);
  positive('batch_size', opts.batch_size);
  positive('batch_budget_ms', opts.batch_budget_ms);
  positive('breaker.failure_threshold', opts.breaker.failure_threshold);
  positive('breaker.reset_timeout_ms', opts.breaker.reset_timeout_ms, 0);
  positive('breaker.probe_interval_ms', opts.breaker.probe_interval_ms);
  return { template, weights, range };
}

/**
 * Maps one returned object to the scalar reward: Σ weights[k]·value[k]. Every weighted field must
 * be a finite number within `range` (default [0, 1]); anything else makes the response malformed
 * (reason returned). `details` keeps every returned field.
 */
export function mapResponse(
  value: unknown,
  weights: readonly [string, number][],
  range: readonly [number, number] = [0, 1],
): { ok: true; reward: number; details: Record<string, unknown> } | { ok: false; reason: string } {
  if (value === null || typeof value !== 'object' || Array.isArray(value))
    return {
      ok: false,
      reason: `expected a JSON object with ${weights.map(([k]) => k).join(', ')}, got ${Array.isArray(value) ? 'an array' : JSON.stringify(value)?.slice(0, 60)}`,
    };
  const obj = value as Record<string, unknown>;
  let reward = 0;
  for (const [k, w] of weights) {
    const v = obj[k];
    if (v === undefined)
      return {
        ok: false,
        reason: `field "${k}" is missing (returned fields: ${Object.keys(obj).join(', ') || 'none'})`,
      };
    if (typeof v !== 'number')
      return {
        ok: false,
        reason: `field "${k}" is ${JSON.stringify(v)?.slice(0, 40)}, expected a number in [${range[0]}, ${range[1]}]`,
      };
    if (!Number.isFinite(v) || v < range[0] || v > range[1])
      return { ok: false, reason: `field "${k}" is ${v}, outside [${range[0]}, ${range[1]}]` };
    reward += w * v;
  }
  return { ok: true, reward, details: { ...obj } };
}

function parseJson(body: string): { ok: true; value: unknown } | { ok: false; reason: string } {
  try {
    return { ok: true, value: JSON.parse(body) };
  } catch (e) {
    if (/(^|[^A-Za-z"])-?(NaN|Infinity)([^A-Za-z"]|$)/.test(body))
      return { ok: false, reason: 'response contains NaN/Infinity (not valid JSON; scores must be finite numbers)' };
    return { ok: false, reason: `response is not valid JSON (${(e as Error).message})` };
  }
}

export function createRemoteRewardClient(opts: RemoteRewardOptions, deps: RemoteRewardClientDeps): RemoteRewardClient {
  const { template, weights, range } = validateOptions(opts);
  const endpoints = resolveServerEndpoints(opts);
  const log = (deps.log ?? silentLogger()).child({ component: 'reward-client', replica: deps.replicaIndex });
  const clock = deps.clock ?? realClock;
  const env = deps.env ?? process.env;
  const transport: Transport = deps.fetchImpl ? fetchTransport(deps.fetchImpl) : nodeHttpTransport();

  // The token is only ever placed in these headers: never logged, never in an error message.
  const authHeaders: Record<string, string> = {};
  if (opts.auth_token_env) {
    const token = env[opts.auth_token_env]?.trim();
    if (!token)
      throw new ConfigError(
        `reward.remote.auth_token_env: environment variable ${opts.auth_token_env} is not set (it should hold the reward servers' auth token)`,
      );
    if (!/^[A-Za-z0-9-]+$/.test(opts.auth_header))
      throw new ConfigError(`reward.remote.auth_header: "${opts.auth_header}" is not a valid header name`);
    const scheme = (opts.auth_scheme ?? 'Bearer').trim();
    authHeaders[opts.auth_header.toLowerCase()] = scheme ? `${scheme} ${token}` : token;
  }
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    accept: 'application/json',
    ...authHeaders,
  };

  const servers: ServerState[] = endpoints.map((ep, index) => ({
    ep,
    index,
    outstanding: 0,
    state: 'closed',
    consecutiveFailures: 0,
    openedAt: 0,
    trialInFlight: false,
    probing: false,
    lastFailureAt: 0,
    samples: [],
    sampleNext: 0,
    requests: 0,
    errors: 0,
    failingInputs: new Set<string>(),
    lastSuccess: -1,
    canary: null,
    verifying: false,
    opens: 0,
  }));
  // inputs that had a server fault once (anywhere), and those whose fault repeated: their own (bounded memory)
  const faultedAt = new Map<string, number>(); // input → `results` count at its first server fault
  const ownFault = new Set<string>();
  let results = 0;
  const bound = (m: { size: number; delete(k: string): boolean; keys(): IterableIterator<string> }) => {
    if (m.size > 4096) m.delete(m.keys().next().value!);
  };
  const preferred = ((deps.replicaIndex % servers.length) + servers.length) % servers.length;
  const counters = { failures: 0, scored: 0, retries: 0, requests: 0 };
  const startedAt = clock.now();
  let closed = false;

  // ---- waiting for a free server --------------------------------------------------------------
  // FIFO of jobs waiting for a server slot: an array with a moving head (O(1) per hand-out even
  // with thousands waiting); a waiter that timed out is only marked and skipped.
  interface Waiter {
    exclude: Set<number>;
    resolve: (s: ServerState | null) => void;
    cancelled: boolean;
  }
  let waiters: Waiter[] = [];
  let head = 0;

  const usable = (s: ServerState) =>
    !s.verifying &&
    s.outstanding < opts.concurrency_per_server &&
    (s.state === 'closed' || (s.state === 'half_open' && !s.trialInFlight));
  const healthy = (s: ServerState) => s.state !== 'open';

  /**
   * A server that failed recently cools down for an exponentially growing time (the backoff
   * schedule), so a fast-failing server does not attract traffic under least-outstanding routing
   * before its breaker opens; afterwards it is an ordinary candidate again (affinity restored).
   */
  const cooling = (s: ServerState) =>
    s.consecutiveFailures > 0 &&
    clock.now() - s.lastFailureAt <
      Math.min(opts.backoff_max_ms, opts.backoff_initial_ms * 2 ** (s.consecutiveFailures - 1));

  /** Affinity first, then least outstanding; servers that failed this item or are cooling down sort last. */
  function pick(exclude: Set<number>): ServerState | null {
    const pref = servers[preferred];
    if (!exclude.has(pref.index) && usable(pref) && !cooling(pref)) return pref;
    const anyHealthyUnexcluded = servers.some((s) => healthy(s) && !exclude.has(s.index));
    let best: ServerState | null = null;
    let bestKey: number[] = [];
    for (let k = 0; k < servers.length; k++) {
      const s = servers[(preferred + k) % servers.length];
      if (!usable(s)) continue;
      if (anyHealthyUnexcluded && exclude.has(s.index)) continue;
      const key = [cooling(s) ? 1 : 0, s.outstanding, k];
      if (
        !best ||
        key[0] < bestKey[0] ||
        (key[0] === bestKey[0] && (key[1] < bestKey[1] || (key[1] === bestKey[1] && key[2] < bestKey[2])))
      ) {
        best = s;
        bestKey = key;
      }
    }
    return best;
  }

  function take(s: ServerState): ServerState {
    s.outstanding++;
    if (s.state === 'half_open') s.trialInFlight = true;
    return s;
  }

  function pump(): void {
    const skipped: Waiter[] = [];
    while (head < waiters.length) {
      const w = waiters[head];
      if (w.cancelled) {
        head++;
        continue;
      }
      if (closed) {
        head++;
        w.resolve(null);
        continue;
      }
      if (!servers.some(usable)) break;
      head++;
      const s = pick(w.exclude);
      if (s) w.resolve(take(s));
      else skipped.push(w);
    }
    // waiters that could not use the free servers (they already failed there) keep their places
    head -= skipped.length;
    for (let k = 0; k < skipped.length; k++) waiters[head + k] = skipped[k];
    if (head > 1024 && head * 2 > waiters.length) {
      waiters = waiters.slice(head);
      head = 0;
    }
  }

  /**
   * A server for the next attempt, or why none: `budget` (deadline passed, or closed) or
   * `all_open` (every breaker stayed open for a reset period plus two probes).
   */
  async function acquire(exclude: Set<number>, deadline: number): Promise<ServerState | 'budget' | 'all_open'> {
    while (true) {
      if (closed || clock.now() >= deadline) return 'budget';
      const s = pick(exclude);
      if (s) return take(s);
      const allOpen = servers.every((x) => x.state === 'open');
      const waitUntil = allOpen
        ? Math.min(
            deadline,
            Math.max(...servers.map((x) => x.openedAt)) +
              opts.breaker.reset_timeout_ms +
              2 * opts.breaker.probe_interval_ms,
          )
        : deadline;
      if (allOpen && clock.now() >= waitUntil) return 'all_open';
      const got = await new Promise<ServerState | null>((resolve) => {
        const timer = setTimeout(
          () => {
            waiter.cancelled = true;
            resolve(null);
          },
          Math.max(1, waitUntil - clock.now()),
        );
        const waiter: Waiter = {
          exclude,
          cancelled: false,
          resolve: (x) => {
            clearTimeout(timer);
            resolve(x);
          },
        };
        waiters.push(waiter);
      });
      if (got) return got;
      if (allOpen && servers.every((x) => x.state === 'open') && clock.now() >= waitUntil - 1) return 'all_open';
    }
  }

  // ---- breaker ---------------------------------------------------------------------------------
  function openBreaker(s: ServerState): void {
    const wasOpen = s.state === 'open';
    s.state = 'open';
    s.openedAt = clock.now();
    if (!wasOpen) s.opens++;
    if (!wasOpen)
      log.warn(
        { server: s.ep.key, failures: s.consecutiveFailures, last_error: s.lastError },
        `reward server ${s.ep.key}: circuit breaker open after ${s.consecutiveFailures} consecutive failures (last: ${s.lastError}); probing ${s.ep.healthUrl} every ${opts.breaker.probe_interval_ms} ms`,
      );
    if (!s.probeTimer && !closed) {
      s.probeTimer = setInterval(() => {
        void probe(s);
      }, opts.breaker.probe_interval_ms);
      s.probeTimer.unref?.();
    }
    // Every server is open now: waiters (which may be waiting for a half-open trial) re-check,
    // so that they wait at most the bounded all-open time, not the whole batch budget.
    if (servers.every((x) => x.state === 'open')) {
      for (let i = head; i < waiters.length; i++)
        if (!waiters[i].cancelled) {
          waiters[i].cancelled = true;
          waiters[i].resolve(null);
        }
      waiters = [];
      head = 0;
    }
  }

  function stopProbes(s: ServerState): void {
    if (s.probeTimer) {
      clearInterval(s.probeTimer);
      s.probeTimer = undefined;
    }
  }

  async function probe(s: ServerState): Promise<void> {
    if (s.probing || s.state !== 'open' || closed) return;
    s.probing = true;
    try {
      const res = await transport.request({
        url: s.ep.healthUrl,
        method: 'GET',
        headers: { accept: 'application/json', ...authHeaders },
        timeoutMs: Math.min(opts.timeout_ms, Math.max(opts.breaker.probe_interval_ms, 1000)),
      });
      if (
        res.status >= 200 &&
        res.status < 300 &&
        s.state === 'open' &&
        clock.now() - s.openedAt >= opts.breaker.reset_timeout_ms &&
        !closed
      ) {
        s.state = 'half_open';
        s.trialInFlight = false;
        stopProbes(s);
        log.info(
          { server: s.ep.key },
          `reward server ${s.ep.key}: health probe ok; circuit breaker half-open (next request is a trial)`,
        );
        pump();
      }
    } catch {
      // still down; keep probing
    } finally {
      s.probing = false;
    }
  }

  /**
   * A streak of `failure_threshold` distinct inputs failed on `s`: re-send the last body it scored.
   * Scored again → the streak's inputs are ones it cannot score (their own failures), the breaker
   * stays closed; failed too (or no canary yet) → the server is failing, open the breaker.
   */
  function suspect(s: ServerState): void {
    if (s.verifying) return;
    if (s.canary === null || closed) {
      openBreaker(s);
      return;
    }
    s.verifying = true;
    const body = s.canary;
    void (async () => {
      let ok = false;
      try {
        const res = await transport.request({
          url: s.ep.scoreUrl,
          method: 'POST',
          headers,
          body,
          timeoutMs: opts.timeout_ms,
        });
        ok = res.status >= 200 && res.status < 300 && parseJson(res.body).ok;
      } catch {
        ok = false;
      }
      s.verifying = false;
      if (ok) {
        log.info(
          { server: s.ep.key, inputs: s.failingInputs.size, last_error: s.lastError },
          `reward server ${s.ep.key}: ${s.failingInputs.size} inputs in a row failed, but it still scores others: those inputs fail on their own (last: ${s.lastError}); circuit breaker stays closed`,
        );
        for (const x of s.failingInputs) {
          ownFault.add(x);
          bound(ownFault);
        }
        s.failingInputs.clear();
        s.consecutiveFailures = 0;
      } else if (s.state === 'closed') openBreaker(s);
      pump();
    })();
  }

  function recordResult(s: ServerState, ms: number, err: AttemptError | null, input: string, body: string): void {
    s.outstanding--;
    const wasTrial = s.trialInFlight;
    s.trialInFlight = false;
    s.requests++;
    counters.requests++;
    const ok = !err || !err.serverFault;
    s.samples[s.sampleNext] = { t: clock.now(), ms, ok };
    s.sampleNext = (s.sampleNext + 1) % SAMPLES;
    if (!ok) {
      s.errors++;
      s.lastFailureAt = clock.now();
      s.lastError = err!.reason;
      results++;
      const first = faultedAt.get(input);
      if (first !== undefined && s.lastSuccess > first && err!.body !== undefined) {
        // the same input failed again on a server that has answered other inputs since, and the server
        // answered (a status or a malformed body: not a refused or timed-out connection): the fault is the input's
        ownFault.add(input);
        bound(ownFault);
        for (const x of servers) x.failingInputs.delete(input);
      } else if (!ownFault.has(input)) {
        s.failingInputs.add(input);
        if (first === undefined) {
          faultedAt.set(input, results);
          bound(faultedAt);
        }
      }
      s.consecutiveFailures = s.failingInputs.size;
      if (s.state === 'half_open' && wasTrial) openBreaker(s);
      else if (s.state === 'closed' && s.consecutiveFailures >= opts.breaker.failure_threshold) suspect(s);
    } else {
      s.consecutiveFailures = 0;
      s.failingInputs.clear();
      s.lastSuccess = ++results;
      s.canary = body;
      ownFault.delete(input);
      faultedAt.delete(input);
      if (s.state === 'half_open' && wasTrial) {
        s.state = 'closed';
        log.info({ server: s.ep.key }, `reward server ${s.ep.key}: trial request ok; circuit breaker closed`);
      }
    }
    pump();
  }

  // ---- one attempt -----------------------------------------------------------------------------
  type AttemptResult =
    | { results: ({ ok: true; reward: number; details: Record<string, unknown> } | { ok: false; err: AttemptError })[] }
    | { err: AttemptError };

  const requestBody = (job: Job) => JSON.stringify(opts.batch_size > 1 ? { items: job.bodies } : job.bodies[0]);

  async function attempt(s: ServerState, job: Job, timeoutMs: number): Promise<AttemptResult> {
    const batch = opts.batch_size > 1;
    const body = requestBody(job);
    const where = s.ep.key;
    let res;
    try {
      res = await transport.request({ url: s.ep.scoreUrl, method: 'POST', headers, body, timeoutMs });
    } catch (e) {
      const retriable = e instanceof RlError ? e.retriable : true;
      return {
        err: {
          reason: `${where}: ${(e as Error).message}`,
          retriable,
          finalRetriable: retriable,
          serverFault: true,
          server: where,
        },
      };
    }
    const kept = truncateBody(res.body, MAX_BODY_KEPT);
    if (res.status < 200 || res.status >= 300) {
      const retriable = res.status === 408 || res.status === 429 || res.status >= 500;
      let detail = res.body.trim().slice(0, 200);
      const parsed = parseJson(res.body);
      if (parsed.ok && parsed.value && typeof (parsed.value as { error?: unknown }).error === 'string')
        detail = (parsed.value as { error: string }).error;
      return {
        err: {
          reason: `${where}: HTTP ${res.status}${detail ? `: ${detail}` : ''}`,
          retriable,
          finalRetriable: retriable,
          serverFault: res.status >= 500 || res.status === 429 || res.status === 408,
          server: where,
          body: kept,
          retryAfterMs: parseRetryAfter(res.retryAfter, Date.now()),
        },
      };
    }
    const malformed = (reason: string): AttemptError => ({
      reason: `${where}: malformed response: ${reason}`,
      retriable: true,
      finalRetriable: false,
      serverFault: true,
      server: where,
      body: kept,
    });
    const parsed = parseJson(res.body);
    if (!parsed.ok) return { err: malformed(parsed.reason) };
    let values: unknown[];
    if (batch) {
      const r = (parsed.value as { results?: unknown } | null)?.results;
      if (!Array.isArray(r)) return { err: malformed('batch response must be {"results": [...]}') };
      if (r.length !== job.items.length)
        return { err: malformed(`batch response has ${r.length} results for ${job.items.length} items`) };
      values = r;
    } else {
      values = [parsed.value];
    }
    const results = values.map((v) => {
      const m = mapResponse(v, weights, range);
      return m.ok ? m : { ok: false as const, err: malformed(m.reason) };
    });
    return { results };
  }

  function backoffMs(attemptNo: number, retryAfterMs?: number): number {
    if (retryAfterMs !== undefined) return Math.min(opts.backoff_max_ms, retryAfterMs);
    const cap = Math.min(opts.backoff_max_ms, opts.backoff_initial_ms * 2 ** Math.max(0, attemptNo - 1));
    return cap / 2 + (clock.random() * cap) / 2; // "equal jitter": at least half the step, spread over the rest
  }

  // ---- a job: one request's items, retried until scored, failed for good, or out of budget ---------
  async function runJob(first: Job, deadline: number, out: Map<string, RewardOutcome>): Promise<void> {
    let job = first;
    let attempts = 0;
    let lastErr: AttemptError | undefined;
    const exclude = new Set<number>();
    const failAll = (items: RewardRequestItem[], reason: string, retriable: boolean, err?: AttemptError) => {
      for (const it of items) {
        out.set(it.id, {
          id: it.id,
          ok: false,
          reason,
          retriable,
          ...(err?.server ? { server: err.server } : {}),
          ...(err?.body !== undefined ? { body: err.body } : {}),
        });
        counters.failures++;
      }
    };
    while (job.items.length > 0) {
      const s = await acquire(exclude, deadline);
      if (s === 'budget') {
        const why = closed ? 'reward client closed' : `batch time budget of ${opts.batch_budget_ms} ms exceeded`;
        failAll(job.items, `${why}${lastErr ? ` (last error: ${lastErr.reason})` : ''}`, true, lastErr);
        return;
      }
      attempts++;
      let err: AttemptError;
      if (s === 'all_open') {
        const detail = servers.map((x) => x.lastError ?? `${x.ep.key}: unavailable`).join('; ');
        err = {
          reason: `no reward server available: all ${servers.length} circuit breakers open (${detail})`,
          retriable: true,
          finalRetriable: true,
          serverFault: false,
          server: lastErr?.server,
          body: lastErr?.body,
        };
      } else {
        const t0 = clock.now();
        const timeout = Math.max(1, Math.min(opts.timeout_ms, deadline - t0));
        const r = await attempt(s, job, timeout);
        // a malformed item in an otherwise good batch response also counts against the server
        const fault =
          'err' in r ? r.err : ((r.results.find((x) => !x.ok) as { err: AttemptError } | undefined)?.err ?? null);
        const input = job.items.map((it) => it.id).join('\u0000');
        recordResult(s, clock.now() - t0, fault, input, requestBody(job));
        if ('err' in r) {
          err = r.err;
        } else {
          const failed: number[] = [];
          r.results.forEach((x, i) => {
            const it = job.items[i];
            if (x.ok) {
              out.set(it.id, { id: it.id, ok: true, reward: x.reward, details: x.details, server: s.ep.key });
              counters.scored++;
            } else failed.push(i);
          });
          if (failed.length === 0) return;
          err = fault!;
          job = { items: failed.map((i) => job.items[i]), bodies: failed.map((i) => job.bodies[i]) };
        }
        exclude.add(s.index);
      }
      lastErr = err!;
      if (!err!.retriable) {
        failAll(job.items, err!.reason, err!.finalRetriable, err!);
        return;
      }
      if (job.items.length === 1 && ownFault.has(job.items[0].id) && err!.body !== undefined) {
        // a server that scores other inputs answered this one with a failure again: retrying it now only
        // slows the rest (a connection that failed says nothing about the input: that one fails over)
        failAll(
          job.items,
          `${err!.reason} (this input failed ${attempts} time(s) where others are scored)`,
          err!.finalRetriable,
          err!,
        );
        return;
      }
      if (attempts > opts.max_retries) {
        failAll(job.items, `${err!.reason} (gave up after ${attempts} attempts)`, err!.finalRetriable, err!);
        return;
      }
      if (job.items.length > 1) {
        // one bad item can fail a whole request: retry each item alone, so the others are scored
        const rest = job;
        await Promise.all(rest.items.map((it, i) => runJob({ items: [it], bodies: [rest.bodies[i]] }, deadline, out)));
        return;
      }
      counters.retries++;
      const delay = backoffMs(attempts, err!.retryAfterMs);
      log.debug(
        { ids: job.items.map((i) => i.id), attempt: attempts, delay_ms: Math.round(delay), reason: err!.reason },
        'reward: retrying',
      );
      if (clock.now() + delay >= deadline) {
        failAll(
          job.items,
          `batch time budget of ${opts.batch_budget_ms} ms exceeded (last error: ${err!.reason})`,
          true,
          err!,
        );
        return;
      }
      await clock.sleep(delay);
      if (exclude.size >= servers.length) exclude.clear();
    }
  }

  return {
    async scoreBatch(items) {
      if (closed) throw new RlError('reward client is closed', { retriable: false });
      const seen = new Set<string>();
      for (const it of items) {
        if (seen.has(it.id))
          throw new RlError(`reward: trajectory id ${it.id} appears twice in one scoreBatch call`, {
            retriable: false,
          });
        seen.add(it.id);
      }
      const deadline = clock.now() + opts.batch_budget_ms;
      const out = new Map<string, RewardOutcome>();
      const jobs: Job[] = [];
      for (let i = 0; i < items.length; i += opts.batch_size) {
        const chunk = items.slice(i, i + opts.batch_size);
        jobs.push({
          items: chunk,
          bodies: chunk.map((it) =>
            Object.fromEntries(
              Object.entries(template)
                .map(([k, f]) => [k, fieldValue(it, f)])
                .filter(([, v]) => v !== undefined),
            ),
          ),
        });
      }
      await Promise.all(jobs.map((j) => runJob(j, deadline, out)));
      // closed while scoring (a stopping run): the batch is neither scored nor failed; the stage
      // abandons it uncommitted and it is redelivered
      if (closed)
        throw new RlError('reward client closed while scoring: the batch is not scored (it is redelivered)', {
          retriable: true,
        });
      const outcomes = items.map(
        (it): RewardOutcome =>
          out.get(it.id) ?? { id: it.id, ok: false, reason: 'internal error: no outcome recorded', retriable: true },
      );
      // one summary line per call, not one per trajectory
      const failed = outcomes.filter((o): o is Extract<RewardOutcome, { ok: false }> => !o.ok);
      if (failed.length > 0) {
        const reasons = [...new Set(failed.map((f) => f.reason))];
        log.warn(
          {
            failed: failed.length,
            of: items.length,
            ids: failed.slice(0, 10).map((f) => f.id),
            reasons: reasons.slice(0, 5),
          },
          `reward: ${failed.length} of ${items.length} trajectories could not be scored (${reasons[0]}${reasons.length > 1 ? `; and ${reasons.length - 1} other reason(s)` : ''})`,
        );
      }
      return outcomes;
    },

    metrics() {
      const m: Record<string, number> = {
        'reward/failures': counters.failures,
        'reward/scored': counters.scored,
        'reward/retries': counters.retries,
        'reward/remote_requests': counters.requests,
      };
      const now = clock.now();
      for (const s of servers) {
        const samples = s.samples.filter(Boolean);
        const lat = samples.map((x) => x.ms).sort((a, b) => a - b);
        const recent = samples.filter((x) => now - x.t <= RATE_WINDOW_MS).length;
        const windowS = Math.max(1e-3, Math.min(RATE_WINDOW_MS, now - startedAt) / 1000);
        const p = `reward_server/${s.ep.key}`;
        m[`${p}/requests_per_s`] = recent / windowS;
        m[`${p}/latency_p50_ms`] = quantile(lat, 0.5);
        m[`${p}/latency_p99_ms`] = quantile(lat, 0.99);
        m[`${p}/error_rate`] = samples.length ? samples.filter((x) => !x.ok).length / samples.length : 0;
        m[`${p}/breaker_open`] = s.state === 'closed' ? 0 : 1;
        m[`${p}/breaker_half_open`] = s.state === 'half_open' ? 1 : 0;
        m[`${p}/outstanding`] = s.outstanding;
        m[`${p}/requests_total`] = s.requests;
        m[`${p}/errors_total`] = s.errors;
        m[`${p}/breaker_opens_total`] = s.opens;
      }
      return m;
    },

    close() {
      if (closed) return;
      closed = true;
      for (const s of servers) stopProbes(s);
      pump();
      transport.close();
    },
  };
}
