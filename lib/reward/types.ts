/**
 * Types shared by the outside-reward pieces: the HTTP reward client (used inside the reward
 * stage), the `rlstream reward-server`, and the in-process ONNX reward model.
 *
 * The option types use exactly the snake_case names of the run config's `reward.remote`,
 * `reward.on_failure` and `reward.model` sections, so the parsed config section can be passed
 * straight in. This module does not import lib/config on purpose (no dependency on its schema).
 */
import { ConfigError } from '../errors.ts';

/** Trajectory fields a request template may map to a JSON body field. */
export const TRAJECTORY_FIELDS = [
  'prompt_text',
  'response_text',
  'ground_truth',
  'image_base64_png',
  'id',
  'step',
] as const;
export type TrajectoryField = (typeof TRAJECTORY_FIELDS)[number];

/** Names of the built-in request shapes (`reward.remote.request_preset`). */
export const REQUEST_PRESET_NAMES = ['seed_image_prompt', 'text'] as const;
export type RequestPreset = (typeof REQUEST_PRESET_NAMES)[number];

/** Built-in request shapes. `seed_image_prompt` is the `/score` protocol's `{image, prompt}` body. */
export const REQUEST_PRESETS: Record<RequestPreset, Record<string, TrajectoryField>> = {
  seed_image_prompt: { image: 'image_base64_png', prompt: 'prompt_text' },
  text: { prompt: 'prompt_text', response: 'response_text', ground_truth: 'ground_truth' },
};

export interface BreakerOptions {
  /** Consecutive failed requests that open the breaker. */
  failure_threshold: number;
  /** Minimum time an open breaker stays open before a healthy probe may half-open it. */
  reset_timeout_ms: number;
  /** Interval of the `/healthz` probes sent to a server whose breaker is open. */
  probe_interval_ms: number;
}

/**
 * `reward.remote`: scoring by HTTP reward servers speaking the `/score` protocol. Nullable
 * fields are null (or absent) when not set, as in the parsed run config.
 */
export interface RemoteRewardOptions {
  /** null → on (the config loader resolves null from reward.type and DISABLE_RL_REWARD_MODEL). */
  enabled: boolean | null;
  /** Server base URLs (`http://host:port`); `/score` and `/healthz` are appended. Wins over host. */
  urls?: string[] | null;
  /** Seed-style list: `http://host:start_port`, …, `http://host:start_port+count-1`. */
  host?: string | null;
  start_port?: number;
  count?: number;
  request_preset: RequestPreset;
  /** Body field → trajectory field; replaces the preset when given. */
  request_template?: Record<string, TrajectoryField> | null;
  /**
   * reward = Σ weights[k] · response[k]; every weighted field must be a number within `range`
   * (default [0, 1]).
   */
  response_mapping: { weights: Record<string, number>; range?: readonly [number, number] };
  auth_header: string;
  /** Prefix before the token in auth_header (default "Bearer"; "" = the bare token). */
  auth_scheme?: string;
  /** Name of the environment variable that holds the auth token (the token is never logged). */
  auth_token_env?: string | null;
  timeout_ms: number;
  max_retries: number;
  backoff_initial_ms: number;
  backoff_max_ms: number;
  concurrency_per_server: number;
  /** Items per request; > 1 sends the batch form `{items: [...]}` and expects `{results: [...]}`. */
  batch_size: number;
  breaker: BreakerOptions;
  /** Total time budget of one `scoreBatch` call; items still unscored then fail (retriable). */
  batch_budget_ms: number;
}

/** `reward.on_failure`: what to do with a group in which some trajectory could not be scored. */
export type OnFailurePolicy = 'retry' | 'drop_group' | 'stop';

/** `reward.model`: an ONNX sequence scorer run in process. */
export interface RewardModelOptions {
  path: string | null;
  /** Applied to the raw score: reward = scale · transform(score). */
  transform: 'none' | 'sigmoid';
  scale: number;
  /** If set, reward = 1 when scale · transform(score) ≥ threshold, else 0. */
  threshold?: number | null;
}

/** Defaults of `reward.remote` (the same numbers as the run config's schema). */
export const REMOTE_REWARD_DEFAULTS: RemoteRewardOptions = {
  enabled: true,
  request_preset: 'seed_image_prompt',
  response_mapping: { weights: { vlm_score: 0.5, ocr_confidence: 0.5 }, range: [0, 1] },
  auth_header: 'Authorization',
  auth_scheme: 'Bearer',
  timeout_ms: 30_000,
  max_retries: 5,
  backoff_initial_ms: 200,
  backoff_max_ms: 10_000,
  concurrency_per_server: 4,
  batch_size: 1,
  breaker: { failure_threshold: 5, reset_timeout_ms: 10_000, probe_interval_ms: 2_000 },
  batch_budget_ms: 600_000,
};

