/**
 * Finite-difference checks of the whole training graph in float64: Llama trunk (GQA, q/k/v
 * biases, tied and separate heads, left padding) + each loss (PPO with dual clip, KL and
 * entropy; gspo, sapo, cispo, geo_mean, gpg, reinforce, clip_cov, kl_cov; value loss with clipping; SFT). For every parameter tensor, the autodiff gradient's
 * projection on a random direction must match a central difference of the loss along it.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { modelConfig, type ModelConfigInput } from '../../../lib/model/config.ts';
import { initWeights } from '../../../lib/model/init.ts';
import { lossConfig, pgAggWeights, type LossConfigInput } from '../../../lib/model/loss.ts';
import { paramSpecs } from '../../../lib/model/params.ts';
import { loraConfig, loraSpecs, type LoraConfig } from '../../../lib/model/lora.ts';
import { buildTrainGraph } from '../../../lib/model/train-graph.ts';
import { createSession, tensor } from '../../../lib/onnx/runtime.ts';
import { randn } from '../onnx/gradcheck.ts';
import { computePolicyLoss } from '../../../lib/rl/policy-loss-registry.ts';
import { lossAggModes } from '../../../lib/rl/agg.ts';

const OPTIM = { betas: [0.9, 0.999] as [number, number], eps: 1e-8, weightDecay: 0, maxGradNorm: 1 };

/**
 * `fd`: the autodiff gradient against central differences of the loss. `chain` (losses with
 * stop-gradients, whose gradient is not the derivative of their value): the pg loss of the eval
 * graph must equal lib/rl's on the graph's own log-probs, and the parameter gradient must equal
 * Σ_t d_t·∂lp_t/∂θ with d = lib/rl's ∂pg_loss/∂lp (torch autograd semantics), computed by a gpg
 * graph with advantages −d and unit aggregation weights (∂lp/∂θ itself is checked by `fd`).
 */
