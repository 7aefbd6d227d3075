import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import {
  ImageError,
  RESAMPLE_KERNELS,
  IMAGE_RESAMPLES,
  decodePixels,
  encodeRgbPng,
  imageBytes,
  prepareImage,
  prepareRgbImage,
  smartResize,
  type ImageOptions,
} from '../../../lib/data/images.ts';
import { LruCache, PixelCache } from '../../../lib/data/pixel-cache.ts';

const dir = mkdtempSync(join(tmpdir(), 'rl-images-'));

/** A w×h test image with a gradient and a few noisy pixels (so resampling kernels differ). */
async function image(
  w: number,
  h: number,
  fmt: 'png' | 'jpeg',
  opts: { channels?: 1 | 2 | 3 | 4; orientation?: number } = {},
): Promise<Buffer> {
  const channels = opts.channels ?? 3;
  const px = Buffer.alloc(w * h * channels);
  for (let y = 0; y < h; y++)
    for (let x = 0; x < w; x++)
      for (let c = 0; c < channels; c++) {
        px[(y * w + x) * channels + c] =
          c === channels - 1 && (channels === 2 || channels === 4)
            ? 200
            : ((x * 7 + y * 13 + c * 50) ^ ((x * y) % 17 === 0 ? 255 : 0)) & 255;
      }
  let s = sharp(px, { raw: { width: w, height: h, channels } });
  if (channels <= 2) s = s.toColourspace('b-w');
  if (opts.orientation) s = s.withMetadata({ orientation: opts.orientation });
  return fmt === 'png' ? s.png().toBuffer() : s.jpeg({ quality: 90 }).toBuffer();
}

const sha256 = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

test('smartResize: Qwen2-VL rule, hand-computed cases (factor 28)', () => {
  // in range: each side rounded to the nearest multiple of 28 (100/28 = 3.57 → 4, 200/28 = 7.14 → 7)
  assert.deepEqual(smartResize(100, 200, { factor: 28, minPixels: 3136, maxPixels: 1003520 }), [112, 196]);
  assert.deepEqual(smartResize(200, 300, { factor: 28, minPixels: 3136, maxPixels: 1003520 }), [196, 308]);
  // halves round to even as Python's round(): 42/28 = 1.5 → 2, 70/28 = 2.5 → 2, 98/28 = 3.5 → 4
  assert.deepEqual(smartResize(42, 98, { factor: 28, minPixels: 1, maxPixels: 1e9 }), [56, 112]);
  assert.deepEqual(smartResize(70, 70, { factor: 28, minPixels: 1, maxPixels: 1e9 }), [56, 56]);
  // over max: beta = sqrt(1024·768 / 262144) = sqrt(3); 1024/beta/28 = 21.1 → 21·28 = 588; 768/beta/28 = 15.8 → 15·28 = 420
  assert.deepEqual(smartResize(1024, 768, { factor: 28, minPixels: 3136, maxPixels: 262144 }), [588, 420]);
  // under min: beta = sqrt(262144 / 5000) = 7.2408; 100·beta/28 = 25.9 → 26·28 = 728; 50·beta/28 = 12.9 → 13·28 = 364
  assert.deepEqual(smartResize(100, 50, { factor: 28, minPixels: 262144, maxPixels: 4194304 }), [728, 364]);
  // EasyR1's defaults on a 1024×768 (w×h) photo: 768/28 = 27.4 → 27, 1024/28 = 36.6 → 37, within [512², 2048²]
  assert.deepEqual(smartResize(768, 1024, { factor: 28, minPixels: 262144, maxPixels: 4194304 }), [756, 1036]);
  // the floor never goes below one factor: 28/sqrt(20)/28 = 0.22 → max(28, 0)
  assert.deepEqual(smartResize(28, 5600, { factor: 28, minPixels: 1, maxPixels: 7840 }), [28, 1232]);
  // aspect ratio: 200 is allowed, over 200 is refused
  assert.throws(
    () => smartResize(1, 201, { factor: 28, minPixels: 1, maxPixels: 1e9 }),
    /aspect ratio 201\.0 is over 200/,
  );
  assert.throws(() => smartResize(0, 10, { factor: 28, minPixels: 1, maxPixels: 1e9 }), RangeError);
});

test('smartResize: results are on the grid and within the pixel bounds for ordinary sizes', () => {
  const o = { factor: 28, minPixels: 56 * 56, maxPixels: 28 * 28 * 1280 };
  for (const [h, w] of [
    [28, 28],
    [333, 517],
    [2000, 3000],
    [4096, 64],
    [31, 29],
    [1080, 1920],
  ] as const) {
    const [rh, rw] = smartResize(h, w, o);
    assert.equal(rh % 28, 0);
    assert.equal(rw % 28, 0);
    assert.ok(rh * rw <= o.maxPixels && rh * rw >= o.minPixels, `${h}×${w} → ${rh}×${rw}`);
    // the aspect ratio is kept to within a grid cell
    assert.ok(Math.abs(rh / rw - h / w) <= (h / w) * (28 / Math.min(rh, rw)) + 1e-9, `${h}×${w} → ${rh}×${rw}`);
  }
});

