/**
 * The in-graph losses (run in ORT, in each case's dtype) against verl's golden cases
 * (test/fixtures/golden/rl_golden.json): policy losses (vanilla with dual clip and IS weights,
 * gspo, sapo, gpg, cispo, reinforce, geo_mean, clip_cov, kl_cov), kl_penalty values and gradients, value loss, entropy, agg_loss. Aggregation
 * weights come from lib/rl/agg.ts, as in the trainer. Tolerances from the golden README.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { GraphBuilder, type FloatDType, type Var } from '../../../lib/onnx/builder.ts';
import { tokenLogprobEntropy } from '../../../lib/onnx/nn.ts';
import { createSession, tensor } from '../../../lib/onnx/runtime.ts';
import {
  aggregate,
  finalizeMetrics,
  klLossTypes,
  lossConfig,
  pgAggWeights,
  policyLossGraph,
  valueLossGraph,
  type PolicyLossConfig,
  type TokenTensors,
  type ValueLossConfig,
} from '../../../lib/model/loss.ts';
import { lossAggModes, type GlobalBatchInfo } from '../../../lib/rl/agg.ts';

interface Case {
  id: string;
  function: string;
  dtype: 'float32' | 'float64';
  args: Record<string, any>;
  inputs: Record<string, any>;
  outputs: Record<string, any>;
}
const golden = JSON.parse(readFileSync(new URL('../../fixtures/golden/rl_golden.json', import.meta.url), 'utf8')) as {
  cases: Case[];
};
const cases = (fn: string) => golden.cases.filter((c) => c.function === fn);

const num = (v: unknown): number =>
  v === 'NaN' ? NaN : v === 'Infinity' ? Infinity : v === '-Infinity' ? -Infinity : (v as number);
function flat2(a: unknown[][]): { data: number[]; bs: number; T: number } {
  return { data: a.flat().map(num), bs: a.length, T: (a[0] ?? []).length };
}

function close(got: number, exp: number, dtype: string, kind: 'loss' | 'frac' | 'elem', what: string): void {
  const [atol, rtol] =
    dtype === 'float64' ? [1e-10, 1e-9] : kind === 'frac' ? [1e-6, 0] : kind === 'elem' ? [1e-6, 1e-5] : [2e-5, 1e-4];
  if (Number.isNaN(exp)) {
    assert.ok(Number.isNaN(got), `${what}: expected NaN, got ${got}`);
    return;
  }
  assert.ok(
    Math.abs(got - exp) <= atol + rtol * Math.abs(exp),
    `${what}: got ${got}, expected ${exp} (|diff| ${Math.abs(got - exp)})`,
  );
}

/** Build a graph over [B, T] float inputs, run it, return named outputs. */
async function runGraph(
  dtype: FloatDType,
  inputs: Record<string, { data: number[]; bs: number; T: number }>,
  build: (b: GraphBuilder, x: Record<string, Var>) => Record<string, Var>,
): Promise<Record<string, Float64Array | Float32Array>> {
  const b = new GraphBuilder({ float: dtype });
  const x: Record<string, Var> = {};
  for (const k of Object.keys(inputs)) x[k] = b.reshape(b.input(k, dtype, ['B', 'T']), ['B*T']);
  const outs = build(b, x);
  for (const [k, v] of Object.entries(outs)) b.output(v, k);
  const s = await createSession(b.toBytes(), { threads: 1, graphOptimizationLevel: 'basic' });
  const feeds = Object.fromEntries(
    Object.entries(inputs).map(([k, v]) => [
      k,
      tensor(dtype, dtype === 'float64' ? Float64Array.from(v.data) : Float32Array.from(v.data), [v.bs, v.T]),
    ]),
  );
  const r = await s.run(feeds);
  return Object.fromEntries(Object.keys(outs).map((k) => [k, r[k].data as Float64Array | Float32Array]));
}

function aggW(mask: { data: number[]; bs: number; T: number }, mode: string, info: GlobalBatchInfo) {
  return {
    data: Array.from(lossAggModes.get(mode).weights(Float64Array.from(mask.data), mask.bs, mask.T, info)),
    bs: mask.bs,
    T: mask.T,
  };
}

const VALID_AGG = new Set(['token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean', 'seq-mean-token-sum-norm']);

/** The graph's loss config for a golden case's args (gspo/sapo/geo_mean cases say "(forced)"/"ignored": the default mode is configured, the loss must override it). */
function policyCfg(lossMode: string, a: Record<string, any>): PolicyLossConfig {
  return lossConfig({
    type: 'policy',
    lossMode,
    lossAggMode: VALID_AGG.has(a.loss_agg_mode) ? a.loss_agg_mode : 'token-mean',
    ...(a.clip_ratio !== undefined
      ? { clipRatio: a.clip_ratio, clipRatioLow: a.clip_ratio_low, clipRatioHigh: a.clip_ratio_high }
      : {}),
    ...(a.clip_ratio_c !== undefined ? { clipRatioC: a.clip_ratio_c } : {}),
    ...(a.tau_pos !== undefined ? { tauPos: a.tau_pos, tauNeg: a.tau_neg } : {}),
    ...(a.clip_cov_ratio !== undefined
      ? { clipCovRatio: a.clip_cov_ratio, clipCovLb: a.clip_cov_lb, clipCovUb: a.clip_cov_ub }
      : {}),
    ...(a.kl_cov_ratio !== undefined ? { klCovRatio: a.kl_cov_ratio, ppoKlCoef: a.ppo_kl_coef } : {}),
  }) as PolicyLossConfig;
}

