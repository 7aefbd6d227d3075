/**
 * The number game with pictures (lib/tasks/index.ts's number game, drawn): an image shows three distinct digits
 * left to right, drawn with a 5×7 bitmap font at a random scale (2 or 3 px per font pixel), each in
 * its own 28×28 cell at a random offset (JITTER² positions around the cell's centre), dark ink of
 * random shade on a light background of random shade, with independent per-pixel, per-channel
 * noise. The cells are Qwen2-VL's merge windows (patch 14 × merge 2), so each of the picture's
 * three image tokens covers one digit: a tower trained from scratch by GRPO learns to read them
 * within minutes, which it did not when digits sat anywhere in 112×56 px, straddling windows
 * (docs/training.md "Vision number game and VPPO"). The text only asks which one is largest; the answer is
 * its index 0/1/2 counted from the left, so a policy that cannot see the image is at chance.
 * Everything is drawn from one Rng seeded by the task seed, so a seed always gives the same pixels. Pure: rendering yields raw RGB; the pipeline encodes the PNG (lib/data/images.ts).
 *
 * `readNumberGameDigits` reads the digits back (threshold, per-column ink box, glyph match): the
 * tests check the answer against what was drawn, and the remote reward example scores with it.
 */
import { Rng } from '../util/rng.ts';

/** 8-bit RGB, row-major (height × width × 3): the same layout as lib/data/images.ts ImagePixels. */
export interface RgbImage {
  width: number;
  height: number;
  data: Uint8Array;
}

/** Image size: three 28-px cells, on Qwen2-VL's 28-pixel grid, so smart_resize keeps it as is. */
export const VISION_GAME_CELL = 28;
export const VISION_GAME_WIDTH = 3 * VISION_GAME_CELL;
export const VISION_GAME_HEIGHT = VISION_GAME_CELL;
const GLYPH_W = 5,
  GLYPH_H = 7;
/** px per font pixel: a glyph is 10×14 or 15×21 px, so it fits its cell with room to move. */
const SCALES = [2, 3] as const;
/** Offsets per axis around the centred position (0 … JITTER − 1 px). */
const JITTER = 4;
/** Ink is at most 95 and background at least 175 (after noise): 135 separates them. */
const THRESHOLD = 135;

/** 5×7 digit glyphs, one string per row, '#' = ink. Every glyph has ink in its top and bottom rows. */
const FONT: readonly (readonly string[])[] = [
  ['.###.', '#...#', '#..##', '#.#.#', '##..#', '#...#', '.###.'],
  ['..#..', '.##..', '..#..', '..#..', '..#..', '..#..', '.###.'],
  ['.###.', '#...#', '....#', '...#.', '..#..', '.#...', '#####'],
  ['#####', '...#.', '..#..', '...#.', '....#', '#...#', '.###.'],
  ['...#.', '..##.', '.#.#.', '#..#.', '#####', '...#.', '...#.'],
  ['#####', '#....', '####.', '....#', '....#', '#...#', '.###.'],
  ['..##.', '.#...', '#....', '####.', '#...#', '#...#', '.###.'],
  ['#####', '....#', '...#.', '..#..', '.#...', '.#...', '.#...'],
  ['.###.', '#...#', '#...#', '.###.', '#...#', '#...#', '.###.'],
  ['.###.', '#...#', '#...#', '.####', '....#', '...#.', '.##..'],
];

/** Each glyph cropped to its ink columns: [first, last] column with ink. */
const INK_COLS = FONT.map((rows) => {
  let lo = GLYPH_W,
    hi = -1;
  for (const r of rows)
    for (let c = 0; c < GLYPH_W; c++)
      if (r[c] === '#') {
        lo = Math.min(lo, c);
        hi = Math.max(hi, c);
      }
  return [lo, hi] as const;
});

export interface VisionGameSample {
  /** The three digits, left to right. */
  numbers: [number, number, number];
  /** Index (0/1/2) of the largest. */
  answer: number;
  image: RgbImage;
  /** Where each digit was drawn (top-left pixel and scale), for tests and reports. */
  placements: Array<{ x: number; y: number; scale: number }>;
}

const clamp8 = (v: number) => (v < 0 ? 0 : v > 255 ? 255 : v);

