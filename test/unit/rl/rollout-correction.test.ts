/**
 * Rollout correction (lib/rl/rollout-correction.ts) against an independent computation: weights as
 * probability ratios p_train / p_rollout (products of ratios for the sequence level), truncated or
 * masked by hand, the k3 KL estimate and the absolute log-prob gaps from the ratios; plus hand-checked small cases and the
 * update stage's use of them (the loss weights are multiplied by them).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { rolloutCorrection, type RolloutCorrectionConfig } from '../../../lib/rl/rollout-correction.ts';
import { Rng } from '../../../lib/util/rng.ts';

const cfg = (c: Partial<RolloutCorrectionConfig>): RolloutCorrectionConfig => ({
  mode: 'tis',
  level: 'token',
  threshold: 2,
  threshold_lower: null,
  ...c,
});

function rows(seed: number) {
  const rng = Rng.fromSeed(`rc:${seed}`);
  return Array.from({ length: 6 }, () => {
    const T = 1 + Math.floor(rng.next() * 7);
    const behaviour = Float32Array.from({ length: T }, () => -0.05 - 3 * rng.next());
    // a mismatched engine: the trainer's log-prob differs by up to ±1 nat
    const old = Float32Array.from(behaviour, (b) => b + (rng.next() * 2 - 1));
    const mask = Uint8Array.from({ length: T }, () => (rng.next() < 0.85 ? 1 : 0));
    return { old, behaviour, mask };
  });
}

/** The independent reference: ratios of probabilities, not differences of log-probs. */
function reference(rs: ReturnType<typeof rows>, c: RolloutCorrectionConfig) {
  const lower = c.threshold_lower ?? 1 / c.threshold;
  let n = 0,
    kl = 0,
    sum = 0,
    cut = 0;
  const diffs: number[] = [];
  const weights = rs.map(({ old, behaviour, mask }) => {
    const ratios = Array.from(old, (o, t) => Math.exp(o) / Math.exp(behaviour[t]));
    const seq = ratios.reduce((p, r, t) => (mask[t] ? p * r : p), 1);
    return ratios.map((r, t) => {
      if (!mask[t]) return 1;
      n++;
      diffs.push(Math.abs(Math.log(r)));
      kl += r - 1 - Math.log(r);
      const raw = c.level === 'sequence' ? seq : r;
      const out = c.mode === 'tis' ? Math.min(raw, c.threshold) : raw > c.threshold || raw < lower ? 0 : raw;
      if (out !== raw) cut++;
      sum += out;
      return out;
    });
  });
  const absMean = diffs.reduce((a, d) => a + d, 0) / n;
  return { weights, kl: kl / n, mean: sum / n, frac: cut / n, absMean, absMax: Math.max(...diffs) };
}

for (const c of [
  cfg({}),
  cfg({ threshold: 1.3 }),
  cfg({ mode: 'mis' }),
  cfg({ mode: 'mis', threshold: 1.5, threshold_lower: 0.8 }),
  cfg({ level: 'sequence' }),
  cfg({ mode: 'mis', level: 'sequence', threshold: 3 }),
]) {
  test(`rollout correction ${c.mode}/${c.level} C=${c.threshold} L=${c.threshold_lower}: an independent computation gives the same weights and metrics`, () => {
    for (const seed of [1, 2, 3]) {
      const rs = rows(seed);
      const got = rolloutCorrection(rs, c);
      const want = reference(rs, c);
      got.weights.forEach((w, i) =>
        w.forEach((v, t) =>
          assert.ok(
            Math.abs(v - want.weights[i][t]) < 1e-5 * Math.max(1, want.weights[i][t]),
            `row ${i} token ${t}: ${v} vs ${want.weights[i][t]}`,
          ),
        ),
      );
      assert.ok(Math.abs(got.metrics['rollout/mismatch_kl'] - want.kl) < 1e-9);
      assert.ok(got.metrics['rollout/mismatch_kl'] > 0);
      assert.ok(Math.abs(got.metrics['rollout/is_weight_mean'] - want.mean) < 1e-6);
      assert.equal(got.metrics['rollout/is_weight_clipped_frac'], want.frac);
      assert.ok(Math.abs(got.metrics['rollout/logprob_mismatch_abs_mean'] - want.absMean) < 1e-6);
      assert.ok(Math.abs(got.metrics['rollout/logprob_mismatch_abs_max'] - want.absMax) < 1e-6);
    }
  });
}

test('rollout correction: equal log-probs give weight 1 and zero KL; off leaves weights at 1', () => {
  const lp = Float32Array.from([-0.5, -1.2, -0.1]);
  const same = rolloutCorrection([{ old: lp, behaviour: lp }], cfg({}));
  assert.deepEqual(Array.from(same.weights[0]), [1, 1, 1]);
  assert.deepEqual(same.metrics, {
    'rollout/mismatch_kl': 0,
    'rollout/is_weight_mean': 1,
    'rollout/is_weight_clipped_frac': 0,
    'rollout/logprob_mismatch_abs_mean': 0,
    'rollout/logprob_mismatch_abs_max': 0,
  });
  // hand-checked: ratio e^1 ≈ 2.718 is capped at 2 (tis), dropped (mis); e^-0.1 ≈ 0.905 is kept
  const r = [{ old: [0, -1.1], behaviour: [-1, -1] }];
  assert.deepEqual(
    Array.from(rolloutCorrection(r, cfg({})).weights[0]).map((v) => +v.toFixed(4)),
    [2, 0.9048],
  );
  assert.deepEqual(
    Array.from(rolloutCorrection(r, cfg({ mode: 'mis' })).weights[0]).map((v) => +v.toFixed(4)),
    [0, 0.9048],
  );
  const off = rolloutCorrection(r, cfg({ mode: 'off' }));
  assert.deepEqual(Array.from(off.weights[0]), [1, 1]);
  assert.ok(Math.abs(off.metrics['rollout/is_weight_mean'] - (Math.E + Math.exp(-0.1)) / 2) < 1e-6);
  assert.throws(() => rolloutCorrection([{ old: [0], behaviour: [0, 0] }], cfg({})), /1 old log-probs but 2/);
});
