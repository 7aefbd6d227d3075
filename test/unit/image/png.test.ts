/** Generated images as PNG: a round trip keeps 8-bit pixels, equal pixels give equal bytes, grids have the laid-out size. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import sharp from 'sharp';
import { batchToPngs, gridPng, imageToPng, pngToImage } from '../../../lib/image/png.ts';

test('PNG round trip, determinism and grids', async () => {
  const S = 8;
  const x = Float32Array.from({ length: S * S }, (_, i) => Math.sin(i) * 1.2); // values past ±1 are clipped
  const png = await imageToPng(x, 1, S);
  assert.deepEqual([...png.subarray(1, 4)], [0x50, 0x4e, 0x47]); // 'PNG'
  const back = await pngToImage(png, 1);
  assert.equal(back.size, S);
  for (let i = 0; i < x.length; i++) assert.ok(Math.abs(back.x[i] - Math.max(-1, Math.min(1, x[i]))) <= 1 / 255 + 1e-6);
  const h = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');
  assert.equal(h(await imageToPng(Float32Array.from(x), 1, S)), h(png));
  const two = new Float32Array(2 * S * S);
  two.set(x);
  const pngs = await batchToPngs(two, 1, S);
  assert.equal(pngs.length, 2);
  assert.equal(h(pngs[0]), h(png));
  const meta = await sharp(await gridPng(two, 1, S, 2)).metadata();
  assert.deepEqual([meta.width, meta.height], [2 * (S + 1) + 1, S + 2]);
  await assert.rejects(imageToPng(x, 3, S), /64 values for a 3×8×8 image/);
});