async function checkModelGrad(
  mc: ModelConfigInput,
  lc: LossConfigInput,
  B = 2,
  T = 5,
  how: 'fd' | 'chain' = 'fd',
  lora?: LoraConfig,
): Promise<number> {
  const model = modelConfig(mc);
  const loss = lossConfig(lc);
  const evalG = buildTrainGraph({
    model,
    loss,
    optim: OPTIM,
    mode: 'eval',
    float: 'float64',
    lossWeights: loss.type === 'policy',
    ...(lora ? { lora } : {}),
  });
  const gradG = buildTrainGraph({
    model,
    loss,
    optim: OPTIM,
    mode: 'grad',
    float: 'float64',
    lossWeights: loss.type === 'policy',
    ...(lora ? { lora } : {}),
  });
  const opts = { threads: 1, graphOptimizationLevel: 'basic' as const };
  const se = await createSession(evalG.builder.toBytes(), opts);
  const sg = await createSession(gradG.builder.toBytes(), opts);
  const n = B * T;
  // row 1 is left-padded by one position; the last target position of each row is masked
  const attn = Float64Array.from({ length: n }, (_, i) => (i === T ? 0 : 1));
  const pos: number[] = [];
  for (let r = 0; r < B; r++) {
    let c = 0;
    for (let t = 0; t < T; t++) {
      if (attn[r * T + t]) c++;
      pos.push(Math.max(c - 1, 0));
    }
  }
  const ids = Array.from({ length: n }, (_, i) => (i * 7 + 3) % model.vocabSize);
  const targets = Array.from({ length: n }, (_, i) => (i * 5 + 1) % model.vocabSize);
  const mask = Float64Array.from({ length: n }, (_, i) => (i % T >= 1 && i % T < T - 1 ? 1 : 0));
  const msum = mask.reduce((a, b) => a + b, 0);
  const agg = mask.map((m) => m / msum);
  const r = randn(8 * n, 11);
  const batch: Record<string, Float64Array | number[]> = {
    input_ids: ids,
    position_ids: pos,
    attention_mask: attn,
    targets,
    loss_mask: mask,
    agg_weights: agg,
    // advantages of both signs, old log-probs near the current ones (ratios around 1, some clipped)
    advantages: r.subarray(0, n).map((v) => v * 2),
    old_log_probs: r.subarray(n, 2 * n).map((v) => -Math.log(model.vocabSize) + 0.3 * v),
    ref_log_probs: r.subarray(2 * n, 3 * n).map((v) => -Math.log(model.vocabSize) + 0.3 * v),
    loss_weights: r.subarray(3 * n, 4 * n).map((v) => 1 + 0.3 * v),
    values: r.subarray(4 * n, 5 * n).map((v) => 0.05 * v),
    returns: r.subarray(5 * n, 6 * n),
    // clip_cov: a permutation of 0..n−1 as token priorities
    clip_cov_priority: Array.from({ length: n }, (_, i) => (i * 7) % n),
  };
  const pgw = loss.type === 'policy' ? pgAggWeights(loss, mask, B, T, {}) : null;
  if (pgw) batch.pg_agg_weights = pgw;
  // the chain check compares with lib/rl, so the weights are those of the configured mode
  if (how === 'chain' && loss.type === 'policy')
    batch.agg_weights = lossAggModes.get(loss.lossAggMode).weights(mask, B, T, {});
  const w = initWeights(model, 3, { std: 0.3 });
  // with LoRA the checked (trained) parameters are the adapters, random (B ≠ 0) so A gets a gradient
  const specs = lora ? loraSpecs(model, lora) : paramSpecs(model);
  const all = lora ? [...paramSpecs(model), ...specs] : specs;
  if (lora)
    for (const s of specs)
      w.set(
        s.name,
        Float32Array.from(randn(s.shape[0] * s.shape[1], s.name.length + 7), (v) => 0.3 * v),
      );
  if (lora)
    assert.ok(
      !gradG.builder.toModelProto().graph!.output!.some((o) => o.name === 'grad.model.embed_tokens.weight'),
      'a frozen base weight has no gradient output',
    );
  // random norm weights and biases so their gradients are generic
  for (const s of paramSpecs(model))
    if (s.name.endsWith('norm.weight') || s.name.endsWith('.bias'))
      w.set(
        s.name,
        Float32Array.from(randn(s.shape[0], s.name.length), (v) => (s.name.endsWith('.bias') ? 0.3 * v : 1 + 0.2 * v)),
      );
  const feeds = (sess: { inputNames: readonly string[] }, over?: { name: string; data: Float64Array }, bt = batch) => {
    const f: Record<string, ReturnType<typeof tensor>> = {};
    for (const name of sess.inputNames) {
      const spec = all.find((s) => s.name === name);
      if (spec)
        f[name] = tensor('float64', over?.name === name ? over.data : Float64Array.from(w.get(name)!), spec.shape);
      else {
        const d = bt[name];
        const isInt = name === 'input_ids' || name === 'position_ids' || name === 'targets';
        f[name] = tensor(isInt ? 'int64' : 'float64', isInt ? (d as number[]) : Float64Array.from(d as Float64Array), [
          B,
          T,
        ]);
      }
    }
    return f;
  };
  const li = evalG.metricNames.indexOf('loss');
  const lossAt = async (over?: { name: string; data: Float64Array }) =>
    ((await se.run(feeds(se, over))).metrics.data as Float64Array)[li];
  const g = await sg.run(feeds(sg));
  if (how === 'chain') return chainCheck();
  const base = await lossAt();
  assert.ok(Number.isFinite(base), 'loss is finite');
  let maxRel = 0;
  for (const s of specs) {
    const x0 = Float64Array.from(w.get(s.name)!);
    const u = randn(x0.length, s.name.length * 31 + x0.length);
    const grad = g[`grad.${s.name}`].data as Float64Array;
    let analytic = 0;
    for (let i = 0; i < x0.length; i++) analytic += grad[i] * u[i];
    const h = 1e-5;
    const lp = await lossAt({ name: s.name, data: x0.map((v, i) => v + h * u[i]) });
    const lm = await lossAt({ name: s.name, data: x0.map((v, i) => v - h * u[i]) });
    const fd = (lp - lm) / (2 * h);
    const err = Math.abs(fd - analytic);
    const rel = err / Math.max(Math.abs(fd), 1e-6);
    maxRel = Math.max(maxRel, rel);
    assert.ok(
      err <= 1e-8 + 1e-5 * Math.abs(fd),
      `${s.name}: directional derivative autodiff ${analytic} vs finite difference ${fd}`,
    );
  }
  return maxRel;

  async function chainCheck(): Promise<number> {
    if (loss.type !== 'policy' || loss.useKlLoss || loss.entropyCoeff !== 0)
      throw new Error('chain check: a policy loss without KL and entropy terms');
    const ev = await se.run(feeds(se));
    const lpOut = Float64Array.from(ev.log_probs.data as Float64Array);
    const T2 = (d: ArrayLike<number>) => ({ data: Float64Array.from(d), bs: B, T });
    const ref = computePolicyLoss(
      loss.lossMode,
      {
        old_log_prob: T2(batch.old_log_probs),
        log_prob: T2(lpOut),
        advantages: T2(batch.advantages),
        response_mask: T2(mask),
        rollout_is_weights: T2(batch.loss_weights),
      },
      {
        clip_ratio: loss.clipRatio,
        clip_ratio_low: loss.clipRatioLow,
        clip_ratio_high: loss.clipRatioHigh,
        loss_agg_mode: loss.lossAggMode,
        with_grad: true,
      },
    );
    const pg = (ev.metrics.data as Float64Array)[evalG.metricNames.indexOf('pg_loss')];
    assert.ok(
      Math.abs(pg - ref.pg_loss) <= 1e-12 + 1e-10 * Math.abs(ref.pg_loss),
      `${loss.lossMode}: pg_loss ${pg} vs lib/rl ${ref.pg_loss}`,
    );
    const d = ref.grad_log_prob!.data;
    assert.ok(
      d.some((v) => v !== 0),
      'lib/rl gradient is not all zero',
    );
    const viaGpg = buildTrainGraph({
      model,
      loss: lossConfig({ type: 'policy', lossMode: 'gpg' }),
      optim: OPTIM,
      mode: 'grad',
      float: 'float64',
      lossWeights: false,
    });
    const sv = await createSession(viaGpg.builder.toBytes(), opts);
    const g2 = await sv.run(feeds(sv, undefined, { ...batch, advantages: d.map((v) => -v), agg_weights: mask }));
    let maxRel = 0,
      nonZero = 0;
    for (const s of specs) {
      const a = g[`grad.${s.name}`].data as Float64Array,
        e = g2[`grad.${s.name}`].data as Float64Array;
      let scale = 0,
        err = 0;
      for (let i = 0; i < a.length; i++) {
        scale = Math.max(scale, Math.abs(e[i]));
        err = Math.max(err, Math.abs(a[i] - e[i]));
      }
      // (layer 0's q/k projections get no gradient here: every input id of the fixture is the same token)
      assert.ok(
        err <= 1e-14 + 1e-10 * scale,
        `${loss.lossMode} ${s.name}: gradient differs from Σ d·∂lp/∂θ by ${err} (scale ${scale})`,
      );
      if (scale > 1e-8) {
        nonZero++;
        maxRel = Math.max(maxRel, err / scale);
      }
    }
    assert.ok(nonZero >= specs.length / 2, `only ${nonZero} of ${specs.length} parameter gradients are non-zero`);
    return maxRel;
  }
}