test('resampling names: bicubic is Pillow-exact, the others map onto sharp kernels', () => {
  assert.deepEqual(IMAGE_RESAMPLES, ['bicubic', 'nearest', 'bilinear', 'mitchell', 'lanczos2', 'lanczos3']);
  assert.deepEqual(RESAMPLE_KERNELS, {
    nearest: 'nearest',
    bilinear: 'linear',
    mitchell: 'mitchell',
    lanczos2: 'lanczos2',
    lanczos3: 'lanczos3',
  });
  for (const k of Object.values(RESAMPLE_KERNELS)) assert.ok(k in sharp.kernel, `${k} is a sharp kernel`);
});

const small: ImageOptions = { factor: 28, minPixels: 3136, maxPixels: 1003520, resample: 'bicubic' };

test('a PNG is decoded, resized to the grid and re-encoded as RGB PNG; its hash is the sha256 of that PNG', async () => {
  const src = await image(300, 200, 'png');
  const img = await prepareImage(src, small);
  assert.deepEqual([img.height, img.width], [196, 308]);
  assert.equal(img.hash, sha256(img.png));
  const meta = await sharp(img.png).metadata();
  assert.deepEqual([meta.format, meta.width, meta.height, meta.channels], ['png', 308, 196, 3]);
  // deterministic: the same source gives the same bytes (so the same hash)
  assert.equal((await prepareImage(src, small)).hash, img.hash);
  const px = await decodePixels(img.png);
  assert.deepEqual([px.width, px.height, px.data.length], [308, 196, 308 * 196 * 3]);
});

test('a generated RGB image: the same PNG bytes and hash as prepareImage of its PNG, whether it keeps its size or is resized', async () => {
  for (const [w, h] of [
    [84, 28],
    [308, 196],
    [300, 200],
  ]) {
    const data = new Uint8Array(w * h * 3);
    for (let i = 0; i < data.length; i++) data[i] = (i * 37 + (i % 7) * 91) & 255;
    const img = { width: w, height: h, data };
    const fast = await prepareRgbImage(img, { ...small, minPixels: 784 });
    const ref = await prepareImage(await encodeRgbPng(img), { ...small, minPixels: 784 });
    assert.deepEqual([fast.width, fast.height, fast.hash], [ref.width, ref.height, ref.hash], `${w}×${h}`);
    assert.ok(Buffer.from(fast.png).equals(Buffer.from(ref.png)), `${w}×${h}: the same PNG bytes`);
  }
  await assert.rejects(
    prepareRgbImage({ width: 20, height: 20, data: new Uint8Array(1200) }, small),
    /smaller than the 28-pixel/,
  );
});

test('JPEG, grayscale, grayscale+alpha, 16-bit and EXIF-rotated inputs all come out as upright 8-bit RGB', async () => {
  const jpg = await prepareImage(await image(100, 60, 'jpeg'), { ...small, minPixels: 262144, maxPixels: 4194304 });
  // 60/28 and 100/28 round to 56×112 = 6272 < 262144: beta = sqrt(262144/6000) = 6.61;
  // 60·beta/28 = 14.2 → 15·28 = 420, 100·beta/28 = 23.6 → 24·28 = 672
  assert.deepEqual([jpg.height, jpg.width], [420, 672]);
  for (const channels of [2, 4] as const) {
    const src = await image(64, 64, 'png', { channels });
    assert.equal((await sharp(src).metadata()).channels, channels);
    assert.equal(
      (await sharp((await prepareImage(src, small)).png).metadata()).channels,
      3,
      `${channels} channels in, RGB out`,
    );
  }
  const gray = await prepareImage(await image(64, 64, 'png', { channels: 1 }), small);
  assert.equal((await sharp(gray.png).metadata()).channels, 3);
  // 16 bits per channel come out as 8-bit sRGB, the same colour
  const deep = await sharp({ create: { width: 60, height: 40, channels: 3, background: '#8040c0' } })
    .toColourspace('rgb16')
    .png()
    .toBuffer();
  assert.equal((await sharp(deep).metadata()).depth, 'ushort');
  const d = await prepareImage(deep, small);
  assert.deepEqual([...(await decodePixels(d.png)).data.subarray(0, 3)], [0x80, 0x40, 0xc0]);
  // orientation 6 (rotate 90°): a 120 wide × 60 high file shows 60 wide × 120 high
  const rot = await prepareImage(await image(120, 60, 'jpeg', { orientation: 6 }), small);
  assert.deepEqual([rot.width, rot.height], [56, 112]);
});

