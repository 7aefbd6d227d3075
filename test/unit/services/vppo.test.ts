/**
 * VPPO in the pipeline without a vision model (pure logic and the scoring seam): the advantage
 * stage's extra pass scores real and perturbed images with the same weights, attachVppo puts the
 * masks and factors of lib/rl/vppo-stage.ts on the kept samples (updates.v2), the trajectory rows
 * carry them, and the update applies them.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { computeStep, attachVppo } from '../../../services/advantage/logic.ts';
import { applyVppoToSample } from '../../../services/update/logic.ts';
import type { ScoredGroup, ScoredSample } from '../../../lib/contracts/index.ts';
import { recordProblems } from '../../../lib/contracts/invariants.ts';
import { advantageSettings, scoredGroup, scoredSample } from './advantage-fixtures.ts';
import { vppoStage, type VppoStageConfig } from '../../../lib/rl/index.ts';
import { perturbationKey, vppoScores, type ImageScoreRequest, type VppoSettings } from '../../../lib/pipeline/vppo.ts';
import { PixelCache } from '../../../lib/data/pixel-cache.ts';
import { encodeRgbPng } from '../../../lib/data/images.ts';
import { perturbImage, DEFAULT_PERTURB_OPTIONS } from '../../../lib/data/perturb.ts';
import { generateVisionGame } from '../../../lib/tasks/number-game-vision.ts';
import { sampleRow } from '../../../lib/pipeline/rows.ts';
import { ConfigError } from '../../../lib/errors.ts';

const settings = advantageSettings();
const stage: VppoStageConfig = {
  top_p_perception_tokens: 0.5,
  enable_entropy_filtering: false,
  top_p_entropy_tokens: 0.2,
  advantage_scaling_min: 0.8,
};

function sample(p: number, i: number, reward: number, len: number): ScoredSample {
  return scoredSample(p, i, reward, {
    responseIds: Int32Array.from({ length: len }, (_, t) => 3 + t),
    logprobs: Float32Array.from({ length: len }, (_, t) => -0.5 - 0.1 * t),
  });
}

function group(p: number, rewards: number[], images: Buffer[] = []): ScoredGroup {
  return scoredGroup(
    p,
    rewards.map((r, i) => sample(p, i, r, 2 + i)),
    { prompt_ids: Int32Array.from([1, 2]), images },
  );
}

test("attachVppo: kept samples get lib/rl's masks and factors (advantages stay unscaled), filtered ones none; valid updates.v2 records", () => {
  const kept = [group(0, [1, 0, 1]), group(1, [0, 1, 1])];
  const filtered = group(2, [1, 1, 1]);
  const res = computeStep(kept, [{ group: filtered, reason: 'all correct' }], null, settings, null);
  assert.ok(
    res.updates.every((u) => u.samples.every((x) => x.vppo === null)),
    'no VPPO unless attached',
  );
  const perturbed = new Map(
    kept
      .flatMap((g) => g.samples)
      .map((x, k) => [x.id, { logprobs: x.behaviour_logprobs.map((v, t) => v - 0.3 * ((k + t) % 3)) }]),
  );
  const { updates, metrics } = attachVppo(res.updates, perturbed, stage);
  const ref = vppoStage(
    res.updates
      .filter((u) => !u.filtered)
      .flatMap((u) => u.samples)
      .map((x) => ({
        id: x.id,
        old_logprobs: x.behaviour_logprobs,
        perturbed_logprobs: perturbed.get(x.id)!.logprobs,
        advantages: x.advantages,
      })),
    stage,
  );
  assert.deepEqual(metrics, ref.metrics);
  assert.deepEqual(Object.keys(metrics).sort(), [
    'actor/entropy_token_fraction',
    'actor/perception_token_fraction',
    'actor/scaling_factor_mean',
    'actor/sensitivity_score_mean',
  ]);
  for (const [gi, u] of updates.entries()) {
    assert.deepEqual(recordProblems('updates', u), [], `group ${u.id} is a valid updates.v2 record`);
    for (const [si, x] of u.samples.entries()) {
      assert.deepEqual(x.advantages, res.updates[gi].samples[si].advantages, 'advantages stay unscaled');
      if (u.filtered) {
        assert.equal(x.vppo, null);
        continue;
      }
      const r = ref.samples.get(x.id)!;
      assert.deepEqual(Array.from(x.vppo!.token_mask), Array.from(r.token_mask));
      assert.equal(x.vppo!.scaling_factor, r.scaling_factor);
      assert.equal(x.vppo!.perturbed_logprobs, perturbed.get(x.id)!.logprobs);
      // what the trajectory row stores (the advantage stage's rows)
      const row = sampleRow('r', u, x, undefined, {
        step: 1,
        advantages: x.advantages,
        vppoPerturbedLogprobs: x.vppo!.perturbed_logprobs,
        vppoTokenMask: x.vppo!.token_mask,
        vppoScalingFactor: x.vppo!.scaling_factor,
      });
      assert.equal(row.vppoScalingFactor, r.scaling_factor);
      assert.deepEqual(Array.from(row.vppoTokenMask as Uint8Array), Array.from(r.token_mask));
      // what the update trains with
      const t = applyVppoToSample({
        advantages: x.advantages,
        loss_weights: x.loss_weights,
        vppo_token_mask: x.vppo!.token_mask,
        vppo_scaling: x.vppo!.scaling_factor,
      });
      assert.deepEqual(Array.from(t.loss_weights), Array.from(r.token_mask));
      assert.deepEqual(
        Array.from(t.advantages),
        Array.from(x.advantages, (a) => Math.fround(a * r.scaling_factor)),
      );
    }
  }
  const bad = recordProblems('updates', {
    ...updates[0],
    samples: [{ ...updates[0].samples[0], vppo: { ...updates[0].samples[0].vppo!, token_mask: Buffer.from([2, 0]) } }],
  });
  assert.ok(
    bad.some((m) => /vppo\.token_mask: bytes must be 0 or 1/.test(m)),
    bad.join('; '),
  );
  assert.throws(
    () => attachVppo(res.updates, new Map(), stage),
    /no perturbed-image log-probs for sample r\/train\/s1\/p0\/n0 \(and 5 more\)/,
  );
});

test('vppoScores: real and perturbed images scored with the same weights; the perturbation is seeded by the sample id', async () => {
  const imgs = generateVisionGame(2, 4);
  const pngs = await Promise.all(imgs.map((s) => encodeRgbPng(s.image)));
  const samples = ['r/train/s1/p0/n0', 'r/train/s1/p0/n1', 'r/train/s1/p1/n0'].map((id, i) => ({
    id,
    seedKey: perturbationKey('r', id),
    prompt: Int32Array.of(1 + (i >> 1)),
    response: Int32Array.from({ length: 1 + i }, (_, t) => 5 + t),
    images: [pngs[i >> 1]!],
  }));
  assert.equal(samples[2]!.seedKey, 'train/s1/p1/n0');
  const calls: Array<{ weights: string; reqs: readonly ImageScoreRequest[]; entropy: boolean; temperature: number }> =
    [];
  // a fake scorer whose log-prob of a token is minus the fraction of black pixels: it "looks" at the image
  const scorer = {
    async score(weights: string, reqs: readonly ImageScoreRequest[], o: { temperature: number; entropy: boolean }) {
      calls.push({ weights, reqs, entropy: o.entropy, temperature: o.temperature });
      return reqs.map((r) => {
        const d = r.images[0]!.data;
        let black = 0;
        for (let k = 0; k < d.length; k++) if (d[k] === 0) black++;
        return {
          logprobs: new Float32Array(r.response.length).fill(-black / d.length),
          entropy: o.entropy ? new Float32Array(r.response.length).fill(0.5) : null,
        };
      });
    },
  };
  const s: VppoSettings = { stage, perturbation: 'patch_blackening', perturb: DEFAULT_PERTURB_OPTIONS };
  const pixels = new PixelCache();
  const out = await vppoScores(scorer, 'w7', samples, pixels, s, 0.7);
  assert.equal(calls.length, 2);
  assert.ok(calls.every((c) => c.weights === 'w7' && c.temperature === 0.7));
  assert.deepEqual(
    calls.map((c) => c.entropy),
    [false, false],
  );
  assert.equal(pixels.decodes, 2, 'each distinct image decoded once');
  calls[0]!.reqs.forEach((r, i) =>
    assert.deepEqual(r.images[0]!.data, imgs[i === 2 ? 1 : 0]!.image.data, 'the first pass sees the real image'),
  );
  calls[1]!.reqs.forEach((r, i) =>
    assert.deepEqual(
      r.images[0],
      perturbImage('patch_blackening', { ...imgs[i === 2 ? 1 : 0]!.image }, samples[i]!.seedKey, 0),
      "the second pass sees the sample's own perturbation",
    ),
  );
  assert.notDeepEqual(
    calls[1]!.reqs[0]!.images[0]!.data,
    calls[1]!.reqs[1]!.images[0]!.data,
    'two samples of one prompt get different perturbations',
  );
  const blackFraction = (d: Uint8Array) => {
    let n = 0;
    for (let k = 0; k < d.length; k++) if (d[k] === 0) n++;
    return n / d.length;
  };
  samples.forEach((x, i) => {
    const before = blackFraction(imgs[i === 2 ? 1 : 0]!.image.data);
    assert.ok(before < 0.1, `the game image is mostly not black (${before})`);
    assert.ok(
      out.old.get(x.id)!.every((v) => Math.abs(v + before) < 1e-6),
      'the real pass scores the real image',
    );
    assert.ok(
      out.perturbed.get(x.id)!.logprobs.every((v) => v < -before - 0.2 && v > -0.8),
      'about half the image blackened',
    );
    assert.equal(out.perturbed.get(x.id)!.entropies, null);
  });
  // a replay (its sample ids name another run) gives the same numbers; entropy filtering asks the real pass for entropies
  const replayed = samples.map((x) => {
    const id = `r.replay-1/${x.seedKey}`;
    return { ...x, id, seedKey: perturbationKey('r.replay-1', id) };
  });
  const again = await vppoScores(
    scorer,
    'w7',
    replayed,
    pixels,
    { ...s, stage: { ...stage, enable_entropy_filtering: true } },
    0.7,
  );
  assert.deepEqual(
    calls.slice(2).map((c) => c.entropy),
    [true, false],
  );
  samples.forEach((x, i) => {
    assert.deepEqual(
      calls[3]!.reqs[i]!.images,
      calls[1]!.reqs[i]!.images,
      'the replay perturbs each sample as the source did',
    );
    assert.deepEqual(again.perturbed.get(replayed[i]!.id)!.logprobs, out.perturbed.get(x.id)!.logprobs);
    assert.deepEqual(
      Array.from(again.perturbed.get(replayed[i]!.id)!.entropies!),
      new Array(x.response.length).fill(0.5),
    );
  });
  await assert.rejects(
    vppoScores(scorer, 'w7', [{ ...samples[0]!, images: [] }], pixels, s, 1),
    (e: unknown) =>
      e instanceof ConfigError && !e.retriable && /sample r\/train\/s1\/p0\/n0 has no prompt image/.test(e.message),
  );
});
