/**
 * The trainer: micro-batch accumulation equals the big batch, the in-graph AdamW + clipping equals
 * a float64 JS AdamW applied to the graph's gradient, training reduces the loss on a fixed batch,
 * non-finite gradients skip the update, bad batches are rejected with clear errors.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { modelConfig } from '../../../lib/model/config.ts';
import { paramSpecs } from '../../../lib/model/params.ts';
import { createTrainer, positionsFromMask, type TrainBatch } from '../../../lib/model/train.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { Rng } from '../../../lib/util/rng.ts';

const model = modelConfig({
  hiddenSize: 32,
  intermediateSize: 48,
  numHiddenLayers: 2,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  vocabSize: 11,
  maxPositionEmbeddings: 16,
  bosTokenId: 1,
  eosTokenId: 2,
  padTokenId: 0,
});
const cache = new SessionCache();

/** B rows of prompt (3–5 tokens, some rows left-padded) + response (2–6 tokens, right-padded). */
function makeBatch(B: number, T: number, seed: number): TrainBatch {
  const rng = Rng.fromSeed(seed);
  const n = B * T;
  const tokens = new Int32Array(n),
    attn = new Float32Array(n),
    resp = new Float32Array(n);
  for (let r = 0; r < B; r++) {
    const leftPad = r % 3 === 1 ? 1 : 0;
    const plen = 3 + rng.int(3),
      rlen = 2 + rng.int(Math.min(5, T - plen - leftPad - 1));
    for (let t = leftPad; t < leftPad + plen + rlen && t < T; t++) {
      tokens[r * T + t] = 3 + rng.int(model.vocabSize - 3);
      attn[r * T + t] = 1;
      if (t >= leftPad + plen) resp[r * T + t] = 1;
    }
  }
  const f = (s: number, o = 0) => Float32Array.from({ length: n }, () => (rng.next() - 0.5) * s + o);
  return {
    batchSize: B,
    seqLen: T,
    tokens,
    attentionMask: attn,
    responseMask: resp,
    advantages: f(2),
    oldLogprobs: f(0.6, -2.4),
    refLogprobs: f(0.6, -2.4),
  };
}

const maxRelDiff = (a: Float32Array, b: Float32Array) => {
  let m = 0,
    s = 0;
  for (let i = 0; i < a.length; i++) {
    m = Math.max(m, Math.abs(a[i] - b[i]));
    s = Math.max(s, Math.abs(b[i]));
  }
  return m / Math.max(s, 1e-12);
};

