/**
 * Golden-case runner for lib/rl against verl's core_algos (test/fixtures/golden/rl_golden.json, a
 * copy of shared/golden; its README states the conventions and tolerances used here).
 *
 * Each case is dispatched by `function` to an adapter that maps the JSON args/inputs onto the
 * lib/rl API. Outputs are compared with |got − exp| ≤ atol + rtol·|exp| (per-output tolerance class
 * from the README), plus structural checks: shapes, dtype of tensor outputs, exact zero and NaN
 * positions, and error-vs-no-error (error cases must throw; any error type).
 */
import { readFileSync } from 'node:fs';
import * as rl from '../../../lib/rl/index.ts';
import { RlError } from '../../../lib/errors.ts';
import type { FloatArray, Tensor2D } from '../../../lib/rl/index.ts';

export type Dtype = 'float32' | 'float64';

export interface GoldenCase {
  id: string;
  function: string;
  dtype: Dtype;
  args: Record<string, any>;
  inputs: Record<string, any>;
  outputs: Record<string, any>;
  notes?: string;
}

export interface GoldenFile {
  commit: string;
  cases: GoldenCase[];
}

export function loadGolden(path: string): GoldenFile {
  return JSON.parse(readFileSync(path, 'utf8')) as GoldenFile;
}

// ---- parsing ---------------------------------------------------------------------------------

const num = (v: unknown): number => {
  if (typeof v === 'number') return v;
  if (v === 'NaN') return NaN;
  if (v === 'Infinity') return Infinity;
  if (v === '-Infinity') return -Infinity;
  throw new Error(`not a number: ${JSON.stringify(v)}`);
};

/** Shape and flattened values of a nested JSON array (or a scalar: shape []). */
export function flatten(v: unknown): { shape: number[]; values: number[] } {
  const shape: number[] = [];
  let cur: unknown = v;
  while (Array.isArray(cur)) {
    shape.push(cur.length);
    cur = cur[0];
  }
  const values: number[] = [];
  const walk = (x: unknown, depth: number) => {
    if (depth === shape.length) {
      values.push(num(x));
      return;
    }
    if (!Array.isArray(x) || x.length !== shape[depth]) throw new Error('ragged nested array');
    for (const y of x) walk(y, depth + 1);
  };
  walk(v, 0);
  return { shape, values };
}

function arr(dtype: Dtype, values: number[]): FloatArray {
  return dtype === 'float32' ? Float32Array.from(values) : Float64Array.from(values);
}

function t2(c: GoldenCase, name: string): Tensor2D {
  const { shape, values } = flatten(c.inputs[name]);
  if (shape.length !== 2) throw new Error(`${c.id}: input ${name} is not 2-D`);
  return { data: arr(c.dtype, values), bs: shape[0], T: shape[1] };
}
function opt2(c: GoldenCase, name: string): Tensor2D | undefined {
  return c.inputs[name] === undefined || c.inputs[name] === null ? undefined : t2(c, name);
}
function t1(c: GoldenCase, name: string): FloatArray {
  return arr(c.dtype, flatten(c.inputs[name]).values);
}

// ---- outputs ---------------------------------------------------------------------------------

/** A tensor output (with its shape) or a scalar. */
export type Out = number | { data: ArrayLike<number>; shape: number[] };

const T2 = (t: Tensor2D): Out => ({ data: t.data, shape: [t.bs, t.T] });
const V1 = (a: ArrayLike<number>): Out => ({ data: a, shape: [a.length] });

type Adapter = (c: GoldenCase) => Record<string, Out>;

const advOut = (o: { advantages: Tensor2D; returns: Tensor2D }) => ({
  advantages: T2(o.advantages),
  returns: T2(o.returns),
});
const advIn = (c: GoldenCase): rl.AdvantageInput => ({
  token_level_rewards: t2(c, 'token_level_rewards'),
  response_mask: t2(c, 'response_mask'),
  index: c.inputs.index,
  values: opt2(c, 'values'),
  reward_baselines: c.inputs.reward_baselines === undefined ? undefined : t1(c, 'reward_baselines'),
  old_log_probs: opt2(c, 'old_log_probs'),
  sum_pi_squared: opt2(c, 'sum_pi_squared'),
  rollout_is_weights: opt2(c, 'rollout_is_weights'),
});

const lossIn = (c: GoldenCase, old = 'old_log_prob'): rl.PolicyLossInput => ({
  old_log_prob: t2(c, old),
  log_prob: t2(c, 'log_prob'),
  advantages: t2(c, 'advantages'),
  response_mask: t2(c, 'response_mask'),
  rollout_is_weights: opt2(c, 'rollout_is_weights'),
});

