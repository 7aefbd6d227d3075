/**
 * The Flow-GRPO SDE sampler keeps the ODE's marginals: on Gaussian data x₀ ~ N(μ, s²) the
 * rectified flow's exact velocity is known, v(x, t) = (t − (1−t)s²)/V_t·(x − (1−t)μ) − μ with
 * V_t = (1−t)²s² + t², so the ODE (Euler) and the SDE (Euler–Maruyama) samples at t = 0 must both
 * have mean μ and variance s² (up to discretisation and sampling error); the SDE's per-step
 * log-probabilities are those of its Gaussian steps.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { gaussian, gaussianLogProb, sampleImages, sdeSigma, timeGrid } from '../../../lib/image/sde.ts';
import { groupAdvantages, nftOptimality } from '../../../lib/image/rl.ts';
import { Rng } from '../../../lib/util/rng.ts';

const MU = 0.6,
  S2 = 0.25;
const exactVelocity = async (x: Float32Array, t: number[]) => {
  const tt = t[0],
    a = 1 - tt,
    V = a * a * S2 + tt * tt;
  const k = (tt - a * S2) / V;
  return Float32Array.from(x, (xi) => k * (xi - a * MU) - MU);
};

function moments(x: Float32Array): { mean: number; v: number } {
  const mean = x.reduce((a, b) => a + b, 0) / x.length;
  return { mean, v: x.reduce((a, b) => a + (b - mean) ** 2, 0) / x.length };
}

test('the SDE sampler has the ODE sampler’s marginal at t = 0 (Gaussian data, exact velocity)', async () => {
  const n = 10000;
  const ode = await sampleImages(exactVelocity, { cls: [0], pixels: n, steps: 200, rng: Rng.fromSeed(1) });
  const sde = await sampleImages(exactVelocity, {
    cls: [0],
    pixels: n,
    steps: 200,
    rng: Rng.fromSeed(2),
    noiseLevel: 0.7,
  });
  const a = moments(ode.x0),
    b = moments(sde.x0);
  // standard errors at n = 10000: mean 0.005, variance 0.0035
  assert.ok(Math.abs(a.mean - MU) < 0.02 && Math.abs(a.v - S2) < 0.02, `ODE ${JSON.stringify(a)}`);
  assert.ok(Math.abs(b.mean - MU) < 0.02 && Math.abs(b.v - S2) < 0.02, `SDE ${JSON.stringify(b)}`);
  assert.equal(sde.steps.length, 199); // the last step into t = 0 is the mean
  // noise without the SDE's drift correction does not keep the marginal (the check can tell)
  const rng = Rng.fromSeed(3);
  const grid = timeGrid(200);
  let x = gaussian(rng, n);
  for (let k = 0; k < 199; k++) {
    const v = await exactVelocity(x, [grid[k]]);
    const std = sdeSigma(0.7, grid[k], grid) * Math.sqrt(grid[k] - grid[k + 1]);
    const e = gaussian(rng, n);
    x = Float32Array.from(x, (xi, i) => xi + (grid[k + 1] - grid[k]) * v[i] + std * e[i]);
  }
  assert.ok(Math.abs(moments(x).v - S2) > 0.05, `uncorrected ${JSON.stringify(moments(x))}`);
});

test('the SDE step log-probability is the Gaussian density of the step it took', async () => {
  const n = 4096;
  const sde = await sampleImages(exactVelocity, {
    cls: [0, 1],
    pixels: n / 2,
    steps: 4,
    rng: Rng.fromSeed(4),
    noiseLevel: 0.5,
  });
  const grid = timeGrid(4);
  for (const st of sde.steps) {
    assert.equal(st.sigma, sdeSigma(0.5, st.t, grid));
    // standardised residuals of a correct step are N(0, 1): mean log-density ≈ −½(1 + log 2π) − log std
    const std = st.sigma * Math.sqrt(st.t - st.tNext);
    const expected = -0.5 * (1 + Math.log(2 * Math.PI)) - Math.log(std);
    for (const lp of st.logProbs) assert.ok(Math.abs(lp - expected) < 0.1, `log-prob ${lp} vs ${expected}`);
  }
  // the formula itself at one point
  const lp = gaussianLogProb(Float32Array.from([1, 3]), Float32Array.from([0, 1]), 2, 1)[0];
  const ref = (-0.5 * 0.25 - 0.5 * 1 - 2 * Math.log(2) - Math.log(2 * Math.PI)) / 2;
  assert.ok(Math.abs(lp - ref) < 1e-6);
});

test('group advantages and DiffusionNFT optimality', () => {
  const a = groupAdvantages([1, 0, 1, 0, 0.5, 0.5], 2);
  assert.deepEqual(
    a.map((x) => Math.round(x * 1000) / 1000),
    [1, -1, 1, -1, 0, 0],
  );
  const r = nftOptimality([1, 0, 0.5, 0.5], 2, { clip: 1, std: 'centred' });
  assert.deepEqual(r, [1, 0, 0.5, 0.5]);
  // the paper's code: A = (R − mean_group)/(std of the raw batch rewards + 1e-4), r = ½ + ½·clip(A/5, −1, 1)
  const rewards = [0.9, 0.1, 0.6, 0.6, 1, 0.2];
  const mean = rewards.reduce((a, b) => a + b) / 6;
  const sd = Math.sqrt(rewards.reduce((a, b) => a + (b - mean) ** 2, 0) / 6) + 1e-4;
  const paper = nftOptimality(rewards, 2);
  assert.deepEqual(paper, nftOptimality(rewards, 2, { clip: 5, std: 'global' }), "the defaults are the paper's");
  const want = [0.4, -0.4, 0, 0, 0.4, -0.4].map((d) => 0.5 + 0.5 * Math.max(-1, Math.min(1, d / sd / 5)));
  paper.forEach((x, i) => assert.ok(Math.abs(x - want[i]) < 1e-12, `${x} vs ${want[i]}`));
  // clip 0.1 saturates every non-zero advantage
  assert.deepEqual(nftOptimality(rewards, 2, { clip: 0.1 }), [1, 0, 0.5, 0.5, 1, 0]);
  // centred: Z is the std of the group-centred rewards (0.327 here), so A = ±1.22 (clipped to ±1), 0
  assert.deepEqual(
    nftOptimality(rewards, 2, { clip: 1, std: 'centred' }).map((x) => Math.round(x * 1e9) / 1e9),
    [1, 0, 0.5, 0.5, 1, 0],
  );
  assert.throws(() => nftOptimality(rewards, 2, { clip: 0 }), /clip must be > 0/);
  assert.throws(() => groupAdvantages([1, 2, 3], 2), /groups of 2/);
});