type Arr2 = { data: number[]; bs: number; T: number };

/** Loss inputs of the graph: aggregation weights from lib/rl/agg.ts, plus the pg term's own when the loss fixes it. */
function lossInputs(
  cfg: PolicyLossConfig,
  x: { lp: Arr2; old: Arr2; adv: Arr2; mask: Arr2; isw?: Arr2 | null; prio?: Arr2 },
  info: GlobalBatchInfo,
): Record<string, Arr2> {
  const inputs: Record<string, Arr2> = {
    lp: x.lp,
    old: x.old,
    adv: x.adv,
    mask: x.mask,
    w: aggW(x.mask, cfg.lossAggMode, info),
  };
  // clip_cov's priorities (only read when there are more candidates than it zeroes; the golden cases have ratio 1)
  if (cfg.lossMode === 'clip_cov')
    inputs.prio = x.prio ?? { data: x.mask.data.map((_, i) => i), bs: x.mask.bs, T: x.mask.T };
  const pgw = pgAggWeights(cfg, Float64Array.from(x.mask.data), x.mask.bs, x.mask.T, info);
  if (pgw) inputs.pgw = { data: Array.from(pgw), bs: x.mask.bs, T: x.mask.T };
  if (x.isw) inputs.isw = x.isw;
  return inputs;
}

function tokenTensors(x: Record<string, Var>): TokenTensors {
  return {
    logprob: x.lp,
    oldLogprobs: x.old,
    advantages: x.adv,
    mask: x.mask,
    aggWeights: x.w,
    pgAggWeights: x.pgw,
    lossWeights: x.isw,
    clipCovPriority: x.prio,
    rowShape: ['B', 'T'],
  };
}

async function policyCase(c: Case, lossMode: string): Promise<void> {
  const a = c.args;
  const info: GlobalBatchInfo = a.global_batch_info ?? {};
  const mask = flat2(c.inputs.response_mask);
  const cfg = policyCfg(lossMode, a);
  const old = c.inputs.old_log_prob ?? c.inputs.rollout_log_prob;
  const inputs = lossInputs(
    cfg,
    {
      lp: flat2(c.inputs.log_prob),
      old: flat2(old),
      adv: flat2(c.inputs.advantages),
      mask,
      isw: c.inputs.rollout_is_weights ? flat2(c.inputs.rollout_is_weights) : null,
    },
    info,
  );
  const out = await runGraph(c.dtype, inputs, (b, x) => policyLossGraph(b, tokenTensors(x), cfg).sums);
  const sums = Object.fromEntries(Object.entries(out).map(([k, v]) => [k, v[0]]));
  const m = finalizeMetrics(
    sums,
    mask.data.reduce((s, v) => s + v, 0),
  );
  close(m.pg_loss, c.outputs.pg_loss, c.dtype, 'loss', `${c.id} pg_loss`);
  for (const k of ['pg_clipfrac', 'pg_clipfrac_lower'])
    if (k in c.outputs) close(m[k], c.outputs[k], c.dtype, 'frac', `${c.id} ${k}`);
  if ('ppo_kl' in c.outputs) close(m.ppo_kl, c.outputs.ppo_kl, c.dtype, 'loss', `${c.id} ppo_kl`);
}

describe('policy losses vs verl golden cases', () => {
  it('vanilla PPO (all agg modes, global batch info, dual clip, IS weights)', async () => {
    const cs = cases('compute_policy_loss_vanilla');
    assert.ok(cs.length >= 80, `only ${cs.length} vanilla cases`);
    for (const c of cs) await policyCase(c, 'vanilla');
  });
  it('gpg and reinforce', async () => {
    for (const c of cases('compute_policy_loss_gpg')) await policyCase(c, 'gpg');
    for (const c of cases('compute_policy_loss_reinforce')) await policyCase(c, 'reinforce');
  });
  it('clip_cov and kl_cov (ratio-1 clip_cov, kl_cov top-k from 1 token to all; extreme ratios)', async () => {
    for (const mode of ['clip_cov', 'kl_cov']) {
      const cs = cases(`compute_policy_loss_${mode}`);
      assert.ok(cs.length >= 18, `only ${cs.length} ${mode} cases`);
      for (const c of cs) await policyCase(c, mode);
    }
  });
  for (const [mode, min] of [
    ['gspo', 6],
    ['sapo', 12],
    ['cispo', 24],
    ['geo_mean', 6],
  ] as const) {
    it(`${mode} (its forced aggregation over a configured token-mean, IS weights)`, async () => {
      const cs = cases(`compute_policy_loss_${mode}`);
      assert.ok(cs.length >= min, `only ${cs.length} ${mode} cases`);
      for (const c of cs) await policyCase(c, mode);
    });
  }
});

