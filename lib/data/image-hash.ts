/**
 * An image's identity: the lower-case hex sha256 of its normalised PNG bytes (lib/data/images.ts),
 * the key of prompt_images, trajectories.image_hashes and trajectories.generated_image_hash; and
 * its size from the PNG header. Kept apart from images.ts so the
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

const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

/** Width and height of a PNG from its IHDR chunk (bytes 16–23, big-endian), without decoding it. */
export function pngSize(png: Uint8Array): { width: number; height: number } {
  const b = Buffer.from(png.buffer, png.byteOffset, png.byteLength);
  if (b.length < 24 || !b.subarray(0, 8).equals(PNG_SIGNATURE) || b.toString('latin1', 12, 16) !== 'IHDR')
    throw new RangeError(`not a PNG (${b.length} bytes without a PNG signature and IHDR chunk)`);
  return { width: b.readUInt32BE(16), height: b.readUInt32BE(20) };
}
