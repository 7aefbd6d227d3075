/**
 * Bicubic resizing against Pillow (Debian's python3-pil, the library transformers' Qwen2-VL image
 * processor resizes with): every byte equal, shrinking (antialiased) and enlarging, one axis or
 * both; and prepareImage's pixels for an image smart_resize resizes.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { resizeBicubicPil } from '../../../lib/data/pil-resize.ts';
import { decodePixels, prepareImage } from '../../../lib/data/images.ts';
import { Rng } from '../../../lib/util/rng.ts';

const PY = '/usr/bin/python3';

function pillowResize(dir: string, src: Uint8Array, w: number, h: number, ow: number, oh: number): Buffer {
  writeFileSync(join(dir, 'in.bin'), src);
  execFileSync(PY, [
    '-c',
    'import sys; from PIL import Image; d, w, h, ow, oh = sys.argv[1], *map(int, sys.argv[2:]);' +
      " im = Image.frombytes('RGB', (w, h), open(d + '/in.bin', 'rb').read());" +
      " open(d + '/out.bin', 'wb').write(im.resize((ow, oh), Image.BICUBIC).tobytes())",
    dir,
    String(w),
    String(h),
    String(ow),
    String(oh),
  ]);
  return readFileSync(join(dir, 'out.bin'));
}

function noise(n: number, seed: number): Uint8Array {
  const rng = Rng.fromSeed(seed);
  const a = new Uint8Array(n);
  for (let i = 0; i < n; i++) a[i] = Math.floor(rng.next() * 256);
  return a;
}

function differing(a: Uint8Array, b: Uint8Array): number {
  assert.equal(a.length, b.length);
  let n = 0;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) n++;
  return n;
}

test('resizeBicubicPil equals Pillow BICUBIC byte for byte', () => {
  const dir = mkdtempSync(join(tmpdir(), 'pil-resize-'));
  try {
    const cases: [number, number, number, number][] = [
      [70, 50, 72, 48], // both axes, one up one down
      [300, 200, 112, 84], // shrink ×2.7 (antialiased support)
      [17, 13, 120, 96], // enlarge ×7
      [1000, 10, 200, 8], // extreme aspect
      [37, 91, 37, 40], // vertical pass only
      [5, 5, 3, 3],
    ];
    for (const [i, [w, h, ow, oh]] of cases.entries()) {
      const src = noise(w * h * 3, i + 1);
      const got = resizeBicubicPil(src, w, h, 3, ow, oh);
      assert.equal(differing(got, pillowResize(dir, src, w, h, ow, oh)), 0, `${w}×${h} → ${ow}×${oh}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('prepareImage resizes bicubic as Pillow does (the pixels the Qwen2-VL processor sees)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'pil-resize-'));
  try {
    const [w, h] = [131, 77];
    const src = noise(w * h * 3, 7);
    const png = await sharp(src, { raw: { width: w, height: h, channels: 3 } })
      .png()
      .toBuffer();
    const img = await prepareImage(png, { factor: 28, minPixels: 3136, maxPixels: 1003520, resample: 'bicubic' });
    assert.deepEqual([img.width, img.height], [140, 84]); // smart_resize: round(131/28)·28, round(77/28)·28
    const px = await decodePixels(img.png);
    assert.equal(differing(px.data, pillowResize(dir, src, w, h, 140, 84)), 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