describe('kl, value, entropy and aggregation vs verl golden cases', () => {
  it('kl_penalty values and d(Σkl)/d logprob; unsupported modes rejected', async () => {
    for (const c of cases('kl_penalty')) {
      const mode = c.args.kl_penalty as string;
      if ('error' in c.outputs) {
        assert.throws(() => klLossTypes.get(mode), `${c.id}: mode ${mode} should be rejected`);
        continue;
      }
      const out = await runGraph(c.dtype, { lp: flat2(c.inputs.logprob), ref: flat2(c.inputs.ref_logprob) }, (b, x) => {
        const kl = klLossTypes.get(mode)(b, x.lp, x.ref);
        const [g] = b.grad(b.reduceSum(kl, [0]), [x.lp]);
        return { kl, g };
      });
      const kl = flat2(c.outputs.kl).data,
        g = flat2(c.outputs.grad_logprob_of_sum).data;
      const kind = mode === 'low_var_kl' || mode === 'k3' ? 'loss' : 'elem';
      kl.forEach((e, i) => close(out.kl[i], e, c.dtype, kind, `${c.id} kl[${i}]`));
      g.forEach((e, i) => close(out.g[i], e, c.dtype, kind, `${c.id} grad[${i}]`));
    }
  });
  it('compute_value_loss (clipped, all agg modes)', async () => {
    for (const c of cases('compute_value_loss')) {
      const mask = flat2(c.inputs.response_mask);
      const cfg = lossConfig({
        type: 'value',
        cliprangeValue: c.args.cliprange_value,
        lossAggMode: c.args.loss_agg_mode,
      }) as ValueLossConfig;
      const out = await runGraph(
        c.dtype,
        {
          v: flat2(c.inputs.vpreds),
          R: flat2(c.inputs.returns),
          V: flat2(c.inputs.values),
          mask,
          w: aggW(mask, c.args.loss_agg_mode, {}),
        },
        (b, x) => valueLossGraph(b, { vpred: x.v, returns: x.R, values: x.V, mask: x.mask, aggWeights: x.w }, cfg).sums,
      );
      const m = finalizeMetrics(
        Object.fromEntries(Object.entries(out).map(([k, v]) => [k, v[0]])),
        mask.data.reduce((s, v) => s + v, 0),
      );
      close(m.vf_loss, c.outputs.vf_loss, c.dtype, 'loss', `${c.id} vf_loss`);
      close(m.vf_clipfrac, c.outputs.vf_clipfrac, c.dtype, 'frac', `${c.id} vf_clipfrac`);
    }
  });
  it('entropy_from_logits and compute_entropy_loss', async () => {
    const logitsGraph = async (c: Case, mask?: { data: number[]; bs: number; T: number }, mode?: string) => {
      const L = c.inputs.logits as number[][][];
      const bs = L.length,
        T = L[0].length,
        V = L[0][0].length;
      const b = new GraphBuilder({ float: c.dtype });
      const z = b.input('z', c.dtype, ['N', V]);
      const { entropy } = tokenLogprobEntropy(b, z, b.zeros(['N'], 'int64'));
      b.output(entropy!, 'ent');
      if (mask) {
        const m = b.input('m', c.dtype, ['N']),
          w = b.input('w', c.dtype, ['N']);
        b.output(aggregate(b, entropy!, { mask: m, aggWeights: w }), 'agg');
      }
      const s = await createSession(b.toBytes(), { threads: 1, graphOptimizationLevel: 'basic' });
      const arr = (d: number[]) => (c.dtype === 'float64' ? Float64Array.from(d) : Float32Array.from(d));
      const feeds: Record<string, ReturnType<typeof tensor>> = { z: tensor(c.dtype, arr(L.flat(2)), [bs * T, V]) };
      if (mask) {
        feeds.m = tensor(c.dtype, arr(mask.data), [bs * T]);
        feeds.w = tensor(c.dtype, arr(aggW(mask, mode!, {}).data), [bs * T]);
      }
      return s.run(feeds);
    };
    for (const c of cases('entropy_from_logits')) {
      const r = await logitsGraph(c);
      flat2(c.outputs.entropy).data.forEach((e, i) =>
        close((r.ent.data as Float64Array)[i], e, c.dtype, 'loss', `${c.id} entropy[${i}]`),
      );
    }
    for (const c of cases('compute_entropy_loss')) {
      const r = await logitsGraph(c, flat2(c.inputs.response_mask), c.args.loss_agg_mode);
      close((r.agg.data as Float64Array)[0], c.outputs.entropy_loss, c.dtype, 'loss', `${c.id} entropy_loss`);
    }
  });
  it('agg_loss through the in-graph aggregation (weights from lib/rl, global batch info)', async () => {
    let n = 0;
    for (const c of cases('agg_loss')) {
      const a = c.args;
      const info: GlobalBatchInfo = {
        dp_size: a.dp_size,
        batch_num_tokens: a.batch_num_tokens,
        global_batch_size: a.global_batch_size,
        loss_scale_factor: a.loss_scale_factor,
      };
      if ('error' in c.outputs) {
        assert.throws(() => lossAggModes.get(a.loss_agg_mode));
        continue;
      }
      const L = flat2(c.inputs.loss_mat),
        mask = flat2(c.inputs.loss_mask);
      // the in-graph aggregation ignores masked positions in every mode (verl's seq-* modes would propagate a masked NaN)
      if (a.loss_agg_mode !== 'token-mean' && L.data.some((v, i) => !Number.isFinite(v) && mask.data[i] === 0))
        continue;
      const out = await runGraph(c.dtype, { L, mask, w: aggW(mask, a.loss_agg_mode, info) }, (b, x) => ({
        loss: aggregate(b, x.L, { mask: x.mask, aggWeights: x.w }),
      }));
      close(out.loss[0], num(c.outputs.loss), c.dtype, 'elem', `${c.id} loss`);
      n++;
    }
    assert.ok(n >= 120, `checked ${n} agg_loss cases`);
  });
});

