/**
 * An image policy's samples as trajectory records (lib/image/trajectory.ts): the records hold
 * exactly what the sampler drew (states, σ, per-step log-probs), the update's step batches are
 * rebuilt from them bit for bit, and with one random stream per image an image's record does not
 * depend on the batch it was sampled in.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Rng } from '../../../lib/util/rng.ts';
import { sampleImages, type VelocityFn } from '../../../lib/image/sde.ts';
import { cleanImage, generationRecords, stepBatches } from '../../../lib/image/trajectory.ts';
import { pngToImage } from '../../../lib/image/png.ts';
import { imageHash } from '../../../lib/data/image-hash.ts';

const C = 1,
  S = 4,
  PIX = C * S * S;
/** A velocity field computed per image (so batching cannot change a value). */
const velocity: VelocityFn = async (x, t, cls) =>
  Float32Array.from(x, (v, i) => 0.5 * v - 0.2 * cls[Math.floor(i / PIX)] + 0.1 * t[Math.floor(i / PIX)]);

test("generationRecords: tokens index the stochastic steps, log-probs and states are the sampler's; stepBatches and cleanImage read them back exactly", async () => {
  const cls = [0, 1, 2];
  const r = await sampleImages(velocity, { cls, pixels: PIX, steps: 4, rng: Rng.fromSeed(3), noiseLevel: 0.7 });
  const recs = await generationRecords(r, C, S);
  assert.equal(recs.length, 3);
  for (const [b, g] of recs.entries()) {
    assert.deepEqual([...g.tokens], [0, 1, 2], 'the last step (into t = 0) is deterministic');
    assert.deepEqual(
      [...g.logprobs],
      r.steps.map((s) => Math.fround(s.logProbs[b])),
    );
    assert.deepEqual([...g.generated.sigmas.subarray(3)], [0]);
    assert.deepEqual([...cleanImage(g.generated, PIX)], [...r.x0.subarray(b * PIX, (b + 1) * PIX)]);
    assert.equal(g.generated.hash, imageHash(g.generated.png));
    const { x } = await pngToImage(g.generated.png, 1);
    x.forEach((v, i) => assert.ok(Math.abs(v - Math.max(-1, Math.min(1, r.x0[b * PIX + i]))) <= 1 / 127.5 + 1e-6));
  }
  const steps = stepBatches(
    recs.map((g) => ({ ...g, generated: g.generated })),
    PIX,
  );
  assert.equal(steps.length, r.steps.length);
  steps.forEach((st, j) => {
    assert.equal(st.t, Math.fround(r.steps[j].t));
    assert.equal(st.sigma, Math.fround(r.steps[j].sigma));
    assert.deepEqual([...st.xT], [...r.steps[j].xT]);
    assert.deepEqual([...st.xNext], [...r.steps[j].xNext]);
    assert.deepEqual(st.oldLogProbs, r.steps[j].logProbs.map(Math.fround));
  });
  const other = await generationRecords(
    await sampleImages(velocity, { cls: [0], pixels: PIX, steps: 5, rng: Rng.fromSeed(3), noiseLevel: 0.7 }),
    C,
    S,
  );
  assert.throws(() => stepBatches([recs[0], other[0]], PIX), /another time grid or noise schedule/);
});

test('one random stream per image: an image is the same alone and in a batch', async () => {
  const rngs = (ids: string[]) => ids.map((id) => Rng.fromSeed(`7/${id}`));
  const o = { pixels: PIX, steps: 3, noiseLevel: 0.7 };
  const batch = await sampleImages(velocity, { ...o, cls: [2, 1, 0], rng: rngs(['a', 'b', 'c']) });
  const alone = await sampleImages(velocity, { ...o, cls: [1], rng: rngs(['b']) });
  const [, b] = await generationRecords(batch, C, S);
  const [a] = await generationRecords(alone, C, S);
  assert.deepEqual([...b.generated.latents], [...a.generated.latents]);
  assert.deepEqual([...b.logprobs], [...a.logprobs]);
  assert.equal(b.generated.hash, a.generated.hash);
  await assert.rejects(
    sampleImages(velocity, { ...o, cls: [1, 2], rng: rngs(['b']) }),
    /1 random streams for 2 images/,
  );
});
