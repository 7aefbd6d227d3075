/**
 * VPPO in the pipeline: the advantage stage's per-sample masks and scaling factors must be what
 * lib/rl's reference functions give on the padded batch, and the update stage must apply them.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  tokenGradientMask,
  tokenVisualDependency,
  trajectoryAdvantageScaling,
  vppoStage,
  type VppoSampleInput,
  type VppoStageConfig,
} from '../../../lib/rl/index.ts';
import { applyVppoToSample } from '../../../services/update/logic.ts';
import { Rng } from '../../../lib/util/rng.ts';
import { close } from './helpers.ts';

function randomSamples(seed: number, n: number): VppoSampleInput[] {
  const rng = Rng.fromSeed(seed);
  const out: VppoSampleInput[] = [];
  for (let i = 0; i < n; i++) {
    const L = i === 2 ? 0 : 1 + rng.int(12); // one empty response
    const f = (g: () => number) => Float32Array.from({ length: L }, g);
    const old = f(() => -3 * rng.next());
    out.push({
      id: `s${i}`,
      old_logprobs: old,
      perturbed_logprobs: old.map((v) => v + (rng.next() - 0.5) * 4 * (i % 3)),
      entropies: f(() => 2 * rng.next()),
      advantages: f(() => rng.next() - 0.5),
    });
  }
  return out;
}

/** The reference: lib/rl's functions on the (bs, T) batch the test pads itself. */
function reference(samples: VppoSampleInput[], cfg: VppoStageConfig) {
  const bs = samples.length,
    T = Math.max(1, ...samples.map((s) => s.advantages.length));
  const pad = (get: (s: VppoSampleInput) => Float32Array) => {
    const d = new Float64Array(bs * T);
    samples.forEach((s, i) => d.set(get(s), i * T));
    return { data: d, bs, T };
  };
  const mask = { data: new Float64Array(bs * T), bs, T };
  samples.forEach((s, i) => mask.data.fill(1, i * T, i * T + s.advantages.length));
  const dep = tokenVisualDependency(
    pad((s) => s.old_logprobs),
    pad((s) => s.perturbed_logprobs),
  );
  const filt = tokenGradientMask(
    mask,
    { dependency: dep, entropy: pad((s) => s.entropies!) },
    {
      top_p_perception_tokens: cfg.top_p_perception_tokens,
      top_p_entropy_tokens: cfg.enable_entropy_filtering ? cfg.top_p_entropy_tokens : null,
    },
  );
  const scale = trajectoryAdvantageScaling(
    pad((s) => s.advantages),
    dep,
    mask,
    { advantage_scaling_min: cfg.advantage_scaling_min },
  );
  return { T, dep, filt, scale };
}

for (const entropy of [false, true]) {
  test(`vppoStage = lib/rl's reference functions on the padded batch (entropy filtering ${entropy ? 'on' : 'off'})`, () => {
    const cfg: VppoStageConfig = {
      top_p_perception_tokens: 0.3,
      enable_entropy_filtering: entropy,
      top_p_entropy_tokens: 0.2,
      advantage_scaling_min: 0.7,
    };
    const samples = randomSamples(entropy ? 2 : 1, 9);
    const got = vppoStage(samples, cfg);
    const ref = reference(samples, cfg);
    samples.forEach((s, i) => {
      const o = got.samples.get(s.id)!;
      const L = s.advantages.length;
      assert.deepEqual(
        Array.from(o.token_mask),
        Array.from(ref.filt.keep_mask.data.subarray(i * ref.T, i * ref.T + L)),
        `mask of ${s.id}`,
      );
      assert.equal(o.scaling_factor, ref.scale.alpha[i], `α of ${s.id}`);
      assert.deepEqual(
        Array.from(o.dependency),
        Array.from(Float32Array.from(ref.dep.data.subarray(i * ref.T, i * ref.T + L))),
      );
    });
    assert.deepEqual(got.metrics, {
      'actor/entropy_token_fraction': ref.filt.metrics.entropy_token_fraction,
      'actor/perception_token_fraction': ref.filt.metrics.perception_token_fraction,
      'actor/sensitivity_score_mean': ref.scale.metrics.sensitivity_score_mean,
      'actor/scaling_factor_mean': ref.scale.metrics.scaling_factor_mean,
    });
    close(got.metrics['actor/scaling_factor_mean'], 1, 1e-6);
    if (!entropy) assert.equal(got.metrics['actor/entropy_token_fraction'], 0);
    else assert.ok(got.metrics['actor/entropy_token_fraction'] > 0);
    assert.equal(got.samples.get('s2')!.token_mask.length, 0);
    assert.equal(got.samples.get('s2')!.scaling_factor, 1, 'an empty response keeps α = 1');
  });
}