describe('NFT vs lib/rl/nft.ts (value and ∂loss/∂log π)', () => {
  it('matches computeNftLoss with clamps active, for "sum" and token-mean aggregation', async () => {
    const { computeNftLoss, nftRHat } = await import('../../../lib/rl/nft.ts');
    const bs = 6,
      T = 7,
      n = bs * T;
    const rng = (await import('../../../lib/util/rng.ts')).Rng.fromSeed('nft-test');
    const lp = Array.from({ length: n }, () => -1 - 2 * rng.next());
    const old = lp.map((v, i) => v - (i % 5 === 0 ? 0.9 : 0.6 * (rng.next() - 0.5)));
    const M = Array.from({ length: n }, (_, i) => (i % T < 2 + (Math.floor(i / T) % 5) ? 1 : 0));
    const rewards = [1, -1, -1, 1, -1, -1],
      index = ['a', 'a', 'b', 'b', 'b', 'c'];
    for (const [aggMode, negWeight] of [
      ['sum', 1],
      ['token-mean', 0.5],
      ['sum', 0],
    ] as const) {
      const nftCfg = {
        neg_weight: negWeight,
        clamp_negative: 0.4,
        clamp_positive: 0.7,
        max_log_ratio: 0.5,
        loss_agg_mode: aggMode,
        loss_scale_factor: 3,
      };
      const ref = computeNftLoss(
        {
          old_log_prob: { data: Float64Array.from(old), bs, T },
          log_prob: { data: Float64Array.from(lp), bs, T },
          response_mask: { data: Float64Array.from(M), bs, T },
          rewards,
          index,
        },
        { nft: nftCfg },
      );
      const cfg = lossConfig({
        type: 'policy',
        lossMode: 'nft',
        nft: {
          negWeight,
          clampNegative: 0.4,
          clampPositive: 0.7,
          maxLogRatio: 0.5,
          lossAggMode: aggMode,
          lossScaleFactor: 3,
        },
      }) as PolicyLossConfig;
      const rh = nftRHat(rewards, index);
      const mask = { data: M, bs, T };
      const w = aggMode === 'sum' ? { data: M.map((m) => m / 3), bs, T } : aggW(mask, aggMode, {});
      const out = await runGraph(
        'float64',
        {
          lp: { data: lp, bs, T },
          old: { data: old, bs, T },
          mask,
          w,
          rh: { data: Array.from({ length: n }, (_, i) => rh[Math.floor(i / T)]), bs, T },
          pos: { data: Array.from({ length: n }, (_, i) => (rewards[Math.floor(i / T)] > 0 ? 1 : 0)), bs, T },
        },
        (b, x) => {
          const lg = policyLossGraph(
            b,
            { logprob: x.lp, oldLogprobs: x.old, mask: x.mask, aggWeights: x.w, nftRHat: x.rh, nftPositive: x.pos },
            cfg,
          );
          const [g] = b.grad(lg.sums.pg_loss, [x.lp]);
          return {
            pg: lg.sums.pg_loss,
            g,
            negc: lg.sums.nft_neg_clamped,
            negt: lg.sums.nft_neg_tokens,
            kl: lg.sums.ppo_kl,
          };
        },
      );
      close(out.pg[0], ref.pg_loss, 'float64', 'loss', `nft ${aggMode} pg_loss`);
      for (let i = 0; i < n; i++)
        close(out.g[i], ref.grad_log_prob.data[i], 'float64', 'loss', `nft ${aggMode} grad[${i}]`);
      close(out.negc[0] / (out.negt[0] + 1e-8), ref.metrics.neg_clamp_frac!, 'float64', 'frac', 'neg_clamp_frac');
      close(
        out.kl[0] / (M.reduce((a: number, v) => a + v, 0) + 1e-8),
        ref.metrics.ppo_kl!,
        'float64',
        'loss',
        'ppo_kl',
      );
    }
  });
});

