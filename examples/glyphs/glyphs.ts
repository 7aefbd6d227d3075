/**
 * Synthetic glyph renders for the glyphs example: a character (digits and capital letters) drawn
 * white on black at S×S by librsvg through sharp, in one of the DejaVu faces, with a random size and
 * offset. The recogniser trains on `TRAIN_FONTS` and is checked on `HELDOUT_FONTS`, so a policy
 * cannot reach a high reward by fitting one face's quirks.
 */
import sharp from 'sharp';
import { Rng } from '../../lib/util/rng.ts';

export const CHARS = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ';

export interface Face {
  family: string;
  weight?: 'bold' | 'normal';
  style?: 'italic' | 'normal';
}
export const TRAIN_FONTS: Face[] = [
  { family: 'DejaVu Sans' },
  { family: 'DejaVu Sans', weight: 'bold' },
  { family: 'DejaVu Serif' },
  { family: 'DejaVu Serif', weight: 'bold' },
  { family: 'DejaVu Sans Mono' },
];
export const HELDOUT_FONTS: Face[] = [
  { family: 'DejaVu Sans Mono', weight: 'bold' },
  { family: 'DejaVu Serif', style: 'italic' },
  { family: 'DejaVu Sans', style: 'italic' },
];

/** One glyph as floats in [−1, 1] (black −1, white 1), [S·S]. */
export async function renderGlyph(
  ch: string,
  face: Face,
  size: number,
  jitter: { dx: number; dy: number; scale: number },
): Promise<Float32Array> {
  const fs = Math.round(size * 0.8 * jitter.scale);
  const svg =
    `<svg xmlns="http://www.w3.org/2000/svg" width="${size}" height="${size}"><rect width="${size}" height="${size}" fill="black"/>` +
    `<text x="${size / 2 + jitter.dx}" y="${size / 2 + fs * 0.36 + jitter.dy}" font-family="${face.family}" font-weight="${face.weight ?? 'normal'}" font-style="${face.style ?? 'normal'}" font-size="${fs}" fill="white" text-anchor="middle">${ch}</text></svg>`;
  const { data, info } = await sharp(Buffer.from(svg)).greyscale().raw().toBuffer({ resolveWithObject: true });
  const out = new Float32Array(size * size);
  for (let i = 0; i < out.length; i++) out[i] = (data[i * info.channels] / 255) * 2 - 1;
  return out;
}

export interface GlyphSet {
  images: Float32Array; // [n, 1, S, S]
  labels: number[];
}

/** `perChar` renders of each of the first `chars` characters over `faces`, jittered from `seed`. */
export async function renderSet(opts: {
  faces: Face[];
  perChar: number;
  size: number;
  seed: number | string;
  chars?: number;
}): Promise<GlyphSet> {
  const rng = Rng.fromSeed(opts.seed);
  const K = opts.chars ?? CHARS.length;
  const jobs: { c: number; face: Face; j: { dx: number; dy: number; scale: number } }[] = [];
  for (let c = 0; c < K; c++)
    for (let k = 0; k < opts.perChar; k++)
      jobs.push({
        c,
        face: opts.faces[k % opts.faces.length],
        j: {
          dx: (rng.next() - 0.5) * 0.12 * opts.size,
          dy: (rng.next() - 0.5) * 0.12 * opts.size,
          scale: 0.85 + 0.25 * rng.next(),
        },
      });
  const px = opts.size * opts.size;
  const images = new Float32Array(jobs.length * px);
  const rendered = await Promise.all(jobs.map((j) => renderGlyph(CHARS[j.c], j.face, opts.size, j.j)));
  rendered.forEach((r, i) => images.set(r, i * px));
  return { images, labels: jobs.map((j) => j.c) };
}

/**
 * The images as their PNG holds them (lib/image/png.ts: clamped to [−1, 1], 8-bit): what the
 * recogniser scores, here as under `rlstream train` (reward.ts reads the PNG). Scoring the raw
 * sampler output instead would reward pixel values no image can hold.
 */
export function asSaved(x: Float32Array): Float32Array {
  return Float32Array.from(x, (v) => (Math.round((Math.max(-1, Math.min(1, v)) + 1) * 127.5) / 255) * 2 - 1);
}