/** The outputs the golden case lists, picked from a policy-loss result. */
function lossOut(c: GoldenCase, o: rl.PolicyLossOutput): Record<string, Out> {
  const r: Record<string, Out> = {};
  for (const k of Object.keys(c.outputs)) {
    if (k === 'pg_loss') r[k] = o.pg_loss;
    else if (o.metrics[k] !== undefined) r[k] = o.metrics[k]!;
  }
  return r;
}

const clipArgs = (a: Record<string, any>) => ({
  clip_ratio: a.clip_ratio,
  clip_ratio_low: a.clip_ratio_low,
  clip_ratio_high: a.clip_ratio_high,
});
const aggMode = (m: string | undefined) => (m && !/\(/.test(m) ? m : undefined);

export const adapters: Record<string, Adapter> = {
  compute_gae_advantage_return: (c) =>
    advOut(rl.computeGaeAdvantageReturn(advIn(c), { gamma: c.args.gamma, lam: c.args.lam })),
  compute_grpo_outcome_advantage: (c) =>
    advOut(
      rl.computeGrpoOutcomeAdvantage(advIn(c), {
        epsilon: c.args.epsilon,
        norm_adv_by_std_in_grpo: c.args.norm_adv_by_std_in_grpo,
      }),
    ),
  compute_grpo_vectorized_outcome_advantage: (c) =>
    advOut(
      rl.computeGrpoVectorizedOutcomeAdvantage(advIn(c), {
        epsilon: c.args.epsilon,
        norm_adv_by_std_in_grpo: c.args.norm_adv_by_std_in_grpo,
      }),
    ),
  compute_grpo_passk_outcome_advantage: (c) =>
    advOut(
      rl.computeGrpoPasskOutcomeAdvantage(advIn(c), {
        epsilon: c.args.epsilon,
        norm_adv_by_std_in_grpo: c.args['config.norm_adv_by_std_in_grpo'],
      }),
    ),
  compute_rloo_outcome_advantage: (c) => advOut(rl.computeRlooOutcomeAdvantage(advIn(c), { epsilon: c.args.epsilon })),
  compute_rloo_vectorized_outcome_advantage: (c) =>
    advOut(rl.computeRlooVectorizedOutcomeAdvantage(advIn(c), { epsilon: c.args.epsilon })),
  compute_reinforce_plus_plus_outcome_advantage: (c) =>
    advOut(rl.computeReinforcePlusPlusOutcomeAdvantage(advIn(c), { gamma: c.args['config.gamma'] })),
  compute_reinforce_plus_plus_baseline_outcome_advantage: (c) =>
    advOut(rl.computeReinforcePlusPlusBaselineOutcomeAdvantage(advIn(c), { epsilon: c.args.epsilon })),
  compute_remax_outcome_advantage: (c) => advOut(rl.computeRemaxOutcomeAdvantage(advIn(c))),
  compute_opo_outcome_advantage: (c) => advOut(rl.computeOpoOutcomeAdvantage(advIn(c), { epsilon: c.args.epsilon })),
  compute_gpg_outcome_advantage: (c) =>
    advOut(rl.computeGpgOutcomeAdvantage(advIn(c), { epsilon: c.args.epsilon, f_norm: c.args.f_norm })),
  compute_optimal_token_baseline_advantage: (c) =>
    advOut(
      rl.computeOptimalTokenBaselineAdvantage(advIn(c), {
        epsilon: c.args.epsilon,
        handle_zero_tail: c.args.handle_zero_tail,
      }),
    ),
  compute_multi_turn_optimal_token_baseline_advantage: (c) =>
    advOut(
      rl.computeMultiTurnOptimalTokenBaselineAdvantage(advIn(c), {
        epsilon: c.args.epsilon,
        handle_zero_tail: c.args.handle_zero_tail,
      }),
    ),

  kl_penalty: (c) => {
    const lp = t2(c, 'logprob'),
      ref = t2(c, 'ref_logprob');
    return {
      kl: T2(rl.klPenalty(lp, ref, c.args.kl_penalty)),
      grad_logprob_of_sum: T2(rl.klPenaltyGrad(lp, ref, c.args.kl_penalty)),
    };
  },
  compute_rewards: (c) => ({
    token_level_rewards: T2(
      rl.computeRewards(t2(c, 'token_level_scores'), t2(c, 'old_log_prob'), t2(c, 'ref_log_prob'), c.args.kl_ratio),
    ),
  }),

  compute_policy_loss: (c) =>
    lossOut(
      c,
      rl.computePolicyLossVanilla(lossIn(c), {
        clip_ratio: c.args.cliprange,
        clip_ratio_low: c.args.cliprange_low,
        clip_ratio_high: c.args.cliprange_high,
        clip_ratio_c: c.args.clip_ratio_c,
        loss_agg_mode: c.args.loss_agg_mode,
      }),
    ),
  compute_policy_loss_vanilla: (c) =>
    lossOut(
      c,
      rl.policyLosses.get('vanilla')(lossIn(c), {
        ...clipArgs(c.args),
        clip_ratio_c: c.args.clip_ratio_c,
        loss_agg_mode: c.args.loss_agg_mode,
        global_batch_info: c.args.global_batch_info,
      }),
    ),
  compute_policy_loss_gspo: (c) =>
    lossOut(
      c,
      rl.policyLosses.get('gspo')(lossIn(c), { ...clipArgs(c.args), loss_agg_mode: aggMode(c.args.loss_agg_mode) }),
    ),
  compute_policy_loss_sapo: (c) =>
    lossOut(c, rl.policyLosses.get('sapo')(lossIn(c), { tau_pos: c.args.tau_pos, tau_neg: c.args.tau_neg })),
  compute_policy_loss_gpg: (c) =>
    lossOut(c, rl.policyLosses.get('gpg')(lossIn(c), { loss_agg_mode: c.args.loss_agg_mode })),
  compute_policy_loss_cispo: (c) =>
    lossOut(c, rl.policyLosses.get('cispo')(lossIn(c), { ...clipArgs(c.args), loss_agg_mode: c.args.loss_agg_mode })),
  compute_policy_loss_reinforce: (c) =>
    lossOut(
      c,
      rl.policyLosses.get('reinforce')(lossIn(c, 'rollout_log_prob'), { loss_agg_mode: c.args.loss_agg_mode }),
    ),
  compute_policy_loss_geo_mean: (c) => lossOut(c, rl.policyLosses.get('geo_mean')(lossIn(c), { ...clipArgs(c.args) })),
  compute_policy_loss_clip_cov: (c) =>
    lossOut(
      c,
      rl.policyLosses.get('clip_cov')(lossIn(c), {
        ...clipArgs(c.args),
        clip_cov_ratio: c.args.clip_cov_ratio,
        clip_cov_lb: c.args.clip_cov_lb,
        clip_cov_ub: c.args.clip_cov_ub,
        loss_agg_mode: c.args.loss_agg_mode,
      }),
    ),
  compute_policy_loss_kl_cov: (c) =>
    lossOut(
      c,
      rl.policyLosses.get('kl_cov')(lossIn(c), {
        kl_cov_ratio: c.args.kl_cov_ratio,
        ppo_kl_coef: c.args.ppo_kl_coef,
        loss_agg_mode: c.args.loss_agg_mode,
      }),
    ),

  compute_value_loss: (c) => {
    const o = rl.computeValueLoss(
      {
        vpreds: t2(c, 'vpreds'),
        returns: t2(c, 'returns'),
        values: t2(c, 'values'),
        response_mask: t2(c, 'response_mask'),
      },
      { cliprange_value: c.args.cliprange_value, loss_agg_mode: c.args.loss_agg_mode },
    );
    return { vf_loss: o.vf_loss, vf_clipfrac: o.vf_clipfrac };
  },
  entropy_from_logits: (c) => {
    const { shape, values } = flatten(c.inputs.logits);
    return { entropy: T2(rl.entropyFromLogits(rl.tensor3d(arr(c.dtype, values), shape[0], shape[1], shape[2]))) };
  },
  compute_entropy_loss: (c) => {
    const { shape, values } = flatten(c.inputs.logits);
    return {
      entropy_loss: rl.computeEntropyLoss(
        rl.tensor3d(arr(c.dtype, values), shape[0], shape[1], shape[2]),
        t2(c, 'response_mask'),
        c.args.loss_agg_mode,
      ),
    };
  },
  agg_loss: (c) => ({
    loss: rl.aggLoss(t2(c, 'loss_mat'), t2(c, 'loss_mask'), c.args.loss_agg_mode, {
      dp_size: c.args.dp_size,
      batch_num_tokens: c.args.batch_num_tokens,
      global_batch_size: c.args.global_batch_size,
      loss_scale_factor: c.args.loss_scale_factor,
    }),
  }),
  masked_sum: (c) => ({
    out:
      c.args.axis === -1
        ? V1(rl.maskedSumRows(t2(c, 'values'), t2(c, 'mask')))
        : rl.maskedSum(t2(c, 'values'), t2(c, 'mask')),
  }),
  masked_mean: (c) => ({
    out:
      c.args.axis === -1
        ? V1(rl.maskedMeanRows(t2(c, 'values'), t2(c, 'mask')))
        : rl.maskedMean(t2(c, 'values'), t2(c, 'mask')),
  }),
  masked_var: (c) => ({ out: rl.maskedVar(t2(c, 'values'), t2(c, 'mask'), c.args.unbiased) }),
  masked_whiten: (c) => ({ out: T2(rl.maskedWhiten(t2(c, 'values'), t2(c, 'mask'), c.args.shift_mean)) }),
  clip_by_value: (c) => ({ out: T2(rl.clipByValue(t2(c, 'x'), t2(c, 'tensor_min'), t2(c, 'tensor_max'))) }),
  AdaptiveKLController: (c) => {
    let ctrl: rl.KlController = rl.makeKlController({
      type: 'adaptive',
      kl_coef: c.args.init_kl_coef,
      target_kl: c.args.target_kl,
      horizon: c.args.horizon,
    });
    const values: number[] = [];
    for (const [kl, n] of c.inputs.updates as [number, number][]) {
      ctrl = ctrl.update(kl, n);
      values.push(ctrl.value);
    }
    return { values_after_each_update: V1(values) };
  },
  FixedKLController: (c) => {
    let ctrl: rl.KlController = rl.makeKlController({ type: 'fixed', kl_coef: c.args.kl_coef });
    const values: number[] = [];
    for (const [kl, n] of c.inputs.updates as [number, number][]) {
      ctrl = ctrl.update(kl, n);
      values.push(ctrl.value);
    }
    return { values_after_each_update: V1(values) };
  },
};

// ---- tolerances ------------------------------------------------------------------------------

export interface Tol {
  atol: number;
  rtol: number;
  cls: string;
}

const FRACTIONS = new Set(['pg_clipfrac', 'pg_clipfrac_lower', 'vf_clipfrac']);

/** The README's tolerance class of one output. */
export function toleranceFor(c: GoldenCase, output: string): Tol {
  if (c.dtype === 'float64') return { atol: 1e-10, rtol: 1e-9, cls: 'float64' };
  if (FRACTIONS.has(output)) return { atol: 1e-6, rtol: 0, cls: 'fraction' };
  const f = c.function;
  const whitened = { atol: 1e-5, rtol: 1e-4, cls: 'whitened' };
  const explog = { atol: 2e-5, rtol: 1e-4, cls: 'exp/log' };
  const elem = { atol: 1e-6, rtol: 1e-5, cls: 'element-wise' };
  if (f === 'compute_gae_advantage_return') return whitened;
  if (f === 'compute_reinforce_plus_plus_baseline_outcome_advantage') return whitened;
  if (f === 'compute_reinforce_plus_plus_outcome_advantage') return output === 'advantages' ? whitened : elem;
  if (f === 'masked_whiten' || f === 'masked_var') return whitened;
  if (f.startsWith('compute_policy_loss') || f === 'compute_value_loss') return explog;
  if (f === 'entropy_from_logits' || f === 'compute_entropy_loss') return explog;
  if (f.includes('optimal_token_baseline')) return explog;
  if (f === 'kl_penalty') {
    if (output === 'grad_logprob_of_sum') return explog;
    return c.args.kl_penalty === 'low_var_kl' || c.args.kl_penalty === 'k3' ? explog : elem;
  }
  return elem;
}

// ---- comparison ------------------------------------------------------------------------------

export interface CaseResult {
  id: string;
  fn: string;
  dtype: Dtype;
  passed: boolean;
  /** max over checked values of |got − exp| / (atol + rtol·|exp|). */
  worst: number;
  problems: string[];
}

function isErrorCase(c: GoldenCase): boolean {
  return Object.prototype.hasOwnProperty.call(c.outputs, 'error');
}

export function runCase(c: GoldenCase): CaseResult {
  const res: CaseResult = { id: c.id, fn: c.function, dtype: c.dtype, passed: false, worst: 0, problems: [] };
  const adapter = adapters[c.function];
  if (!adapter) {
    res.problems.push(`no adapter for function ${c.function}`);
    return res;
  }
  let got: Record<string, Out>;
  try {
    got = adapter(c);
  } catch (e) {
    // An error case passes when the call is rejected on purpose (an RlError/ConfigError with a
    // message), not when the adapter trips over a bug (TypeError, …).
    if (isErrorCase(c) && e instanceof RlError) {
      res.passed = true;
      return res;
    }
    res.problems.push(`threw: ${(e as Error).message}`);
    return res;
  }
  if (isErrorCase(c)) {
    res.problems.push(`expected an error (${JSON.stringify(c.outputs.error)}) but the call succeeded`);
    return res;
  }
  for (const [name, expRaw] of Object.entries(c.outputs)) {
    const g = got[name];
    if (g === undefined) {
      res.problems.push(`${name}: missing from the adapter's outputs`);
      continue;
    }
    const exp = flatten(expRaw);
    const gotShape = typeof g === 'number' ? [] : g.shape;
    const gotVals = typeof g === 'number' ? [g] : Array.from(g.data);
    if (JSON.stringify(gotShape) !== JSON.stringify(exp.shape) || gotVals.length !== exp.values.length) {
      res.problems.push(`${name}: shape ${JSON.stringify(gotShape)} ≠ expected ${JSON.stringify(exp.shape)}`);
      continue;
    }
    if (typeof g !== 'number' && (g.data instanceof Float32Array || g.data instanceof Float64Array)) {
      const want = c.dtype === 'float32' ? Float32Array : Float64Array;
      if (!(g.data instanceof want))
        res.problems.push(`${name}: dtype ${(g.data as object).constructor.name}, expected ${want.name}`);
    }
    const tol = toleranceFor(c, name);
    let bad = 0;
    for (let k = 0; k < exp.values.length; k++) {
      const e = exp.values[k],
        v = gotVals[k];
      let msg: string | null = null;
      if (Number.isNaN(e) || Number.isNaN(v)) {
        if (!(Number.isNaN(e) && Number.isNaN(v))) msg = 'NaN mismatch';
      } else if ((e === 0) !== (v === 0)) msg = 'zero-position mismatch';
      else if (!Number.isFinite(e) || !Number.isFinite(v)) {
        if (e !== v) msg = 'non-finite mismatch';
      } else {
        const ratio = Math.abs(v - e) / (tol.atol + tol.rtol * Math.abs(e));
        if (ratio > res.worst) res.worst = ratio;
        if (ratio > 1)
          msg = `|err| ${Math.abs(v - e).toExponential(2)} > tol ${(tol.atol + tol.rtol * Math.abs(e)).toExponential(2)} (${tol.cls})`;
      }
      if (msg && bad++ < 3) res.problems.push(`${name}[${k}]: got ${v}, expected ${e}: ${msg}`);
    }
    if (bad > 3) res.problems.push(`${name}: ${bad} mismatching values in all`);
  }
  res.passed = res.problems.length === 0;
  return res;
}

export interface FunctionSummary {
  fn: string;
  cases: number;
  passed: number;
  float64: number;
  errors: number;
  worst: number;
}

export function summarise(cases: GoldenCase[], results: CaseResult[]): FunctionSummary[] {
  const by = new Map<string, FunctionSummary>();
  results.forEach((r, i) => {
    const s = by.get(r.fn) ?? { fn: r.fn, cases: 0, passed: 0, float64: 0, errors: 0, worst: 0 };
    s.cases++;
    if (r.passed) s.passed++;
    if (r.dtype === 'float64') s.float64++;
    if (isErrorCase(cases[i])) s.errors++;
    s.worst = Math.max(s.worst, r.worst);
    by.set(r.fn, s);
  });
  return [...by.values()];
}

export function formatTable(rows: FunctionSummary[]): string {
  const head = ['function', 'cases', 'passed', 'f64', 'errors', 'worst err/tol'];
  const body = rows.map((r) => [
    r.fn,
    String(r.cases),
    String(r.passed),
    String(r.float64),
    String(r.errors),
    r.worst.toFixed(3),
  ]);
  const total = rows.reduce((a, r) => ({ c: a.c + r.cases, p: a.p + r.passed, w: Math.max(a.w, r.worst) }), {
    c: 0,
    p: 0,
    w: 0,
  });
  body.push(['TOTAL', String(total.c), String(total.p), '', '', total.w.toFixed(3)]);
  const widths = head.map((h, j) => Math.max(h.length, ...body.map((b) => b[j].length)));
  const line = (cells: string[]) =>
    cells.map((x, j) => (j === 0 ? x.padEnd(widths[j]) : x.padStart(widths[j]))).join('  ');
  return [line(head), widths.map((w) => '-'.repeat(w)).join('  '), ...body.map(line)].join('\n');
}
