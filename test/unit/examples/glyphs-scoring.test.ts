/**
 * The glyphs driver scores a generated image as its PNG holds it (clamped to [−1, 1], 8-bit), the
 * image reward.ts reads under `rlstream train`: asSaved equals the PNG round trip, values out of
 * range included.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { asSaved } from '../../../examples/glyphs/glyphs.ts';
import { imageToPng, pngToImage } from '../../../lib/image/png.ts';
import { Rng } from '../../../lib/util/rng.ts';

test('asSaved is the PNG round trip of the sampler output (clamped, 8-bit)', async () => {
  const rng = Rng.fromSeed('glyph-scoring');
  const x = Float32Array.from({ length: 64 }, () => (rng.next() * 2 - 1) * 3);
  const { x: back } = await pngToImage(await imageToPng(x, 1, 8), 1);
  assert.deepEqual(asSaved(x), back);
  assert.ok(
    x.some((v) => Math.abs(v) > 1),
    'the input has values a PNG cannot hold',
  );
  assert.ok(asSaved(x).every((v) => Math.abs(v) <= 1));
});