describe('entropy penalty vs lib/rl/shaping.ts entropyPenalty (value and ∂/∂log π)', () => {
  it('adds coef · agg(−log π) to the loss in every aggregation mode', async () => {
    const { entropyPenalty } = await import('../../../lib/rl/shaping.ts');
    const bs = 4,
      T = 6,
      n = bs * T;
    const rng = (await import('../../../lib/util/rng.ts')).Rng.fromSeed('entropy-penalty-test');
    const lp = Array.from({ length: n }, () => -0.2 - 2 * rng.next());
    const old = lp.map((v) => v - 0.3 * (rng.next() - 0.5));
    const adv = Array.from({ length: n }, () => rng.next() - 0.5);
    const M = Array.from({ length: n }, (_, i) => (i % T < 1 + (Math.floor(i / T) % 4) ? 1 : 0));
    const mask = { data: M, bs, T };
    for (const aggMode of [
      'token-mean',
      'seq-mean-token-sum',
      'seq-mean-token-mean',
      'seq-mean-token-sum-norm',
    ] as const) {
      const coef = 0.07;
      const ref = entropyPenalty(
        { data: Float64Array.from(lp), bs, T },
        { data: Float64Array.from(M), bs, T },
        coef,
        aggMode,
        { loss_scale_factor: T },
      );
      const w = aggW(mask, aggMode, { loss_scale_factor: T });
      const run = (cfg: PolicyLossConfig) =>
        runGraph(
          'float64',
          { lp: { data: lp, bs, T }, old: { data: old, bs, T }, adv: { data: adv, bs, T }, mask, w },
          (b, x) => {
            const lg = policyLossGraph(
              b,
              { logprob: x.lp, oldLogprobs: x.old, advantages: x.adv, mask: x.mask, aggWeights: x.w },
              cfg,
            );
            const [g] = b.grad(lg.loss, [x.lp]);
            return { loss: lg.loss, g, ...(lg.sums.entropy_penalty ? { pen: lg.sums.entropy_penalty } : {}) };
          },
        );
      const withPen = await run(
        lossConfig({ type: 'policy', lossAggMode: aggMode, entropyPenaltyCoef: coef }) as PolicyLossConfig,
      );
      const without = await run(lossConfig({ type: 'policy', lossAggMode: aggMode }) as PolicyLossConfig);
      close(withPen.pen[0], ref.penalty, 'float64', 'loss', `${aggMode} entropy_penalty`);
      close(withPen.loss[0] - without.loss[0], ref.penalty, 'float64', 'loss', `${aggMode} loss difference`);
      for (let i = 0; i < n; i++)
        close(withPen.g[i] - without.g[i], ref.grad_log_prob.data[i], 'float64', 'loss', `${aggMode} grad[${i}]`);
    }
  });
});

