/**
 * Prompt images (lib/data/images.ts): decoding and resizing one 1024×768 photo-like JPEG to the
 * patch grid with EasyR1's defaults (min_pixels 262144, max_pixels 4194304 → 1036×756) and
 * encoding the PNG the pipeline carries, per kernel; and a decode through the pixel cache (hit vs
 * miss). Median of several runs, one image at a time. No goal: the issue's 7–12 ms was decode +
 * resize alone on an idle machine; this row also pays for the PNG encoding (about as much again).
 *
 * `run()` returns the rows for bench/run.ts; `node --import tsx bench/images.ts` prints the table.
 */
import { pathToFileURL } from 'node:url';
import sharp from 'sharp';
import { IMAGE_RESAMPLES, prepareImage } from '../lib/data/images.ts';
import { PixelCache } from '../lib/data/pixel-cache.ts';

export interface Row {
  name: string;
  value: number;
  unit: string;
  goal?: number | string;
  better?: 'higher' | 'lower';
}

async function photo(w: number, h: number): Promise<Buffer> {
  const px = Buffer.alloc(w * h * 3);
  for (let y = 0; y < h; y++)
    for (let x = 0; x < w; x++)
      for (let c = 0; c < 3; c++) {
        px[(y * w + x) * 3 + c] =
          (Math.sin(x / (9 + c * 4)) * 60 + Math.cos(y / 13) * 60 + 128 + ((x * 131 + y * 71 + c * 29) % 23)) & 255;
      }
  return sharp(px, { raw: { width: w, height: h, channels: 3 } })
    .jpeg({ quality: 88 })
    .toBuffer();
}

async function medianMs(reps: number, f: () => Promise<unknown>): Promise<number> {
  await f(); // warm-up
  const ts: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    await f();
    ts.push(performance.now() - t0);
  }
  ts.sort((a, b) => a - b);
  return ts[Math.floor(ts.length / 2)]!;
}

export async function run(): Promise<Row[]> {
  const jpg = await photo(1024, 768);
  const rows: Row[] = [];
  for (const resample of IMAGE_RESAMPLES) {
    const ms = await medianMs(15, () =>
      prepareImage(jpg, { factor: 28, minPixels: 262144, maxPixels: 4194304, resample }),
    );
    rows.push({
      name: `images: decode + resize + PNG, 1024×768 JPEG → 1036×756, ${resample}`,
      value: Number(ms.toFixed(2)),
      unit: 'ms',
    });
  }
  const img = await prepareImage(jpg, { factor: 28, minPixels: 262144, maxPixels: 4194304, resample: 'bicubic' });
  rows.push({ name: 'images: PNG bytes per image (1036×756 RGB)', value: img.png.length, unit: 'bytes' });
  const miss = await medianMs(9, () => new PixelCache().get(img.hash, img.png));
  const cache = new PixelCache();
  await cache.get(img.hash, img.png);
  const hit = await medianMs(50, () => cache.get(img.hash, img.png));
  rows.push({
    name: 'images: pixels by hash, cache miss (sha256 check + PNG decode)',
    value: Number(miss.toFixed(2)),
    unit: 'ms',
  });
  rows.push({ name: 'images: pixels by hash, cache hit', value: Number(hit.toFixed(4)), unit: 'ms' });
  return rows;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  for (const r of await run()) console.log(`${r.name.padEnd(80)} ${String(r.value).padStart(12)} ${r.unit}`);
}
