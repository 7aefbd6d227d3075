/** Small helpers shared by the lib/rl unit tests. */
import assert from 'node:assert/strict';
import type { Tensor2D } from '../../../lib/rl/index.ts';

/** A float64 (bs, T) tensor from nested rows. */
export function t64(rows: number[][]): Tensor2D<Float64Array> {
  const bs = rows.length,
    T = rows[0]?.length ?? 0;
  const data = new Float64Array(bs * T);
  rows.forEach((r, i) => data.set(r, i * T));
  return { data, bs, T };
}

/** A float32 (bs, T) tensor from nested rows. */
export function t32(rows: number[][]): Tensor2D<Float32Array> {
  const t = t64(rows);
  return { data: new Float32Array(t.data), bs: t.bs, T: t.T };
}

/** Rows of a tensor as plain arrays. */
export function rows(t: Tensor2D): number[][] {
  const out: number[][] = [];
  for (let i = 0; i < t.bs; i++) out.push(Array.from(t.data.subarray(i * t.T, (i + 1) * t.T)));
  return out;
}

export function close(got: number, want: number, tol = 1e-9, msg = ''): void {
  assert.ok(Math.abs(got - want) <= tol * Math.max(1, Math.abs(want)), `${msg} got ${got}, want ${want} (tol ${tol})`);
}

export function closeArr(got: ArrayLike<number>, want: ArrayLike<number>, tol = 1e-9, msg = ''): void {
  assert.equal(got.length, want.length, `${msg} length`);
  for (let k = 0; k < want.length; k++) close(got[k], want[k], tol, `${msg}[${k}]`);
}

/**
 * Central finite differences of f with respect to every element of x (x is restored afterwards).
 */
export function numericGrad(f: (x: Float64Array) => number, x: Float64Array, h = 1e-6): Float64Array {
  const g = new Float64Array(x.length);
  for (let k = 0; k < x.length; k++) {
    const x0 = x[k];
    x[k] = x0 + h;
    const up = f(x);
    x[k] = x0 - h;
    const down = f(x);
    x[k] = x0;
    g[k] = (up - down) / (2 * h);
  }
  return g;
}