test('the resampling kernel is applied: nearest and lanczos3 give different pixels, each deterministic', async () => {
  const src = await image(333, 251, 'png');
  const a = await prepareImage(src, { ...small, maxPixels: 100 * 28 * 28, resample: 'nearest' });
  const b = await prepareImage(src, { ...small, maxPixels: 100 * 28 * 28, resample: 'lanczos3' });
  assert.deepEqual([a.width, a.height], [b.width, b.height]);
  assert.notEqual(a.hash, b.hash);
  assert.equal((await prepareImage(src, { ...small, maxPixels: 100 * 28 * 28, resample: 'nearest' })).hash, a.hash);
});

test('too small, undecodable and empty images are ImageErrors that say what is wrong', async () => {
  await assert.rejects(
    prepareImage(await image(20, 100, 'png'), small),
    (e: unknown) =>
      e instanceof ImageError &&
      /is 20×100, smaller than the 28-pixel patch grid \(data\.image_factor\)/.test(e.message),
  );
  await assert.rejects(
    prepareImage(Buffer.from('not an image at all'), small),
    (e: unknown) => e instanceof ImageError && /cannot be decoded/.test(e.message),
  );
  await assert.rejects(
    prepareImage(Buffer.alloc(0), small),
    (e: unknown) => e instanceof ImageError && /is empty/.test(e.message),
  );
  await assert.rejects(
    prepareImage(await image(28, 6000, 'png'), small),
    (e: unknown) => e instanceof ImageError && /aspect ratio .* over 200/.test(e.message),
  );
});

test('image field values: file paths (relative to the image dir), base64, data URLs, bytes, {bytes}/{path}', async () => {
  const png = await image(40, 40, 'png');
  writeFileSync(join(dir, 'a.png'), png);
  assert.deepEqual(imageBytes('a.png', dir), png);
  assert.deepEqual(imageBytes(join(dir, 'a.png'), '/elsewhere'), png);
  assert.deepEqual(imageBytes(png.toString('base64'), dir), png);
  assert.deepEqual(imageBytes(`data:image/png;base64,${png.toString('base64')}`, dir), png);
  assert.deepEqual(imageBytes(new Uint8Array(png), dir), png);
  assert.deepEqual(imageBytes({ bytes: new Uint8Array(png), path: null }, dir), png);
  assert.deepEqual(imageBytes({ bytes: null, path: 'a.png' }, dir), png);
  assert.throws(
    () => imageBytes('missing.png', dir),
    (e: unknown) =>
      e instanceof ImageError &&
      /file not found: .*missing\.png \(paths are relative to data\.image_dir\)/.test(e.message),
  );
  assert.throws(() => imageBytes('data:image/png,rawtext', dir), /not base64/);
  assert.throws(() => imageBytes('hello world!', dir), /neither a file path/);
  assert.throws(() => imageBytes(42, dir), /got number/);
  assert.throws(() => imageBytes({ url: 'x' }, dir), /without "bytes" or "path"/);
});

test('LruCache evicts the least recently used entries by size', () => {
  const c = new LruCache<string>(10);
  c.set('a', 'A', 4);
  c.set('b', 'B', 4);
  assert.equal(c.get('a'), 'A'); // a is now the most recent
  c.set('c', 'C', 4); // evicts b
  assert.equal(c.get('b'), undefined);
  assert.deepEqual([c.get('a'), c.get('c'), c.size, c.count], ['A', 'C', 8, 2]);
  c.set('big', 'X', 11); // larger than the limit: not kept, nothing evicted
  assert.deepEqual([c.get('big'), c.count], [undefined, 2]);
  c.set('a', 'A2', 2);
  assert.deepEqual([c.get('a'), c.size], ['A2', 6]);
  assert.throws(() => new LruCache(0), /must be positive/);
});

test('PixelCache decodes each image once by hash, and refuses bytes that do not match the hash', async () => {
  const a = await prepareImage(await image(56, 56, 'png'), small);
  const b = await prepareImage(await image(84, 56, 'png'), small);
  const cache = new PixelCache(a.width * a.height * 3 + b.width * b.height * 3);
  const [p1, p2] = await Promise.all([cache.get(a.hash, a.png), cache.get(a.hash, a.png)]);
  assert.equal(p1, p2);
  assert.equal(cache.decodes, 1);
  await cache.get(b.hash, b.png);
  await cache.get(a.hash, a.png);
  assert.equal(cache.decodes, 2, 'both fit: no decode again');
  const c = await prepareImage(await image(112, 56, 'png'), small);
  await cache.get(c.hash, c.png); // evicts b (least recent)
  await cache.get(b.hash, b.png);
  assert.equal(cache.decodes, 4);
  await assert.rejects(
    cache.get(
      a.hash.replace(/^./, (x) => (x === '0' ? '1' : '0')),
      a.png,
    ),
    /do not match their hash/,
  );
});
