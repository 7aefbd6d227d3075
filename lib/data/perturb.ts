/**
 * Image perturbations for VPPO's token visual dependency (arXiv 2510.09285 §3: the policy scores
 * each response again with a perturbed copy of its image; tokens whose log-prob moves most are the
 * perception tokens). They act on the resized pixels (the normalised PNG decoded: 8-bit RGB,
 * height × width × 3), are pure, and draw their randomness from an Rng seeded by the sample id —
 * so a replay of a run recomputes exactly the same perturbed image for every sample.
 *
 * Registry `algorithm.vppo.perturbation`:
 *  - patch_blackening (VPPO's): the image is cut into patch_size × patch_size cells (14 px, the
 *    ViT patch; edge cells may be smaller) and each cell is set to black with probability mask_prob
 *    (0.5), independently.
 *  - gaussian_noise: every channel value gets N(0, (noise_std·255)²) added, clamped to 0–255.
 *  - blackout: the whole image black (log π_aug is then the policy without visual evidence).
 */
import { Registry } from '../util/registry.ts';
import { Rng } from '../util/rng.ts';

/** 8-bit RGB, row-major (height × width × 3); lib/data/images.ts decodePixels gives this. */
export interface Pixels {
  width: number;
  height: number;
  data: Uint8Array;
}

export interface PerturbOptions {
  /** Cell side in pixels for patch_blackening (VPPO: 14). */
  patch_size: number;
  /** Probability that a cell is blackened (VPPO: 0.5). */
  mask_prob: number;
  /** gaussian_noise: standard deviation as a fraction of the 0–255 range. */
  noise_std: number;
}

export const DEFAULT_PERTURB_OPTIONS: PerturbOptions = { patch_size: 14, mask_prob: 0.5, noise_std: 0.1 };

/** A perturbation: a new image from `img` (never modified) and the sample's Rng. */
export type Perturbation = (img: Pixels, rng: Rng, o: PerturbOptions) => Pixels;

function checkPixels(img: Pixels): void {
  if (!(img.width >= 1 && img.height >= 1) || img.data.length !== img.width * img.height * 3) {
    throw new RangeError(
      `perturbation: image data has ${img.data.length} bytes, expected ${img.width}×${img.height}×3`,
    );
  }
}

export const patchBlackening: Perturbation = (img, rng, o) => {
  const { width: W, height: H } = img;
  const P = o.patch_size;
  const data = img.data.slice();
  const cols = Math.ceil(W / P),
    rows = Math.ceil(H / P);
  // one draw per cell, row-major over the cell grid
  for (let cy = 0; cy < rows; cy++) {
    for (let cx = 0; cx < cols; cx++) {
      if (!(rng.next() < o.mask_prob)) continue;
      for (let y = cy * P; y < Math.min(H, (cy + 1) * P); y++)
        data.fill(0, (y * W + cx * P) * 3, (y * W + Math.min(W, (cx + 1) * P)) * 3);
    }
  }
  return { width: W, height: H, data };
};

export const gaussianNoise: Perturbation = (img, rng, o) => {
  const data = img.data.slice();
  const sd = o.noise_std * 255;
  for (let k = 0; k < data.length; k += 2) {
    // Box–Muller: two independent N(0, 1) from two uniforms (1 − u keeps the log finite)
    const r = Math.sqrt(-2 * Math.log(1 - rng.next())),
      th = 2 * Math.PI * rng.next();
    data[k] = Math.min(255, Math.max(0, Math.round(data[k] + sd * r * Math.cos(th))));
    if (k + 1 < data.length) data[k + 1] = Math.min(255, Math.max(0, Math.round(data[k + 1] + sd * r * Math.sin(th))));
  }
  return { width: img.width, height: img.height, data };
};

export const blackout: Perturbation = (img) => ({
  width: img.width,
  height: img.height,
  data: new Uint8Array(img.data.length),
});

export const perturbations = new Registry<Perturbation>('algorithm.vppo.perturbation', {
  patch_blackening: patchBlackening,
  gaussian_noise: gaussianNoise,
  blackout,
});

/**
 * The perturbed copy of one sample's image: `name` from the registry, randomness seeded by the
 * sample id and the image's index in the prompt (so the n samples of a group get different
 * perturbations, and a replay the same ones).
 */
export function perturbImage(
  name: string,
  img: Pixels,
  sampleId: string,
  imageIndex = 0,
  o: PerturbOptions = DEFAULT_PERTURB_OPTIONS,
): Pixels {
  const fn = perturbations.get(name);
  checkPixels(img);
  if (!(Number.isInteger(o.patch_size) && o.patch_size >= 1))
    throw new RangeError(`perturbation: patch_size must be a positive integer, got ${o.patch_size}`);
  if (!(o.mask_prob >= 0 && o.mask_prob <= 1))
    throw new RangeError(`perturbation: mask_prob must be in [0, 1], got ${o.mask_prob}`);
  if (!(o.noise_std >= 0 && Number.isFinite(o.noise_std)))
    throw new RangeError(`perturbation: noise_std must be ≥ 0, got ${o.noise_std}`);
  return fn(img, Rng.fromSeed(`vppo:${sampleId}:${imageIndex}`), o);
}
