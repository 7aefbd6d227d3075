/**
 * Decoded image pixels by content hash, for the stages that need pixels (a vision policy): each
 * distinct image is decoded once and kept in a small LRU bounded by bytes, so the n samples of a
 * group and the stages' retries reuse it. The key is the image's hash (lib/data/images.ts), which
 * names its PNG bytes exactly.
 */
import { decodePixels, type ImagePixels } from './images.ts';
import { imageHash } from './image-hash.ts';

/** A least-recently-used map bounded by the summed `size` of its values. */
export class LruCache<V> {
  private readonly map = new Map<string, { value: V; size: number }>();
  private used = 0;
  constructor(readonly maxSize: number) {
    if (!(maxSize > 0)) throw new RangeError(`LRU size limit must be positive, got ${maxSize}`);
  }
  get size(): number {
    return this.used;
  }
  get count(): number {
    return this.map.size;
  }
  get(key: string): V | undefined {
    const e = this.map.get(key);
    if (!e) return undefined;
    this.map.delete(key);
    this.map.set(key, e); // most recent last
    return e.value;
  }
  /** Adds (or replaces) `key`, evicting the least recently used entries until it fits; a value larger than the limit is not kept. */
  set(key: string, value: V, size: number): void {
    const old = this.map.get(key);
    if (old) {
      this.used -= old.size;
      this.map.delete(key);
    }
    if (size > this.maxSize) return;
    for (const [k, e] of this.map) {
      if (this.used + size <= this.maxSize) break;
      this.map.delete(k);
      this.used -= e.size;
    }
    this.map.set(key, { value, size });
    this.used += size;
  }
}

export class PixelCache {
  private readonly lru: LruCache<Promise<ImagePixels>>;
  /** Decodes done (cache misses), for tests and metrics. */
  decodes = 0;
  constructor(maxBytes = 256 << 20) {
    this.lru = new LruCache(maxBytes);
  }

  /** The pixels of `png`, whose hash is `hash` (checked on a miss: a mismatch is a programming error). */
  async get(hash: string, png: Uint8Array): Promise<ImagePixels> {
    const hit = this.lru.get(hash);
    if (hit) return hit;
    if (imageHash(png) !== hash) throw new Error(`image bytes do not match their hash ${hash}`);
    this.decodes++;
    const p = decodePixels(png);
    // the entry's size is known once decoded; hold a small placeholder size meanwhile
    this.lru.set(hash, p, 1);
    try {
      const px = await p;
      this.lru.set(hash, p, px.data.byteLength);
      return px;
    } catch (e) {
      this.lru.set(hash, p, Number.POSITIVE_INFINITY); // drops the failed entry
      throw e;
    }
  }
}