test('vppoStage: a small worked case — the image-dependent token is kept, the image-dependent trajectory amplified', () => {
  const cfg: VppoStageConfig = {
    top_p_perception_tokens: 0.5,
    enable_entropy_filtering: false,
    top_p_entropy_tokens: 0.2,
    advantage_scaling_min: 0.8,
  };
  const out = vppoStage(
    [
      {
        id: 'a',
        old_logprobs: Float32Array.of(-1, -1),
        perturbed_logprobs: Float32Array.of(-1, -3),
        advantages: Float32Array.of(1, 1),
      },
      {
        id: 'b',
        old_logprobs: Float32Array.of(-1, -1),
        perturbed_logprobs: Float32Array.of(-1, -1),
        advantages: Float32Array.of(-1, -1),
      },
    ],
    cfg,
  );
  assert.deepEqual(Array.from(out.samples.get('a')!.token_mask), [0, 1]);
  assert.deepEqual(Array.from(out.samples.get('b')!.token_mask), [1, 0], 'a tie keeps the earlier token');
  // S̄_a = (e^-2 + 1)/2, S̄_b = 0 → n = [1, 0], mean n = 0.5, β_max = 0.8 + 0.2/0.5 = 1.2
  close(out.samples.get('a')!.scaling_factor, 1.2, 1e-7);
  assert.equal(out.samples.get('b')!.scaling_factor, 0.8);
  close(out.metrics['actor/perception_token_fraction'], 0.5, 1e-15);
  close(out.metrics['actor/sensitivity_score_mean'], (Math.exp(-2) + 1) / 4, 1e-7);
});

test('vppoStage refuses mismatched lengths and missing entropies, saying what to fix', () => {
  const cfg: VppoStageConfig = {
    top_p_perception_tokens: 0.2,
    enable_entropy_filtering: true,
    top_p_entropy_tokens: 0.2,
    advantage_scaling_min: 0.8,
  };
  const ok = {
    id: 'x',
    old_logprobs: Float32Array.of(-1),
    perturbed_logprobs: Float32Array.of(-2),
    advantages: Float32Array.of(1),
  };
  assert.throws(() => vppoStage([ok], cfg), /enable_entropy_filtering needs the token entropies .* sample x has none/);
  assert.throws(
    () =>
      vppoStage([{ ...ok, perturbed_logprobs: Float32Array.of(-1, -2) }], { ...cfg, enable_entropy_filtering: false }),
    /sample x has 2 perturbed_logprobs for 1 response tokens/,
  );
});

test('update: loss weights × token mask, advantages × α; samples without VPPO fields unchanged', () => {
  const base = { advantages: Float32Array.of(0.5, -1, 2), loss_weights: Float32Array.of(1, 1, 0) };
  assert.equal(applyVppoToSample(base).advantages, base.advantages);
  const out = applyVppoToSample({ ...base, vppo_token_mask: Uint8Array.of(1, 0, 1), vppo_scaling: 1.5 });
  assert.deepEqual(Array.from(out.advantages), [0.75, -1.5, 3]);
  assert.deepEqual(Array.from(out.loss_weights), [1, 0, 0], 'a masked-out token stays out');
  assert.deepEqual(Array.from(base.loss_weights), [1, 1, 0], 'the inputs are not modified');
  assert.throws(
    () => applyVppoToSample({ ...base, vppo_token_mask: Uint8Array.of(1), vppo_scaling: 1 }),
    /token mask of 1 for 3 response tokens/,
  );
  assert.throws(() => applyVppoToSample({ ...base, vppo_token_mask: null, vppo_scaling: NaN }), /scaling factor NaN/);
});