/** Fills defaults into a partial `reward.remote` (tests, benchmarks, programmatic use). */
export function withRemoteDefaults(
  partial: Partial<Omit<RemoteRewardOptions, 'breaker'>> & { breaker?: Partial<BreakerOptions> },
): RemoteRewardOptions {
  return {
    ...REMOTE_REWARD_DEFAULTS,
    ...partial,
    response_mapping: partial.response_mapping ?? REMOTE_REWARD_DEFAULTS.response_mapping,
    breaker: { ...REMOTE_REWARD_DEFAULTS.breaker, ...(partial.breaker ?? {}) },
  };
}

/** One trajectory to score. */
export interface RewardRequestItem {
  id: string;
  step: number;
  prompt_text: string;
  response_text: string;
  ground_truth?: string;
  /** The images to score as PNG bytes: the prompt's, or an image policy's generated one (the first is sent as `image_base64_png`). */
  images?: Buffer[];
}

/** Per-item result. A failure is never a zero reward: it carries its reason (and the offending body). */
export type RewardOutcome =
  | { id: string; ok: true; reward: number; details: Record<string, unknown>; server: string }
  | { id: string; ok: false; reason: string; retriable: boolean; server?: string; body?: string };

/**
 * Whether remote scoring is on: `reward.remote.enabled` (null counts as on) and not switched off
 * by the `DISABLE_RL_REWARD_MODEL=true` (or `1`/`yes`) environment variable — debug mode,
 * rewards then come from the reward function only.
 */
export function isRemoteRewardEnabled(
  opts: Pick<RemoteRewardOptions, 'enabled'> | undefined | null,
  env: NodeJS.ProcessEnv = process.env,
): boolean {
  if (!opts || opts.enabled === false) return false;
  const v = (env.DISABLE_RL_REWARD_MODEL ?? '').trim().toLowerCase();
  return !(v === 'true' || v === '1' || v === 'yes');
}

/** A reward server: its key (`host:port`, used in metric names), `/score` and `/healthz` URLs. */
export interface ServerEndpoint {
  key: string;
  scoreUrl: string;
  healthUrl: string;
}

/** Server list from `urls` or `host` + `start_port` + `count`; a ConfigError says what to set. */
export function resolveServerEndpoints(
  opts: Pick<RemoteRewardOptions, 'urls' | 'host' | 'start_port' | 'count'>,
): ServerEndpoint[] {
  let bases: string[];
  if (opts.urls && opts.urls.length > 0) {
    if (opts.host)
      throw new ConfigError(
        'reward.remote: `urls` and `host` are both set — use either the URL list or host + start_port + count',
      );
    bases = opts.urls;
  } else if (opts.host) {
    const start = opts.start_port ?? 8000,
      count = opts.count ?? 1;
    if (!Number.isInteger(count) || count < 1)
      throw new ConfigError(`reward.remote.count: ${count} must be a positive integer`);
    if (!Number.isInteger(start) || start < 1 || start + count - 1 > 65535)
      throw new ConfigError(
        `reward.remote.start_port: ${start} (+ count ${count}) does not give valid ports (1–65535)`,
      );
    const h = opts.host.includes(':') && !opts.host.startsWith('[') ? `[${opts.host}]` : opts.host;
    bases = Array.from({ length: count }, (_, i) => `http://${h}:${start + i}`);
  } else {
    throw new ConfigError(
      'reward.remote: no reward servers configured — set `urls: [http://host:port, …]` or `host` (with start_port and count), or switch remote rewards off (reward.remote.enabled: false / DISABLE_RL_REWARD_MODEL=true)',
    );
  }
  const seen = new Set<string>();
  return bases.map((raw, i) => {
    let u: URL;
    try {
      u = new URL(raw);
    } catch {
      throw new ConfigError(`reward.remote.urls[${i}]: "${raw}" is not a URL (expected http://host:port)`);
    }
    if (u.protocol !== 'http:' && u.protocol !== 'https:')
      throw new ConfigError(`reward.remote.urls[${i}]: "${raw}" must be http:// or https://`);
    let path = u.pathname.replace(/\/+$/, '');
    if (path.endsWith('/score')) path = path.slice(0, -'/score'.length);
    const base = `${u.protocol}//${u.host}${path}`;
    if (seen.has(base)) throw new ConfigError(`reward.remote.urls[${i}]: "${raw}" is listed twice`);
    seen.add(base);
    return { key: `${u.host}${path}`, scoreUrl: `${base}/score`, healthUrl: `${base}/healthz` };
  });
}

/** Truncates a response body kept in a failure record. */
export function truncateBody(s: string, max = 512): string {
  return s.length <= max ? s : `${s.slice(0, max)}… (${s.length} chars)`;
}

/**
 * `reward.type`'s values: the reward backends. The registry in backends.ts is typed to hold exactly
 * these names (one loader each), and the config schema's enum is this list.
 */
export const REWARD_TYPES = ['function', 'remote', 'model'] as const;
export type RewardType = (typeof REWARD_TYPES)[number];