describe('trainer', () => {
  it('micro-batch accumulation equals the single big batch (all agg modes)', async () => {
    for (const lossAggMode of [
      'token-mean',
      'seq-mean-token-sum',
      'seq-mean-token-mean',
      'seq-mean-token-sum-norm',
    ] as const) {
      const loss = { type: 'policy' as const, lossAggMode, useKlLoss: true, entropyCoeff: 0.01 };
      const big = createTrainer({ model, loss, seed: 5, cache, threads: 1 });
      const small = createTrainer({ model, loss, seed: 5, cache, threads: 1, microBatchSize: 3 });
      const batch = makeBatch(8, 12, 1);
      const g1 = await big.computeGradients(batch),
        g2 = await small.computeGradients(batch);
      for (const s of paramSpecs(model))
        assert.ok(
          maxRelDiff(g2.grads.get(s.name)!, g1.grads.get(s.name)!) < 2e-5,
          `${lossAggMode}: grad ${s.name} differs`,
        );
      for (const k of ['pg_loss', 'pg_clipfrac', 'ppo_kl', 'entropy', 'kl_loss', 'loss'])
        assert.ok(
          Math.abs(g1.metrics[k] - g2.metrics[k]) <= 1e-5 * (1 + Math.abs(g1.metrics[k])),
          `${lossAggMode}: metric ${k} ${g1.metrics[k]} vs ${g2.metrics[k]}`,
        );
      const r1 = await big.step(batch, 1e-3),
        r2 = await small.step(batch, 1e-3);
      assert.ok(
        Math.abs(r1.metrics.grad_norm - r2.metrics.grad_norm) < 1e-5 * r1.metrics.grad_norm,
        `grad_norm ${r1.metrics.grad_norm} vs ${r2.metrics.grad_norm}`,
      );
      const w1 = big.getWeights(),
        w2 = small.getWeights();
      // Adam's first step moves an element by lr·g/(|g| + ε): a gradient at float-noise level (|g| ≈ 1e-8,
      // 1e-6 of the largest) that the micro-batch summation order changes by 1 % moves by ≈ 1e-6
      for (const s of paramSpecs(model))
        assert.ok(
          maxRelDiff(w2.get(s.name)!, w1.get(s.name)!) < 4e-5,
          `${lossAggMode}: weights ${s.name} differ after the step`,
        );
    }
  });

  it('the CPU step sums the micro-batches: its grad_norm is the norm of the summed gradient', async () => {
    const loss = { type: 'policy' as const, lossAggMode: 'token-mean' as const, useKlLoss: true };
    for (const tie of [false, true]) {
      const m = modelConfig({ ...model, tieWordEmbeddings: tie });
      const tr = createTrainer({ model: m, loss, seed: 6, cache, threads: 1, microBatchSize: 2 });
      const batch = makeBatch(7, 12, 40 + Number(tie)); // 4 micro-batches
      // the second step reuses the buffers: its first micro-batch overwrites them, nothing carries over
      for (const k of [1, 2]) {
        const { grads } = await tr.computeGradients(batch);
        let sq = 0;
        for (const g of grads.values()) for (const x of g) sq += x * x;
        const norm = Math.sqrt(sq);
        const r = await tr.step(batch, 1e-3);
        assert.ok(
          Math.abs(r.metrics.grad_norm - norm) <= 1e-6 * norm,
          `tied ${tie}, step ${k}: grad_norm ${r.metrics.grad_norm} vs ${norm} of the summed gradients`,
        );
      }
    }
  });

  it('the in-place AdamW runs on slices of a parameter (views at an offset) give the same state as whole tensors', async () => {
    const loss = { type: 'policy' as const };
    const whole = createTrainer({ model, loss, seed: 4, cache, threads: 1 });
    const sliced = createTrainer({ model, loss, seed: 4, cache, threads: 1, optimizerSlice: 37 });
    for (let k = 0; k < 2; k++) {
      const batch = makeBatch(4, 10, 30 + k);
      await whole.step(batch, 1e-2);
      await sliced.step(batch, 1e-2);
    }
    const o1 = whole.getOptimizerState(),
      o2 = sliced.getOptimizerState();
    for (const s of paramSpecs(model)) {
      assert.deepEqual(sliced.weightsView().get(s.name), whole.weightsView().get(s.name), `weights ${s.name}`);
      assert.deepEqual(o2.expAvgSq.get(s.name), o1.expAvgSq.get(s.name), `exp_avg_sq ${s.name}`);
    }
    assert.notDeepEqual(
      whole.weightsView().get('model.norm.weight'),
      createTrainer({ model, loss, seed: 4, cache, threads: 1 }).weightsView().get('model.norm.weight'),
    );
  });

  it('the GPU path (packed outputs, fused step graph) and the CPU path (grad graph into pre-allocated buffers, in-place AdamW graph) agree', async () => {
    const loss = { type: 'policy' as const, lossAggMode: 'token-mean' as const, useKlLoss: true };
    const plain = createTrainer({ model, loss, seed: 5, cache, threads: 1, microBatchSize: 3, packOutputs: false });
    const packed = createTrainer({ model, loss, seed: 5, cache, threads: 1, microBatchSize: 3, packOutputs: true });
    for (let k = 0; k < 3; k++) {
      const batch = makeBatch(8, 12, 10 + k);
      const g1 = await plain.computeGradients(batch),
        g2 = await packed.computeGradients(batch);
      for (const s of paramSpecs(model))
        assert.deepEqual(g2.grads.get(s.name), g1.grads.get(s.name), `step ${k}: grad ${s.name}`);
      const r1 = await plain.step(batch, 1e-2),
        r2 = await packed.step(batch, 1e-2);
      // the CPU path sums the norm in float64, the step graph in float32; weights differ by rounding
      for (const [m, v] of Object.entries(r1.metrics))
        assert.ok(Math.abs(r2.metrics[m] - v) <= 1e-5 * (1 + Math.abs(v)), `step ${k}: ${m} ${r2.metrics[m]} vs ${v}`);
    }
    const w1 = plain.getWeights(),
      w2 = packed.getWeights(),
      o1 = plain.getOptimizerState(),
      o2 = packed.getOptimizerState();
    for (const s of paramSpecs(model)) {
      assert.ok(maxRelDiff(w2.get(s.name)!, w1.get(s.name)!) < 4e-5, `weights ${s.name}`);
      assert.ok(maxRelDiff(o2.expAvg.get(s.name)!, o1.expAvg.get(s.name)!) < 1e-4, `exp_avg ${s.name}`);
      assert.ok(maxRelDiff(o2.expAvgSq.get(s.name)!, o1.expAvgSq.get(s.name)!) < 1e-4, `exp_avg_sq ${s.name}`);
      assert.equal(packed.weightsView().get(s.name)!.length, w1.get(s.name)!.length);
    }
    assert.equal(o1.step, 3);
    assert.equal(o2.step, 3);
  });

  it('gspo, sapo, cispo, geo_mean: micro-batches give the loss of lib/rl on the whole mini-batch and the big-batch gradient', async () => {
    const { computePolicyLoss } = await import('../../../lib/rl/policy-loss-registry.ts');
    const B = 8,
      T = 12,
      batch = makeBatch(B, T, 2);
    const f64 = (a: ArrayLike<number>) => ({ data: Float64Array.from(a), bs: B, T });
    for (const lossMode of ['gspo', 'sapo', 'cispo', 'geo_mean']) {
      // the configured mode (token-mean) aggregates entropy and KL; gspo, sapo and geo_mean fix their pg term's own
      const loss = {
        type: 'policy' as const,
        lossMode,
        clipRatioLow: 0.2,
        clipRatioHigh: 0.28,
        tauPos: 1.5,
        useKlLoss: true,
        entropyCoeff: 0.01,
      };
      const big = createTrainer({ model, loss, seed: 5, cache, threads: 1 });
      const small = createTrainer({ model, loss, seed: 5, cache, threads: 1, microBatchSize: 3 });
      const ev = await small.evaluate(batch);
      const ref = computePolicyLoss(
        lossMode,
        {
          old_log_prob: f64(batch.oldLogprobs!),
          log_prob: f64(ev.perToken),
          advantages: f64(batch.advantages!),
          response_mask: f64(batch.responseMask),
        },
        { clip_ratio_low: 0.2, clip_ratio_high: 0.28, tau_pos: 1.5, loss_agg_mode: 'token-mean' },
      );
      const expected: Record<string, number> = {
        pg_loss: ref.pg_loss,
        pg_clipfrac: ref.metrics.pg_clipfrac!,
        pg_clipfrac_lower: ref.metrics.pg_clipfrac_lower!,
        ppo_kl: ref.metrics.ppo_kl!,
      };
      for (const [k, e] of Object.entries(expected))
        assert.ok(
          Math.abs(ev.metrics[k] - e) <= 2e-5 * (1 + Math.abs(e)),
          `${lossMode}: ${k} ${ev.metrics[k]} vs lib/rl ${e}`,
        );
      const g1 = await big.computeGradients(batch),
        g2 = await small.computeGradients(batch);
      for (const s of paramSpecs(model))
        assert.ok(
          maxRelDiff(g2.grads.get(s.name)!, g1.grads.get(s.name)!) < 2e-5,
          `${lossMode}: grad ${s.name} differs`,
        );
      for (const k of ['pg_loss', 'entropy', 'kl_loss', 'loss'])
        assert.ok(
          Math.abs(g1.metrics[k] - g2.metrics[k]) <= 1e-5 * (1 + Math.abs(g1.metrics[k])),
          `${lossMode}: metric ${k} ${g1.metrics[k]} vs ${g2.metrics[k]}`,
        );
    }
  });

  it("clip_cov and kl_cov select per micro-batch, as lib/rl called on each micro-batch (clip_cov with the trainer's seeded priorities)", async () => {
    const { computePolicyLoss } = await import('../../../lib/rl/policy-loss-registry.ts');
    const B = 8,
      T = 12,
      batch = makeBatch(B, T, 4);
    const attn = batch.attentionMask!;
    let total = 0;
    for (let i = 0; i < B * T; i++) if ((i % T) + 1 < T) total += batch.responseMask[i + 1];
    for (const [lossMode, mb] of [
      ['clip_cov', 3],
      ['clip_cov', 8],
      ['kl_cov', 3],
      ['kl_cov', 8],
    ] as const) {
      const loss = {
        type: 'policy' as const,
        lossMode,
        clipRatioLow: 0.2,
        clipRatioHigh: 0.28,
        clipCovRatio: 0.2,
        clipCovLb: -5,
        clipCovUb: 5,
        klCovRatio: 0.2,
        ppoKlCoef: 2,
      };
      const tr = createTrainer({ model, loss, seed: 9, cache, threads: 1, microBatchSize: mb });
      const expected = (perToken: Float32Array, step: number) => {
        // the graph's layout of each micro-batch: position t carries token t + 1, rows trimmed to the longest
        let pg = 0,
          clipped = 0,
          kl = 0;
        for (let r0 = 0, k = 0; r0 < B; r0 += mb, k++) {
          const rows = Math.min(mb, B - r0);
          let Tk = 2;
          for (let r = r0; r < r0 + rows; r++)
            for (let t = T - 1; t >= Tk; t--)
              if (attn[r * T + t]) {
                Tk = t + 1;
                break;
              }
          const sh = (a: ArrayLike<number>) => ({
            data: Float64Array.from({ length: rows * Tk }, (_, i) => {
              const r = r0 + Math.floor(i / Tk),
                t = i % Tk;
              return t + 1 < T ? a[r * T + t + 1] : 0;
            }),
            bs: rows,
            T: Tk,
          });
          const M = sh(batch.responseMask);
          const ref = computePolicyLoss(
            lossMode,
            {
              old_log_prob: sh(batch.oldLogprobs!),
              log_prob: sh(perToken),
              advantages: sh(batch.advantages!),
              response_mask: M,
            },
            {
              clip_ratio_low: 0.2,
              clip_ratio_high: 0.28,
              clip_cov_ratio: 0.2,
              clip_cov_lb: -5,
              clip_cov_ub: 5,
              kl_cov_ratio: 0.2,
              ppo_kl_coef: 2,
              loss_agg_mode: 'token-mean',
              global_batch_info: { batch_num_tokens: total },
              rng: Rng.fromSeed(`clip_cov:9:${step}:${k}`),
            },
          );
          const mSum = M.data.reduce((s, v) => s + v, 0);
          pg += ref.pg_loss;
          kl += ref.metrics.ppo_kl! * mSum;
          clipped += (ref.metrics.pg_clipfrac ?? 0) * mSum;
        }
        return { pg, kl, clipped };
      };
      const ev = await tr.evaluate(batch);
      const { pg, kl, clipped } = expected(ev.perToken, 0);
      assert.ok(
        Math.abs(ev.metrics.pg_loss - pg) <= 2e-5 * (1 + Math.abs(pg)),
        `${lossMode} mb ${mb}: pg_loss ${ev.metrics.pg_loss} vs lib/rl per micro-batch ${pg}`,
      );
      assert.ok(
        Math.abs(ev.metrics.ppo_kl - kl / total) <= 2e-5,
        `${lossMode} mb ${mb}: ppo_kl ${ev.metrics.ppo_kl} vs ${kl / total}`,
      );
      if (lossMode === 'clip_cov') {
        assert.ok(
          Math.abs(ev.metrics.pg_clipfrac - clipped / total) <= 1e-6,
          `clip_cov mb ${mb}: pg_clipfrac ${ev.metrics.pg_clipfrac} vs ${clipped / total}`,
        );
        assert.ok(clipped > 0, 'clip_cov zeroed some tokens');
      }
      // the draw is keyed by the optimizer step: the same step repeats it, the next step (lr 0: same weights) draws anew
      const again = await tr.evaluate(batch);
      assert.equal(again.metrics.pg_loss, ev.metrics.pg_loss);
      assert.equal((await tr.step(batch, 0)).step, 1);
      const ev1 = await tr.evaluate(batch),
        e1 = expected(ev1.perToken, 1);
      assert.ok(
        Math.abs(ev1.metrics.pg_loss - e1.pg) <= 2e-5 * (1 + Math.abs(e1.pg)),
        `${lossMode} mb ${mb} after a step: pg_loss ${ev1.metrics.pg_loss} vs ${e1.pg}`,
      );
      if (lossMode === 'clip_cov' && mb === 3)
        assert.notEqual(e1.pg, pg, 'a different draw (the fixture zeroes a different subset at step 1)');
    }
  });

  it('in-graph clipping + AdamW equals torch-style AdamW in float64 on the same gradient (3 steps)', async () => {
    const optim = { betas: [0.9, 0.95] as [number, number], eps: 1e-6, weightDecay: 0.1, maxGradNorm: 0.05 };
    const tr = createTrainer({ model, loss: { type: 'policy' }, seed: 7, cache, threads: 1, optim, microBatchSize: 5 });
    const specs = paramSpecs(model);
    const p = new Map(specs.map((s) => [s.name, Float64Array.from(tr.getWeights().get(s.name)!)]));
    const m = new Map(specs.map((s) => [s.name, new Float64Array(p.get(s.name)!.length)]));
    const v = new Map(specs.map((s) => [s.name, new Float64Array(p.get(s.name)!.length)]));
    const lrs = [1e-2, 5e-3, 2e-3];
    for (let step = 1; step <= 3; step++) {
      const batch = makeBatch(9, 12, 100 + step);
      const { grads } = await tr.computeGradients(batch);
      let sq = 0;
      for (const g of grads.values()) for (const x of g) sq += x * x;
      const norm = Math.sqrt(sq),
        coef = Math.min(1, optim.maxGradNorm / (norm + 1e-6));
      const lr = lrs[step - 1];
      const res = await tr.step(batch, lr);
      assert.ok(Math.abs(res.metrics.grad_norm - norm) < 1e-4 * norm, `grad_norm ${res.metrics.grad_norm} vs ${norm}`);
      assert.equal(res.step, step);
      const [b1, b2] = optim.betas;
      for (const s of specs) {
        const P = p.get(s.name)!,
          M = m.get(s.name)!,
          Vv = v.get(s.name)!,
          g = grads.get(s.name)!;
        for (let i = 0; i < P.length; i++) {
          const gi = g[i] * coef;
          M[i] = b1 * M[i] + (1 - b1) * gi;
          Vv[i] = b2 * Vv[i] + (1 - b2) * gi * gi;
          const denom = Math.sqrt(Vv[i]) / Math.sqrt(1 - b2 ** step) + optim.eps;
          P[i] = P[i] * (1 - lr * optim.weightDecay) - ((lr / (1 - b1 ** step)) * M[i]) / denom;
        }
      }
      // keep the JS reference on the graph's trajectory (float32 rounding of weights), compare the update
      const got = tr.getWeights();
      for (const s of specs) {
        const a = got.get(s.name)!,
          e = p.get(s.name)!;
        let worst = 0;
        for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - e[i]));
        assert.ok(worst < 2e-6, `step ${step} ${s.name}: max |Δ| ${worst}`);
        e.set(a);
      }
      const st = tr.getOptimizerState();
      assert.equal(st.step, step);
      for (const s of specs)
        assert.ok(maxRelDiff(st.expAvg.get(s.name)!, Float32Array.from(m.get(s.name)!)) < 1e-4, `exp_avg ${s.name}`);
    }
  });

  it('PPO steps on a fixed batch raise the surrogate objective; SFT steps lower the NLL', async () => {
    const batch = makeBatch(8, 12, 3);
    const tr = createTrainer({ model, loss: { type: 'policy' }, seed: 1, cache, threads: 1 });
    const first = await tr.step(batch, 3e-3);
    let last = first;
    for (let i = 0; i < 8; i++) last = await tr.step(batch, 3e-3);
    assert.ok(
      last.metrics.pg_loss < first.metrics.pg_loss - 0.05,
      `pg_loss ${first.metrics.pg_loss} → ${last.metrics.pg_loss}`,
    );
    const sft = createTrainer({ model, loss: { type: 'sft' }, seed: 1, cache, threads: 1, optim: { weightDecay: 0 } });
    const e0 = (await sft.evaluate(batch)).metrics.sft_loss;
    for (let i = 0; i < 15; i++) await sft.step(batch, 1e-2);
    const e1 = (await sft.evaluate(batch)).metrics.sft_loss;
    assert.ok(e1 < 0.5 * e0, `sft loss ${e0} → ${e1}`);
  });

  it('evaluate returns per-token log-probs aligned to token positions, consistent with the loss', async () => {
    const batch = makeBatch(4, 10, 9);
    const tr = createTrainer({ model, loss: { type: 'sft' }, seed: 2, cache, threads: 1 });
    const { metrics, perToken } = await tr.evaluate(batch);
    let s = 0,
      n = 0;
    for (let i = 0; i < perToken.length; i++) {
      if (i % 10 === 0) assert.equal(perToken[i], 0);
      else {
        assert.ok(perToken[i] < 0, `log-prob at ${i} is ${perToken[i]}`);
        if (batch.responseMask[i]) {
          s += perToken[i];
          n++;
        }
      }
    }
    assert.ok(Math.abs(metrics.sft_loss - -s / n) < 1e-5, `sft_loss ${metrics.sft_loss} vs mean NLL ${-s / n}`);
    // rows are independent: the same row alone gives the same log-probs
    const one = await tr.evaluate({
      seqLen: 10,
      batchSize: 1,
      tokens: batch.tokens.subarray(10, 20),
      attentionMask: batch.attentionMask!.subarray(10, 20),
      responseMask: batch.responseMask.subarray(10, 20),
    });
    for (let t = 1; t < 10; t++)
      if (batch.attentionMask![10 + t])
        assert.ok(
          Math.abs(one.perToken[t] - perToken[10 + t]) < 1e-5,
          `position ${t}: alone ${one.perToken[t]} vs in batch ${perToken[10 + t]}`,
        );
  });

  it('skips the update when the gradient is not finite', async () => {
    const batch = makeBatch(4, 10, 4);
    batch.advantages![batch.responseMask.indexOf(1)] = NaN;
    const tr = createTrainer({ model, loss: { type: 'policy' }, seed: 3, cache, threads: 1 });
    const before = tr.getWeights();
    const r = await tr.step(batch, 1e-2);
    assert.equal(r.skipped, true);
    assert.equal(r.step, 0);
    assert.deepEqual(tr.getWeights().get('model.norm.weight'), before.get('model.norm.weight'));
  });

  it('rejects bad batches and configs with messages that say what to fix', async () => {
    const tr = createTrainer({ model, loss: { type: 'policy', useKlLoss: true }, seed: 3, cache });
    const b = makeBatch(2, 8, 5);
    await assert.rejects(tr.step({ ...b, refLogprobs: undefined }, 1e-3), /refLogprobs.*required/);
    await assert.rejects(tr.step({ ...b, advantages: new Float32Array(3) }, 1e-3), /advantages.*3 values.*16/);
    await assert.rejects(
      tr.step({ ...b, tokens: Int32Array.from(b.tokens, (x, i) => (i === 5 ? 99 : x)) }, 1e-3),
      /token 99 .*vocabulary/,
    );
    await assert.rejects(tr.step({ ...b, responseMask: new Float32Array(16) }, 1e-3), /no response tokens/);
    assert.throws(
      () => createTrainer({ model, loss: { type: 'policy', lossMode: 'ppo2' } }),
      /policy_loss.loss_mode "ppo2".*valid: cispo, clip_cov, geo_mean, gpg, gspo, kl_cov, nft, reinforce, sapo, vanilla/,
    );
    assert.throws(
      () => createTrainer({ model, loss: { type: 'policy', useKlLoss: true, klLossType: 'k9' } }),
      /kl_loss_type "k9"/,
    );
    assert.throws(() => createTrainer({ model, loss: { type: 'value' } }), /value model/);
    assert.throws(() => createTrainer({ model, loss: { type: 'policy', clipRatioC: 0.5 } }), /clipRatioC must be > 1/);
  });

  it('NFT: needs ±1 rewards and group labels; steps lower the loss; reports r_hat_mean and neg_clamp_frac', async () => {
    const batch = makeBatch(6, 12, 8);
    const tr = createTrainer({
      model,
      loss: { type: 'policy', lossMode: 'nft', nft: { clampNegative: 0.5 } },
      seed: 4,
      cache,
      threads: 1,
      microBatchSize: 4,
    });
    await assert.rejects(tr.step(batch, 1e-3), /nft loss needs "rewards"/);
    const nb = {
      ...batch,
      advantages: undefined,
      rewards: [1, -1, 1, -1, -1, 1],
      groupIndex: ['a', 'a', 'b', 'b', 'c', 'c'],
    };
    await assert.rejects(tr.step({ ...nb, rewards: [1, 0, 1, -1, -1, 1] }, 1e-3), /\+1 or −1|±1|\+1 \(correct\)/);
    const first = await tr.step(nb, 3e-3);
    assert.equal(first.metrics.r_hat_mean, 0.5);
    assert.ok(
      first.metrics.neg_clamp_frac >= 0 && first.metrics.neg_clamp_frac <= 1,
      `neg_clamp_frac ${first.metrics.neg_clamp_frac}`,
    );
    let last = first;
    for (let i = 0; i < 5; i++) last = await tr.step(nb, 3e-3);
    assert.ok(
      last.metrics.pg_loss < first.metrics.pg_loss,
      `nft loss ${first.metrics.pg_loss} → ${last.metrics.pg_loss}`,
    );
  });

  it("NFT: groupAccuracy (the whole group's fraction correct) gives r̂ per row, as groupIndex does for whole groups", async () => {
    const batch = makeBatch(6, 12, 8);
    const rewards = [1, -1, 1, -1, -1, 1];
    const mk = () =>
      createTrainer({
        model,
        loss: { type: 'policy', lossMode: 'nft', nft: { clampNegative: 0.5 } },
        seed: 4,
        cache,
        threads: 1,
      });
    const viaIndex = mk(),
      viaAcc = mk();
    const nb = { ...batch, advantages: undefined, rewards };
    for (let i = 0; i < 2; i++) {
      const a = await viaIndex.step({ ...nb, groupIndex: ['a', 'a', 'b', 'b', 'c', 'c'] }, 3e-3);
      const b = await viaAcc.step({ ...nb, groupAccuracy: [0.5, 0.5, 0.5, 0.5, 0.5, 0.5] }, 3e-3);
      assert.deepEqual(b.metrics, a.metrics, `step ${i}`);
    }
    for (const [k, w] of viaIndex.weightsView()) assert.deepEqual(viaAcc.weightsView().get(k), w, k);
    // a mini-batch holding part of a group: r̂ comes from the whole group, clamped to [rHatMin, rHatMax]
    const part = await mk().step({ ...nb, groupAccuracy: [0.25, 0.25, 1, 1, 0, 0] }, 3e-3);
    assert.ok(
      Math.abs(part.metrics.r_hat_mean - (0.25 * 2 + 0.98 * 2 + 0.02 * 2) / 6) < 1e-12,
      `r_hat_mean ${part.metrics.r_hat_mean}`,
    );
    const changed = await mk().step({ ...nb, groupAccuracy: [0.25, 0.25, 0.75, 0.75, 0.5, 0.5] }, 3e-3);
    assert.notEqual(changed.metrics.grad_norm, part.metrics.grad_norm, 'r̂ enters the gradient');
    await assert.rejects(
      mk().step({ ...nb, groupAccuracy: [0.5, 0.5, 0.5] }, 3e-3),
      /"groupAccuracy" has 3 values, expected one per sequence \(6\)/,
    );
    await assert.rejects(
      mk().step({ ...nb, groupAccuracy: [0.5, 0.5, 1.5, 0.5, 0.5, 0.5] }, 3e-3),
      /"groupAccuracy" must be a fraction in \[0, 1\]; groupAccuracy\[2\] = 1\.5/,
    );
    await assert.rejects(
      mk().step({ ...nb, rewards: [1, 0, 1, -1, -1, 1], groupAccuracy: [0.5, 0.5, 0.5, 0.5, 0.5, 0.5] }, 3e-3),
      /nft rewards must be \+1 or −1; rewards\[1\] = 0/,
    );
  });

  it('positions from mask handle left padding', () => {
    assert.deepEqual(Array.from(positionsFromMask([0, 0, 1, 1, 1, 1, 1, 0], 2, 4)), [0, 0, 0, 1, 0, 1, 2, 2]);
  });
});

