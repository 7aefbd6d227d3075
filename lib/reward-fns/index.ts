/**
 * Function rewards: a registry of built-ins for the example tasks plus a user module
 * (`reward.reward_fn_path`: a JS/TS module whose default export — or `reward` export — is a
 * RewardFn). A function that throws, or returns a non-finite reward, is a recorded failure for
 * that trajectory (`{ ok: false, reason }`), never a zero.
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
  /** Extra keyword arguments from `reward.reward_fn_kwargs`. */
  kwargs: Record<string, unknown>;
}

/**
 * `metrics`: numbers (finite) are logged as reward/<name> and can drive filters; booleans count as
 * 1/0; strings (e.g. the extracted answer) are stored with the trajectory's reward_details.
 */
export interface RewardResult { reward: number; metrics?: Record<string, number | boolean | string> }
export type RewardFn = (input: RewardInput) => RewardResult | Promise<RewardResult>;

export type RewardOutcome =
  | { ok: true; reward: number; metrics: Record<string, number | string> }
  | { ok: false; reason: string };

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
 */
export const accuracyWithFormat: RewardFn = (input) => {
  const acc = exactMatch(input) as RewardResult;
  const fmt = integerFormat(input) as RewardResult;
  const w = typeof input.kwargs.format_weight === 'number' ? input.kwargs.format_weight : 0.1;
  const a = acc.metrics!.accuracy as number, f = fmt.metrics!.format as number;
  return { reward: a + w * f, metrics: { accuracy: a, format: f, overall: a } };
};

export const rewardFns = new Registry<RewardFn>('reward.reward_fn', {
  exact_match: exactMatch,
  format: integerFormat,
  number_game: accuracyWithFormat,
  arithmetic: accuracyWithFormat,
});

/** Loads `reward.reward_fn_path`; the module must export a function as default or as `reward`. */
export async function loadRewardModule(path: string): Promise<RewardFn> {
  const abs = resolve(path);
  if (!existsSync(abs)) throw new ConfigError(`reward.reward_fn_path: file not found: ${abs}`);
  let mod: Record<string, unknown>;
  try { mod = await import(pathToFileURL(abs).href); } catch (e) {
    throw new ConfigError(`reward.reward_fn_path: cannot load ${abs}: ${(e as Error).message}`);
  }
  const fn = (typeof mod.default === 'function' ? mod.default : mod.reward) as RewardFn | undefined;
  if (typeof fn !== 'function') throw new ConfigError(`reward.reward_fn_path: ${abs} must export a function (default export or \`export function reward\`) returning {reward, metrics}`);
  return fn;
}

/** Runs a reward function for one trajectory; throws and non-finite rewards become failures. */
export async function applyRewardFn(fn: RewardFn, input: RewardInput): Promise<RewardOutcome> {
  let out: RewardResult;
  try { out = await fn(input); } catch (e) {
    return { ok: false, reason: `reward function threw: ${(e as Error)?.message ?? String(e)}` };
  }
  if (!out || typeof out !== 'object' || typeof out.reward !== 'number') return { ok: false, reason: `reward function returned ${JSON.stringify(out)?.slice(0, 200)}; expected {reward: number, metrics?}` };
  if (!Number.isFinite(out.reward)) return { ok: false, reason: `reward function returned a non-finite reward (${out.reward})` };
  const metrics: Record<string, number | string> = {};
  for (const [k, v] of Object.entries(out.metrics ?? {})) {
    if (typeof v === 'boolean') metrics[k] = v ? 1 : 0;
    else if (typeof v === 'string') metrics[k] = v;
    else if (typeof v !== 'number' || !Number.isFinite(v)) return { ok: false, reason: `reward function returned metric ${k}=${typeof v === 'number' ? v : JSON.stringify(v)?.slice(0, 100)}; a metric is a finite number, a boolean or a string` };
    else metrics[k] = v;
  }
  if (metrics.overall === undefined) metrics.overall = out.reward;
  return { ok: true, reward: out.reward, metrics };
}
