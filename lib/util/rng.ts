/**
 * Deterministic pseudo-random numbers for everything that must replay bit-for-bit: dataset
 * shuffles, data generators, chaos schedules. xoshiro128** (Blackman & Vigna 2018) seeded through
 * splitmix32 from a number or from the FNV-1a hash of a string. Its whole state is four uint32s,
 * so it can be checkpointed (`state()`) and restored (`Rng.fromState`).
 */
export class Rng {
  private s: Uint32Array;

  private constructor(s: Uint32Array) {
    this.s = s;
  }

  static fromSeed(seed: number | string): Rng {
    let x = typeof seed === 'number' ? (seed >>> 0) ^ Math.floor(seed / 2 ** 32) : fnv1a(seed);
    const s = new Uint32Array(4);
    for (let i = 0; i < 4; i++) {
      // splitmix32
      x = (x + 0x9e3779b9) >>> 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
      s[i] = (z ^ (z >>> 16)) >>> 0;
    }
    if (s[0] === 0 && s[1] === 0 && s[2] === 0 && s[3] === 0) s[0] = 1;
    return new Rng(s);
  }

  static fromState(state: readonly number[]): Rng {
    if (state.length !== 4) throw new Error(`Rng state must have 4 uint32 words, got ${state.length}`);
    return new Rng(Uint32Array.from(state));
  }

  state(): number[] {
    return Array.from(this.s);
  }

  /** Next uint32. */
  nextU32(): number {
    const s = this.s;
    const result = Math.imul(rotl(Math.imul(s[1], 5) >>> 0, 7), 9) >>> 0;
    const t = (s[1] << 9) >>> 0;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 11);
    return result;
  }

  /** Uniform in [0, 1) with 53 random bits. */
  next(): number {
    return ((this.nextU32() >>> 5) * 67108864 + (this.nextU32() >>> 6)) / 9007199254740992;
  }

  /** Uniform integer in [0, n). */
  int(n: number): number {
    if (!(n > 0) || !Number.isInteger(n)) throw new RangeError(`Rng.int needs a positive integer, got ${n}`);
    return Math.floor(this.next() * n);
  }

  /** Fisher–Yates shuffle in place. */
  shuffle<T>(a: T[]): T[] {
    for (let i = a.length - 1; i > 0; i--) {
      const j = this.int(i + 1);
      const tmp = a[i];
      a[i] = a[j];
      a[j] = tmp;
    }
    return a;
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/** 32-bit FNV-1a of a string's UTF-8 bytes. */
export function fnv1a(str: string): number {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(str, 'utf8')) {
    h ^= b;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}