/** Draws one sample from `rng`: three distinct digits, their placements and the noisy image. */
export function drawVisionGameSample(rng: Rng): VisionGameSample {
  const numbers: number[] = [];
  while (numbers.length < 3) {
    const v = rng.int(10);
    if (!numbers.includes(v)) numbers.push(v);
  }
  const W = VISION_GAME_WIDTH,
    H = VISION_GAME_HEIGHT,
    slot = VISION_GAME_CELL;
  const paper = 200 + rng.int(31); // 200–230, noise ±25 keeps it ≥ 175
  const data = new Uint8Array(W * H * 3);
  for (let k = 0; k < data.length; k++) data[k] = clamp8(paper + rng.int(51) - 25);
  const placements: VisionGameSample['placements'] = [];
  for (let i = 0; i < 3; i++) {
    const scale = SCALES[rng.int(SCALES.length)];
    const gw = GLYPH_W * scale,
      gh = GLYPH_H * scale;
    // one pixel of margin to the cell's edges; the JITTER offsets centred in the room left
    const x = i * slot + 1 + ((slot - gw - 1 - JITTER) >> 1) + rng.int(JITTER);
    const y = 1 + ((H - gh - 1 - JITTER) >> 1) + rng.int(JITTER);
    const ink = 20 + rng.int(51); // 20–70, noise ±25 keeps it ≤ 95
    const rows = FONT[numbers[i]];
    for (let gy = 0; gy < GLYPH_H; gy++) {
      for (let gx = 0; gx < GLYPH_W; gx++) {
        if (rows[gy][gx] !== '#') continue;
        for (let py = y + gy * scale; py < y + (gy + 1) * scale; py++) {
          for (let px = x + gx * scale; px < x + (gx + 1) * scale; px++) {
            const o = (py * W + px) * 3;
            for (let c = 0; c < 3; c++) data[o + c] = clamp8(ink + rng.int(51) - 25);
          }
        }
      }
    }
    placements.push({ x, y, scale });
  }
  const nums = numbers as [number, number, number];
  return { numbers: nums, answer: nums.indexOf(Math.max(...nums)), image: { width: W, height: H, data }, placements };
}

/** `count` samples from the seed (the same seed gives the same samples, pixel for pixel). */
export function generateVisionGame(count: number, seed: number): VisionGameSample[] {
  const rng = Rng.fromSeed(`number_game_vision:${seed}`);
  const out: VisionGameSample[] = [];
  for (let i = 0; i < count; i++) out.push(drawVisionGameSample(rng));
  return out;
}

/**
 * Reads the three digits back from a rendered image (at the rendered size): a pixel is ink when
 * its mean channel value is under the threshold; in each third of the width the ink's bounding
 * box gives the scale (its height / 7) and the cropped glyph, matched against the font. A third
 * with no ink, or whose ink matches no glyph (e.g. the image was resized or is not one of this
 * game's), reads as null.
 */
export function readNumberGameDigits(img: RgbImage): Array<number | null> {
  const { width: W, height: H, data } = img;
  if (data.length !== W * H * 3) throw new RangeError(`image data has ${data.length} bytes, expected ${W}×${H}×3`);
  const slot = Math.floor(W / 3);
  const ink = (x: number, y: number) => {
    const o = (y * W + x) * 3;
    return data[o] + data[o + 1] + data[o + 2] < 3 * THRESHOLD;
  };
  const out: Array<number | null> = [];
  for (let i = 0; i < 3; i++) {
    let x0 = Infinity,
      x1 = -1,
      y0 = Infinity,
      y1 = -1;
    for (let y = 0; y < H; y++) {
      for (let x = i * slot; x < (i + 1) * slot; x++) {
        if (!ink(x, y)) continue;
        x0 = Math.min(x0, x);
        x1 = Math.max(x1, x);
        y0 = Math.min(y0, y);
        y1 = Math.max(y1, y);
      }
    }
    const h = y1 - y0 + 1,
      w = x1 - x0 + 1;
    if (x1 < 0 || h % GLYPH_H !== 0) {
      out.push(null);
      continue;
    }
    const s = h / GLYPH_H;
    let found: number | null = null;
    for (let d = 0; d < 10 && found === null; d++) {
      const [lo, hi] = INK_COLS[d];
      if ((hi - lo + 1) * s !== w) continue;
      let same = true;
      for (let gy = 0; gy < GLYPH_H && same; gy++) {
        for (let gx = lo; gx <= hi && same; gx++) {
          // the centre pixel of the font cell
          const px = x0 + (gx - lo) * s + (s >> 1),
            py = y0 + gy * s + (s >> 1);
          same = ink(px, py) === (FONT[d][gy][gx] === '#');
        }
      }
      if (same) found = d;
    }
    out.push(found);
  }
  return out;
}

/** The three digits of a game image, or null when any of them cannot be read (readNumberGameDigits). */
export function readNumberGameImage(img: RgbImage): [number, number, number] | null {
  const d = readNumberGameDigits(img);
  return d.every((x) => x !== null) ? (d as [number, number, number]) : null;
}