describe('policy-loss gradients vs lib/rl (∂pg_loss/∂log π, torch autograd semantics)', () => {
  it('vanilla PPO on the float64 golden inputs (clamps, dual clip, IS weights)', async () => {
    const { computePolicyLossVanilla } = await import('../../../lib/rl/policy-loss.ts');
    let n = 0;
    for (const c of cases('compute_policy_loss_vanilla').filter((x) => x.dtype === 'float64')) {
      const a = c.args;
      const mask = flat2(c.inputs.response_mask),
        lp = flat2(c.inputs.log_prob),
        old = flat2(c.inputs.old_log_prob),
        adv = flat2(c.inputs.advantages);
      const T2 = (x: { data: number[]; bs: number; T: number }) => ({
        data: Float64Array.from(x.data),
        bs: x.bs,
        T: x.T,
      });
      const isw = c.inputs.rollout_is_weights ? flat2(c.inputs.rollout_is_weights) : null;
      const ref = computePolicyLossVanilla(
        {
          old_log_prob: T2(old),
          log_prob: T2(lp),
          advantages: T2(adv),
          response_mask: T2(mask),
          rollout_is_weights: isw ? T2(isw) : null,
        },
        {
          clip_ratio: a.clip_ratio,
          clip_ratio_low: a.clip_ratio_low,
          clip_ratio_high: a.clip_ratio_high,
          clip_ratio_c: a.clip_ratio_c,
          loss_agg_mode: a.loss_agg_mode,
          global_batch_info: a.global_batch_info,
          with_grad: true,
        },
      );
      const cfg = lossConfig({
        type: 'policy',
        lossAggMode: a.loss_agg_mode,
        clipRatio: a.clip_ratio,
        clipRatioLow: a.clip_ratio_low,
        clipRatioHigh: a.clip_ratio_high,
        clipRatioC: a.clip_ratio_c,
      }) as PolicyLossConfig;
      const inputs: Record<string, { data: number[]; bs: number; T: number }> = {
        lp,
        old,
        adv,
        mask,
        w: aggW(mask, a.loss_agg_mode, a.global_batch_info ?? {}),
      };
      if (isw) inputs.isw = isw;
      const out = await runGraph('float64', inputs, (b, x) => {
        const lg = policyLossGraph(
          b,
          { logprob: x.lp, oldLogprobs: x.old, advantages: x.adv, mask: x.mask, aggWeights: x.w, lossWeights: x.isw },
          cfg,
        );
        return { g: b.grad(lg.sums.pg_loss, [x.lp])[0] };
      });
      ref.grad_log_prob!.data.forEach((e, i) => close(out.g[i], e, 'float64', 'loss', `${c.id} grad[${i}]`));
      n++;
    }
    assert.ok(n >= 30, `checked ${n} cases`);
  });

  it('gspo, sapo, cispo, geo_mean on the golden inputs in float64 and on random inputs (clamps, an empty row, IS weights, agg modes)', async () => {
    const { computePolicyLoss } = await import('../../../lib/rl/policy-loss-registry.ts');
    const { Rng } = await import('../../../lib/util/rng.ts');
    const T2 = (x: Arr2) => ({ data: Float64Array.from(x.data), bs: x.bs, T: x.T });
    const check = async (
      mode: string,
      a: Record<string, any>,
      x: { lp: Arr2; old: Arr2; adv: Arr2; mask: Arr2; isw?: Arr2 | null },
      what: string,
    ) => {
      const cfg = policyCfg(mode, a);
      const info: GlobalBatchInfo = a.global_batch_info ?? {};
      const ref = computePolicyLoss(
        mode,
        {
          old_log_prob: T2(x.old),
          log_prob: T2(x.lp),
          advantages: T2(x.adv),
          response_mask: T2(x.mask),
          rollout_is_weights: x.isw ? T2(x.isw) : null,
        },
        {
          clip_ratio: a.clip_ratio,
          clip_ratio_low: a.clip_ratio_low,
          clip_ratio_high: a.clip_ratio_high,
          tau_pos: a.tau_pos,
          tau_neg: a.tau_neg,
          loss_agg_mode: cfg.lossAggMode,
          global_batch_info: info,
          with_grad: true,
        },
      );
      const out = await runGraph('float64', lossInputs(cfg, x, info), (b, v) => {
        const lg = policyLossGraph(b, tokenTensors(v), cfg);
        return {
          pg: lg.sums.pg_loss,
          g: b.grad(lg.sums.pg_loss, [v.lp])[0],
          clip: lg.sums.pg_clipfrac,
          lower: lg.sums.pg_clipfrac_lower,
          kl: lg.sums.ppo_kl,
        };
      });
      const mSum = x.mask.data.reduce((s, v) => s + v, 0);
      close(out.pg[0], ref.pg_loss, 'float64', 'loss', `${what} pg_loss`);
      ref.grad_log_prob!.data.forEach((e, i) => close(out.g[i], e, 'float64', 'loss', `${what} grad[${i}]`));
      close(out.clip[0] / (mSum + 1e-8), ref.metrics.pg_clipfrac!, 'float64', 'frac', `${what} pg_clipfrac`);
      close(
        out.lower[0] / (mSum + 1e-8),
        ref.metrics.pg_clipfrac_lower!,
        'float64',
        'frac',
        `${what} pg_clipfrac_lower`,
      );
      close(out.kl[0] / (mSum + 1e-8), ref.metrics.ppo_kl!, 'float64', 'loss', `${what} ppo_kl`);
      return ref.grad_log_prob!.data.some((g) => g !== 0);
    };
    let n = 0;
    for (const mode of ['gspo', 'sapo', 'cispo', 'geo_mean']) {
      for (const c of cases(`compute_policy_loss_${mode}`)) {
        const isw = c.inputs.rollout_is_weights ? flat2(c.inputs.rollout_is_weights) : null;
        assert.ok(
          await check(
            mode,
            c.args,
            {
              lp: flat2(c.inputs.log_prob),
              old: flat2(c.inputs.old_log_prob),
              adv: flat2(c.inputs.advantages),
              mask: flat2(c.inputs.response_mask),
              isw,
            },
            `${c.id} (float64)`,
          ),
          `${c.id}: a zero gradient checks nothing`,
        );
        n++;
      }
    }
    assert.ok(n >= 48, `checked ${n} golden cases`);
    const bs = 5,
      T = 6,
      N = bs * T,
      rng = Rng.fromSeed('policy-loss-grad');
    const lp = Array.from({ length: N }, () => -0.5 - 2 * rng.next());
    // ratios from e^-0.9 to e^0.9 (PPO and geo_mean clips active); row 3's sequence log-ratio is > 10 (gspo's clamp)
    const old = lp.map((v, i) => (Math.floor(i / T) === 3 ? v - 11 : v - 1.8 * (rng.next() - 0.5)));
    const adv = Array.from({ length: N }, (_, i) => (i % 7 === 0 ? 0 : 2 * (rng.next() - 0.5)));
    const mask = Array.from({ length: N }, (_, i) =>
      Math.floor(i / T) === 2 ? 0 : i % T < 2 + (Math.floor(i / T) % 4) ? 1 : 0,
    );
    const isw = Array.from({ length: N }, () => 0.5 + rng.next());
    const A2 = (d: number[]) => ({ data: d, bs, T });
    const clip = { clip_ratio: 0.2, clip_ratio_low: 0.2, clip_ratio_high: 0.28 };
    for (const [mode, a] of [
      ['gspo', { ...clip, global_batch_info: { global_batch_size: 8, dp_size: 2 } }],
      ['sapo', { tau_pos: 2, tau_neg: 4, loss_agg_mode: 'seq-mean-token-sum' }],
      ['cispo', { ...clip, loss_agg_mode: 'seq-mean-token-sum-norm', global_batch_info: { loss_scale_factor: 4 } }],
      ['cispo', { ...clip, loss_agg_mode: 'token-mean' }],
      ['geo_mean', { ...clip, loss_agg_mode: 'seq-mean-token-mean' }],
    ] as const) {
      for (const w of [null, A2(isw)])
        await check(
          mode,
          a,
          { lp: A2(lp), old: A2(old), adv: A2(adv), mask: A2(mask), isw: w },
          `random ${mode} ${JSON.stringify(a)}${w ? ' +IS' : ''}`,
        );
    }
  });
});