describe('trainer: critic and session reuse', () => {
  it('value model: clipped value-loss steps lower vf_loss on a fixed batch', async () => {
    const vm = modelConfig({ ...model, head: 'value' });
    const b = makeBatch(6, 12, 12);
    const n = 6 * 12;
    const batch: TrainBatch = {
      ...b,
      advantages: undefined,
      oldLogprobs: undefined,
      refLogprobs: undefined,
      values: new Float32Array(n),
      returns: Float32Array.from({ length: n }, (_, i) => (i % 3) - 1),
    };
    const tr = createTrainer({
      model: vm,
      loss: { type: 'value', cliprangeValue: 0.5 },
      seed: 2,
      cache,
      threads: 1,
      optim: { weightDecay: 0 },
    });
    await assert.rejects(tr.step({ ...batch, returns: undefined }, 1e-3), /"returns" is required/);
    const first = await tr.step(batch, 5e-3);
    let last = first;
    for (let i = 0; i < 10; i++) last = await tr.step({ ...batch, values: (await tr.evaluate(batch)).perToken }, 5e-3);
    assert.ok(
      last.metrics.vf_loss < 0.8 * first.metrics.vf_loss,
      `vf_loss ${first.metrics.vf_loss} → ${last.metrics.vf_loss}`,
    );
    assert.ok(
      last.metrics.vf_clipfrac >= 0 && last.metrics.vf_clipfrac <= 1,
      `vf_clipfrac ${last.metrics.vf_clipfrac}`,
    );
  });

  it('one session per graph family serves every batch shape; a step updates the weights in place, getWeights is a snapshot', async () => {
    const own = new SessionCache();
    const tr = createTrainer({ model, loss: { type: 'policy' }, seed: 2, cache: own, threads: 1 });
    const view = tr.weightsView();
    const snap = tr.getWeights();
    const before = Float32Array.from(view.get('model.norm.weight')!);
    for (const [B, T] of [
      [2, 8],
      [5, 12],
      [3, 16],
    ])
      await tr.step(makeBatch(B, T, B * T), 1e-3);
    assert.equal(own.sessionsBuilt, 2, 'the grad graph and the AdamW graph are built once for all shapes');
    assert.deepEqual(snap.get('model.norm.weight'), before, 'a copy taken earlier is not modified by later steps');
    assert.equal(
      tr.weightsView().get('model.norm.weight'),
      view.get('model.norm.weight'),
      'the step wrote into the same buffer',
    );
    assert.notDeepEqual(view.get('model.norm.weight'), before);
    assert.equal(tr.stepCount, 3);
  });
});