const small = {
  hiddenSize: 8,
  intermediateSize: 12,
  numHiddenLayers: 2,
  numAttentionHeads: 2,
  vocabSize: 7,
  maxPositionEmbeddings: 8,
  bosTokenId: 1,
  eosTokenId: 2,
  padTokenId: 0,
};

describe('training graph gradients (float64 finite differences)', () => {
  it('PPO (asymmetric + dual clip) + low_var_kl + entropy, GQA, separate head, qwen2 biases', async () => {
    await checkModelGrad(
      { ...small, numAttentionHeads: 4, numKeyValueHeads: 2, hiddenSize: 16, modelType: 'qwen2', attentionBias: true },
      {
        type: 'policy',
        clipRatioLow: 0.2,
        clipRatioHigh: 0.28,
        clipRatioC: 3,
        useKlLoss: true,
        klLossType: 'low_var_kl',
        klLossCoef: 0.1,
        entropyCoeff: 0.01,
      },
    );
  });
  it('PPO with k2 KL, seq-mean-token-mean, tied embeddings, MHA', async () => {
    await checkModelGrad(
      { ...small, numKeyValueHeads: 2, tieWordEmbeddings: true },
      { type: 'policy', lossAggMode: 'seq-mean-token-mean', useKlLoss: true, klLossType: 'k2', temperature: 0.7 },
    );
  });
  it('gpg and reinforce losses', async () => {
    await checkModelGrad(
      { ...small, numKeyValueHeads: 1 },
      { type: 'policy', lossMode: 'gpg', useKlLoss: true, klLossType: 'abs' },
    );
    await checkModelGrad(
      { ...small, numKeyValueHeads: 1 },
      { type: 'policy', lossMode: 'reinforce', entropyCoeff: -0.05 },
    );
  });
  it('sapo and geo_mean (their own pg aggregation) + KL and entropy', async () => {
    await checkModelGrad(
      { ...small, numKeyValueHeads: 1 },
      {
        type: 'policy',
        lossMode: 'sapo',
        tauPos: 2,
        tauNeg: 4,
        useKlLoss: true,
        klLossType: 'low_var_kl',
        entropyCoeff: 0.01,
      },
    );
    await checkModelGrad(
      { ...small, numKeyValueHeads: 1 },
      { type: 'policy', lossMode: 'geo_mean', clipRatio: 0.1, useKlLoss: true, klLossType: 'k2' },
      3,
      5,
    );
  });
  it('gspo (sequence ratio, token gradient) and cispo (detached clipped ratio): stop-gradients through the model as in lib/rl', async () => {
    await checkModelGrad(
      { ...small, numKeyValueHeads: 1 },
      { type: 'policy', lossMode: 'gspo', clipRatioLow: 0.05, clipRatioHigh: 0.08 },
      3,
      5,
      'chain',
    );
    await checkModelGrad(
      { ...small, numKeyValueHeads: 1 },
      { type: 'policy', lossMode: 'cispo', clipRatioLow: 0.3, clipRatioHigh: 0.6, lossAggMode: 'seq-mean-token-sum' },
      3,
      5,
      'chain',
    );
  });
  it('clip_cov (a random subset of candidates zeroed) and kl_cov (top-k penalised) + KL and entropy', async () => {
    // n = 10 tokens (7 with a prime stride gives a permutation), 6 valid: clip_cov zeroes up to max(⌊0.4·6⌋, 1) = 2 of its candidates, kl_cov penalises 3
    await checkModelGrad(
      { ...small, numKeyValueHeads: 1 },
      {
        type: 'policy',
        lossMode: 'clip_cov',
        clipRatio: 0.1,
        clipCovRatio: 0.4,
        clipCovLb: -100,
        clipCovUb: 100,
        useKlLoss: true,
        klLossType: 'k2',
        entropyCoeff: 0.01,
      },
    );
    await checkModelGrad(
      { ...small, numKeyValueHeads: 1 },
      {
        type: 'policy',
        lossMode: 'kl_cov',
        klCovRatio: 0.5,
        ppoKlCoef: 0.7,
        lossAggMode: 'seq-mean-token-mean',
        useKlLoss: true,
        klLossType: 'low_var_kl',
      },
    );
  });
  it('value model with clipped value loss', async () => {
    await checkModelGrad({ ...small, numKeyValueHeads: 1, head: 'value' }, { type: 'value', cliprangeValue: 0.2 });
  });
  it('SFT cross-entropy', async () => {
    await checkModelGrad({ ...small, numKeyValueHeads: 2 }, { type: 'sft' });
  });
  it('LoRA adapters on every linear layer (GQA, qwen2 biases; PPO + KL + entropy) and on q/v only (SFT): the adapters are the only gradients', async () => {
    await checkModelGrad(
      { ...small, numAttentionHeads: 4, numKeyValueHeads: 2, hiddenSize: 16, modelType: 'qwen2', attentionBias: true },
      {
        type: 'policy',
        clipRatioLow: 0.2,
        clipRatioHigh: 0.28,
        useKlLoss: true,
        klLossType: 'low_var_kl',
        klLossCoef: 0.1,
        entropyCoeff: 0.01,
      },
      2,
      5,
      'fd',
      loraConfig({ rank: 3, alpha: 6, targetModules: 'all-linear' }),
    );
    await checkModelGrad(
      { ...small, numKeyValueHeads: 2, tieWordEmbeddings: true },
      { type: 'sft' },
      2,
      5,
      'fd',
      loraConfig({ rank: 2, alpha: 16, targetModules: ['v_proj', 'q_proj'] }),
    );
  });
});
