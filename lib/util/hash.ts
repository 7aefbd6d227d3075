/**
 * SHA-256 of byte arrays of any size. Node's `Hash.update` refuses more than 2^31 − 1 bytes in one
 * call ("data is too long"): a 0.5B model's AdamW state (4 GB) or a 7B model's embedding (2.2 GB)
 * is fed in slices of `HASH_SLICE` bytes, which gives the same digest as one update.
 */
import { createHash, type Hash } from 'node:crypto';

/** Bytes per `Hash.update` call (1 GiB, under Node's 2^31 − 1 limit). */
export const HASH_SLICE = 1 << 30;

/** Feeds `data` to `h` in slices of at most `slice` bytes; returns `h`. */
export function updateHash(h: Hash, data: Uint8Array, slice = HASH_SLICE): Hash {
  for (let i = 0; i < data.byteLength; i += slice) h.update(data.subarray(i, Math.min(i + slice, data.byteLength)));
  return h;
}

/** Hex SHA-256 of `data`. */
export function sha256Hex(data: Uint8Array, slice = HASH_SLICE): string {
  return updateHash(createHash('sha256'), data, slice).digest('hex');
}
