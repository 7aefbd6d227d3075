/**
 * Function rewards: a registry of built-ins for the example tasks plus a user module
 * (`reward.reward_fn_path`, a JS/TS module), in one of two shapes:
 *  - rlstream's: the default export (or the `reward` export) is called with one object
 *    `{prompt, response, ground_truth, data_source, extra_info, kwargs}`;
 *  - verl's: an export named `compute_score` is called with the positional arguments
 *    `(data_source, solution_str, ground_truth, extra_info, kwargs)` (verl passes the kwargs as
 *    keyword arguments; here they are one object after extra_info).
 * Either may return `{reward, metrics?}`, a bare number (or boolean), or verl's `{score, …}`
 * whose other keys are its metrics. A function that throws, or returns a non-finite reward, is a
 * recorded failure for that trajectory (`{ ok: false, reason }`), never a zero.
 */
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';
import { existsSync } from 'node:fs';
import { ConfigError } from '../errors.ts';
import { Registry } from '../util/registry.ts';

export interface RewardInput {
  prompt: string;
  response: string;
  ground_truth: string;
  /** The row's `data_source` (verl), else the dataset (file names or data.task). */
  data_source?: string;
  /** The row's `extra_info` object (verl), else {}. */
  extra_info?: Record<string, unknown>;
  /** Extra keyword arguments from `reward.reward_fn_kwargs`. */
  kwargs: Record<string, unknown>;
  /** PNG bytes of the sample's images: the prompt's, or an image policy's generated one (absent: none). */
  images?: Uint8Array[];
}

/**
 * `metrics`: numbers (finite) are logged as reward/<name> and can drive filters; booleans count as
 * 1/0; strings (e.g. the extracted answer) are stored with the trajectory's reward_details.
 */
export interface RewardResult {
  reward: number;
  metrics?: Record<string, number | boolean | string>;
}
/** What a user function may return: {reward, metrics?}, a bare number or boolean, or verl's {score, …}. */
export type RewardReturn = RewardResult | number | boolean | ({ score: number | boolean } & Record<string, unknown>);
export type RewardFn = (input: RewardInput) => RewardReturn | Promise<RewardReturn>;
/** verl's shape: compute_score(data_source, solution_str, ground_truth, extra_info, kwargs). */
export type VerlComputeScore = (
  dataSource: string,
  solutionStr: string,
  groundTruth: string,
  extraInfo: Record<string, unknown>,
  kwargs: Record<string, unknown>,
) => unknown;