describe('clip_cov and kl_cov vs lib/rl (selection, value and ∂pg_loss/∂log π)', () => {
  it('the same tokens as lib/rl: clip_cov random subsets from shared priorities, kl_cov top-k ties to the lower index; golden inputs in float64', async () => {
    const { computePolicyLoss, clipCovPriorities } = await import('../../../lib/rl/policy-loss.ts').then(async (m) => ({
      ...m,
      ...(await import('../../../lib/rl/policy-loss-registry.ts')),
    }));
    const { Rng } = await import('../../../lib/util/rng.ts');
    const T2 = (x: Arr2) => ({ data: Float64Array.from(x.data), bs: x.bs, T: x.T });
    const check = async (
      mode: 'clip_cov' | 'kl_cov',
      a: Record<string, any>,
      x: { lp: Arr2; old: Arr2; adv: Arr2; mask: Arr2; isw?: Arr2 | null },
      seed: number,
      what: string,
    ) => {
      const cfg = policyCfg(mode, a);
      const info: GlobalBatchInfo = a.global_batch_info ?? {};
      const n = x.mask.data.length;
      const prio = { data: Array.from(clipCovPriorities(n, Rng.fromSeed(seed))), bs: x.mask.bs, T: x.mask.T };
      const ref = computePolicyLoss(
        mode,
        {
          old_log_prob: T2(x.old),
          log_prob: T2(x.lp),
          advantages: T2(x.adv),
          response_mask: T2(x.mask),
          rollout_is_weights: x.isw ? T2(x.isw) : null,
        },
        {
          clip_ratio: a.clip_ratio,
          clip_ratio_low: a.clip_ratio_low,
          clip_ratio_high: a.clip_ratio_high,
          clip_cov_ratio: a.clip_cov_ratio,
          clip_cov_lb: a.clip_cov_lb,
          clip_cov_ub: a.clip_cov_ub,
          kl_cov_ratio: a.kl_cov_ratio,
          ppo_kl_coef: a.ppo_kl_coef,
          loss_agg_mode: cfg.lossAggMode,
          global_batch_info: info,
          with_grad: true,
          rng: Rng.fromSeed(seed),
        },
      );
      const out = await runGraph('float64', lossInputs(cfg, { ...x, prio }, info), (b, v) => {
        const lg = policyLossGraph(b, tokenTensors(v), cfg);
        return {
          pg: lg.sums.pg_loss,
          g: b.grad(lg.sums.pg_loss, [v.lp])[0],
          kl: lg.sums.ppo_kl,
          ...(mode === 'clip_cov' ? { clip: lg.sums.pg_clipfrac } : {}),
        };
      });
      const mSum = x.mask.data.reduce((s, v) => s + v, 0);
      // no valid token: lib/rl's seq-mean aggregation is 0/0; the graph's aggregation weights are all 0
      if (mSum === 0 && Number.isNaN(ref.pg_loss))
        assert.equal(out.pg[0], 0, `${what}: pg_loss of an empty micro-batch`);
      else close(out.pg[0], ref.pg_loss, 'float64', 'loss', `${what} pg_loss`);
      ref.grad_log_prob!.data.forEach((e, i) => close(out.g[i], e, 'float64', 'loss', `${what} grad[${i}]`));
      close(out.kl[0] / (mSum + 1e-8), ref.metrics.ppo_kl!, 'float64', 'loss', `${what} ppo_kl`);
      if (mode === 'clip_cov')
        close(out.clip[0] / (mSum + 1e-8), ref.metrics.pg_clipfrac!, 'float64', 'frac', `${what} pg_clipfrac`);
      return ref;
    };
    for (const mode of ['clip_cov', 'kl_cov'] as const) {
      for (const c of cases(`compute_policy_loss_${mode}`)) {
        await check(
          mode,
          c.args,
          {
            lp: flat2(c.inputs.log_prob),
            old: flat2(c.inputs.old_log_prob),
            adv: flat2(c.inputs.advantages),
            mask: flat2(c.inputs.response_mask),
          },
          1,
          `${c.id} (float64)`,
        );
      }
    }
    const bs = 6,
      T = 9,
      N = bs * T,
      rng = Rng.fromSeed('cov-losses');
    // advantages and log-probs from a few levels, so many tokens share a covariance (top-k ties)
    const lp = Array.from({ length: N }, () => -0.5 - Math.floor(3 * rng.next()) * 0.5);
    const old = lp.map((v) => v - 0.6 * (rng.next() - 0.5));
    const adv = Array.from({ length: N }, () => [-1, 0.5, 1][Math.floor(3 * rng.next())]);
    const mask = Array.from({ length: N }, (_, i) =>
      Math.floor(i / T) === 2 ? 0 : i % T < 3 + (Math.floor(i / T) % 5) ? 1 : 0,
    );
    const isw = Array.from({ length: N }, () => 0.5 + rng.next());
    const A2 = (d: number[]) => ({ data: d, bs, T });
    const x = { lp: A2(lp), old: A2(old), adv: A2(adv), mask: A2(mask) };
    const clip = { clip_ratio: 0.2, clip_ratio_low: 0.1, clip_ratio_high: 0.15 };
    const mSum = mask.reduce((s: number, v) => s + v, 0);
    for (const seed of [1, 2, 3, 4]) {
      // ratio 0.1: ⌊0.1·ΣM⌋ of the (more) candidates are drawn by priority
      const ref = await check(
        'clip_cov',
        { ...clip, clip_cov_ratio: 0.1, clip_cov_lb: -10, clip_cov_ub: 10, loss_agg_mode: 'seq-mean-token-sum' },
        { ...x, isw: A2(isw) },
        seed,
        `random clip_cov seed ${seed}`,
      );
      assert.equal(
        Math.round(ref.metrics.pg_clipfrac! * mSum),
        Math.floor(0.1 * mSum),
        'the cap max(⌊ratio·ΣM⌋, 1) is reached',
      );
    }
    await check(
      'clip_cov',
      { ...clip, clip_cov_ratio: 1, clip_cov_lb: 0, clip_cov_ub: 0.3, loss_agg_mode: 'token-mean' },
      x,
      5,
      'clip_cov all candidates',
    );
    for (const [ratio, coef] of [
      [0.0002, 0.1],
      [0.15, 1],
      [0.5, 0.5],
      [3, 0.2],
    ]) {
      await check(
        'kl_cov',
        { kl_cov_ratio: ratio, ppo_kl_coef: coef, loss_agg_mode: 'token-mean' },
        x,
        0,
        `kl_cov ratio ${ratio}`,
      );
      await check(
        'kl_cov',
        { kl_cov_ratio: ratio, ppo_kl_coef: coef, loss_agg_mode: 'seq-mean-token-mean' },
        { ...x, isw: A2(isw) },
        0,
        `kl_cov ratio ${ratio} +IS`,
      );
    }
    // no valid token: nothing selected, the loss is the masked aggregation of zero-weight tokens
    const none = { ...x, mask: A2(mask.map(() => 0)) };
    await check(
      'kl_cov',
      { kl_cov_ratio: 0.5, ppo_kl_coef: 1, loss_agg_mode: 'seq-mean-token-sum' },
      none,
      0,
      'kl_cov empty',
    );
    await check(
      'clip_cov',
      { ...clip, clip_cov_ratio: 0.5, clip_cov_lb: -10, clip_cov_ub: 10, loss_agg_mode: 'seq-mean-token-sum' },
      none,
      0,
      'clip_cov empty',
    );
  });

  it('the random clip_cov subset depends on the priorities (a different draw zeroes different tokens)', async () => {
    const { clipCovPriorities } = await import('../../../lib/rl/policy-loss.ts');
    const { Rng } = await import('../../../lib/util/rng.ts');
    const bs = 2,
      T = 10,
      N = bs * T;
    const lp = Array.from({ length: N }, (_, i) => -1 - (i % 7) * 0.1);
    const A2 = (d: number[]) => ({ data: d, bs, T });
    // no token is clipped (r = 1) and no advantage is 0: every token is a candidate with a non-zero gradient unless zeroed
    const x = { lp: A2(lp), old: A2(lp), adv: A2(lp.map((_, i) => (i % 3) - 0.5)), mask: A2(lp.map(() => 1)) };
    const cfg = policyCfg('clip_cov', { clip_ratio: 0.2, clip_cov_ratio: 0.1, clip_cov_lb: -10, clip_cov_ub: 10 });
    const perToken = async (seed: number) => {
      const prio = { data: Array.from(clipCovPriorities(N, Rng.fromSeed(seed))), bs, T };
      const out = await runGraph('float64', lossInputs(cfg, { ...x, prio }, {}), (b, v) => ({
        g: b.grad(policyLossGraph(b, tokenTensors(v), cfg).sums.pg_loss, [v.lp])[0],
      }));
      return Array.from(out.g, (g) => (g === 0 ? 0 : 1)).join('');
    };
    const draws = new Set<string>();
    for (const seed of [1, 2, 3, 4, 5, 6]) {
      const d = await perToken(seed);
      assert.equal(d.split('').filter((c) => c === '0').length, 2, `seed ${seed}: max(⌊0.1·20⌋, 1) = 2 zeroed tokens`);
      draws.add(d);
    }
    assert.ok(draws.size >= 3, `only ${draws.size} different subsets in 6 draws`);
  });
});
