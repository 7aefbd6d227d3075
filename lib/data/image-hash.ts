/**
 * An image's identity: the lower-case hex sha256 of its normalised PNG bytes (lib/data/images.ts),
 * the key of prompt_images and of trajectories.image_hashes. Kept apart from images.ts so the
 * stages that only name images do not load sharp.
 */
import { createHash } from 'node:crypto';

export function imageHash(png: Uint8Array): string {
  return createHash('sha256').update(png).digest('hex');
}

const memo = new WeakMap<Uint8Array, string>();

/** imageHash, remembered per buffer (a group's n samples share their prompt's image buffers). */
export function imageHashOf(png: Uint8Array): string {
  let h = memo.get(png);
  if (h === undefined) {
    h = imageHash(png);
    memo.set(png, h);
  }
  return h;
}