/** extra_info as the trajectories carry it (JSON object text, "{}" when none) → an object. */
export function parseExtraInfo(text: string | undefined | null): Record<string, unknown> {
  if (!text) return {};
  try {
    const v: unknown = JSON.parse(text);
    return v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

export type RewardOutcome =
  { ok: true; reward: number; metrics: Record<string, number | string> } | { ok: false; reason: string };

const normalise = (s: string) => s.trim();

/** 1 when the response (trimmed) equals the ground truth (trimmed), else 0. Metrics: accuracy. */
export const exactMatch: RewardFn = ({ response, ground_truth }) => {
  const acc = normalise(response) === normalise(ground_truth) ? 1 : 0;
  return { reward: acc, metrics: { accuracy: acc } };
};

/** 1 when the response is a bare integer (the answer format of the built-in tasks), else 0. */
export const integerFormat: RewardFn = ({ response }) => {
  const ok = /^-?\d+$/.test(normalise(response)) ? 1 : 0;
  return { reward: ok, metrics: { format: ok } };
};

/**
 * Accuracy plus a small format term: reward = accuracy + format_weight · format (EasyR1's math
 * reward has the same shape). `format_weight` (kwarg, default 0.1) keeps the signal dense early.
 * Metrics as EasyR1's: overall (the total score, = the reward), accuracy, format.
 */
export const accuracyWithFormat: RewardFn = (input) => {
  const acc = exactMatch(input) as RewardResult;
  const fmt = integerFormat(input) as RewardResult;
  const w = typeof input.kwargs.format_weight === 'number' ? input.kwargs.format_weight : 0.1;
  const a = acc.metrics!.accuracy as number,
    f = fmt.metrics!.format as number;
  return { reward: a + w * f, metrics: { overall: a + w * f, accuracy: a, format: f } };
};

/**
 * GSM8K-style answers: the number after the last `####` (commas dropped), compared exactly with the
 * ground truth's number. reward = accuracy + format_weight · format, where format = 1 when the
 * response ends with `#### <integer>` (kwarg format_weight, default 0.1). Metrics: overall,
 * accuracy, format and the extracted answer (verl's gsm8k score reads the same `#### n` line).
 */
export const gsm8k: RewardFn = ({ response, ground_truth, kwargs }) => {
  const num = (s: string) => s.replaceAll(',', '').trim();
  const m = /####\s*(-?[\d,]*\.?\d+)/g;
  let last: string | null = null;
  for (const x of response.matchAll(m)) last = num(x[1]);
  const truth = num(/####\s*(.*)$/.exec(ground_truth)?.[1] ?? ground_truth);
  const acc = last !== null && Number(last) === Number(truth) && truth !== '' ? 1 : 0;
  const fmt = /####\s*-?\d+\s*$/.test(response) ? 1 : 0;
  const w = typeof kwargs.format_weight === 'number' ? kwargs.format_weight : 0.1;
  return { reward: acc + w * fmt, metrics: { overall: acc + w * fmt, accuracy: acc, format: fmt, answer: last ?? '' } };
};

export const rewardFns = new Registry<RewardFn>('reward.reward_fn', {
  gsm8k,
  exact_match: exactMatch,
  format: integerFormat,
  number_game: accuracyWithFormat,
  number_game_vision: accuracyWithFormat,
  arithmetic: accuracyWithFormat,
});

/**
 * Loads `reward.reward_fn_path`: its default export or `reward` export (called with one object),
 * else its `compute_score` export (verl's name and positional arguments). With `exportName`
 * (`reward.reward_fn_name`), that export, called verl-style.
 */
export async function loadRewardModule(path: string, exportName: string | null = null): Promise<RewardFn> {
  const abs = resolve(path);
  if (!existsSync(abs)) throw new ConfigError(`reward.reward_fn_path: file not found: ${abs}`);
  let mod: Record<string, unknown>;
  try {
    mod = await import(pathToFileURL(abs).href);
  } catch (e) {
    throw new ConfigError(`reward.reward_fn_path: cannot load ${abs}: ${(e as Error).message}`);
  }
  if (exportName !== null) {
    const named = mod[exportName];
    if (typeof named !== 'function') {
      const has = Object.keys(mod).filter((k) => typeof mod[k] === 'function');
      throw new ConfigError(
        `reward.reward_fn_name: ${abs} has no exported function "${exportName}" (it exports ${has.length ? has.join(', ') : 'no functions'})`,
      );
    }
    const verl = named as VerlComputeScore;
    return (i) => verl(i.data_source ?? '', i.response, i.ground_truth, i.extra_info ?? {}, i.kwargs) as RewardReturn;
  }
  const fn = (typeof mod.default === 'function' ? mod.default : mod.reward) as RewardFn | undefined;
  if (typeof fn === 'function') return fn;
  if (typeof mod.compute_score === 'function') {
    const verl = mod.compute_score as VerlComputeScore;
    return (i) => verl(i.data_source ?? '', i.response, i.ground_truth, i.extra_info ?? {}, i.kwargs) as RewardReturn;
  }
  const has = Object.keys(mod).filter((k) => k !== 'default');
  throw new ConfigError(
    `reward.reward_fn_path: ${abs} must export a function: \`export default function ({prompt, response, ground_truth, data_source, extra_info, kwargs})\` (or \`export function reward\`), or verl's \`export function compute_score(data_source, solution_str, ground_truth, extra_info)\`; it exports ${has.length ? has.join(', ') : 'nothing'}`,
  );
}

/** A function's return value → {reward, metrics}, or why it is not one. */
function normaliseReturn(out: unknown): RewardResult | string {
  if (typeof out === 'number') return { reward: out };
  if (typeof out === 'boolean') return { reward: out ? 1 : 0 };
  if (out && typeof out === 'object') {
    const o = out as Record<string, unknown>;
    if (typeof o.reward === 'number') return o as unknown as RewardResult;
    if (typeof o.score === 'number' || typeof o.score === 'boolean') {
      // verl: {score, ...extra}: the other keys are reported like metrics
      const { score, ...rest } = o;
      const metrics: Record<string, number | boolean | string> = {};
      for (const [k, v] of Object.entries(rest))
        metrics[k] =
          typeof v === 'number' || typeof v === 'boolean' || typeof v === 'string'
            ? v
            : (JSON.stringify(v) ?? String(v));
      return { reward: typeof score === 'boolean' ? (score ? 1 : 0) : score, metrics };
    }
  }
  return `reward function returned ${JSON.stringify(out)?.slice(0, 200)}; expected a number, {reward: number, metrics?} or {score: number, …}`;
}

/** Runs a reward function for one trajectory; throws and non-finite rewards become failures. */
export async function applyRewardFn(fn: RewardFn, input: RewardInput): Promise<RewardOutcome> {
  let raw: unknown;
  try {
    raw = await fn(input);
  } catch (e) {
    return { ok: false, reason: `reward function threw: ${(e as Error)?.message ?? String(e)}` };
  }
  const out = normaliseReturn(raw);
  if (typeof out === 'string') return { ok: false, reason: out };
  if (!Number.isFinite(out.reward))
    return { ok: false, reason: `reward function returned a non-finite reward (${out.reward})` };
  const metrics: Record<string, number | string> = {};
  for (const [k, v] of Object.entries(out.metrics ?? {})) {
    if (typeof v === 'boolean') metrics[k] = v ? 1 : 0;
    else if (typeof v === 'string') metrics[k] = v;
    else if (typeof v !== 'number' || !Number.isFinite(v))
      return {
        ok: false,
        reason: `reward function returned metric ${k}=${typeof v === 'number' ? v : JSON.stringify(v)?.slice(0, 100)}; a metric is a finite number, a boolean or a string`,
      };
    else metrics[k] = v;
  }
  if (metrics.overall === undefined) metrics.overall = out.reward;
  return { ok: true, reward: out.reward, metrics };
}
