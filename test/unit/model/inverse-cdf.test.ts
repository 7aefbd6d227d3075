/**
 * The two-level inverse CDF of the sampling graphs (chunk sums, then the prefix sum inside the
 * chosen chunk) against the definition, one prefix sum over the vocabulary in float64: the same
 * token wherever u × total is not within float rounding of a token boundary, and never a token of
 * zero probability (suppressed ids, zero-padded chunks, u at the ends of (0, 1)). The greedy
 * draw's two-level argmax against the first maximum of each row.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { GraphBuilder } from '../../../lib/onnx/builder.ts';
import { createSession, tensor } from '../../../lib/onnx/runtime.ts';
import { argMaxRows, chunkSize, inverseCdf } from '../../../lib/model/decode-graph.ts';
import { Rng } from '../../../lib/util/rng.ts';

async function drawer(V: number) {
  const b = new GraphBuilder();
  const probs = b.input('probs', 'float32', ['B', V]);
  const u = b.input('u', 'float32', ['B']);
  b.output(inverseCdf(b, probs, u), 'token');
  const sess = await createSession(b.toBytes(), { threads: 1 });
  return async (p: Float32Array, us: Float32Array) => {
    const B = us.length;
    const r = await sess.run({ probs: tensor('float32', p, [B, V]), u: tensor('float32', us, [B]) });
    return Array.from(r.token.data as BigInt64Array, Number);
  };
}

/** The definition in float64: the first token whose cumulative mass reaches u × total; `margin`: that mass's distance to the target relative to the total. */
function reference(p: Float32Array, V: number, row: number, u: number): { token: number; margin: number } {
  let total = 0;
  for (let v = 0; v < V; v++) total += p[row * V + v];
  const target = u * total;
  let cum = 0;
  for (let v = 0; v < V; v++) {
    const prev = cum;
    cum += p[row * V + v];
    if (cum >= target && p[row * V + v] > 0) return { token: v, margin: Math.min(target - prev, cum - target) / total };
  }
  return { token: V - 1, margin: 0 };
}

test('chunk sizes: a divisor of V near √V where there is one, else ⌈√V⌉ with padding', () => {
  assert.equal(chunkSize(49152), 192); // SmolLM2: 256 chunks of 192
  assert.equal(49152 % chunkSize(49152), 0);
  assert.equal(151936 % chunkSize(151936), 0); // Qwen2.5
  assert.equal(128256 % chunkSize(128256), 0); // Llama 3
  assert.equal(chunkSize(1009), 32); // prime: padded to 32 × 32
});

test('inverse CDF in two levels draws the token of one prefix sum, never a zero-probability one', async () => {
  const rng = Rng.fromSeed('inverse-cdf');
  for (const V of [3, 259, 1009, 49152]) {
    const draw = await drawer(V);
    const B = 64;
    const p = new Float32Array(B * V);
    for (let r = 0; r < B; r++) {
      // softmax of wide logits, some ids suppressed (exact zeros), rows of every sharpness
      const scale = r % 4 === 0 ? 20 : 3;
      let sum = 0;
      for (let v = 0; v < V; v++) {
        const zero = (v * 7 + r) % 5 === 0 || (V > 10 && v >= V - 3);
        const e = zero ? 0 : Math.exp(scale * (rng.next() - 1));
        p[r * V + v] = e;
        sum += e;
      }
      for (let v = 0; v < V; v++) p[r * V + v] /= sum;
    }
    // uniforms inside (0, 1), and the ends of the sampler's grid (a target within rounding of 0 or of the total)
    for (const u of [() => rng.next(), () => 2 ** -25, () => 1 - 2 ** -25]) {
      const us = Float32Array.from({ length: B }, u);
      const got = await draw(p, us);
      got.forEach((t, r) => {
        assert.ok(t >= 0 && t < V && p[r * V + t] > 0, `V ${V} row ${r}: token ${t} has probability ${p[r * V + t]}`);
        const ref = reference(p, V, r, us[r]);
        if (ref.margin > 1e-5) assert.equal(t, ref.token, `V ${V} row ${r} u ${us[r]}`);
      });
    }
  }
});

test('a chunk whose sum rounds above its own prefix sum still draws one of its tokens with mass', async () => {
  // chunk 5 of V = 1024 (32 × 32): 0.5 then 30 × 2^-25 and a zero; nothing after it. The prefix sum
  // inside the chunk stays 0.5 (each 2^-25 is half an ulp, rounded to even) while a summation in
  // another order sees the small terms, so u near 1 targets mass the chunk's prefix sum never reaches.
  const V = 1024,
    C = chunkSize(V);
  assert.equal(C, 32);
  const p = new Float32Array(V);
  p[5 * C] = 0.5;
  for (let k = 1; k < C - 1; k++) p[5 * C + k] = 2 ** -25;
  const draw = await drawer(V);
  const [t] = await draw(p, Float32Array.of(1 - 2 ** -25));
  assert.ok(t >= 5 * C && t < 6 * C - 1, `token ${t} is in the chunk and has mass`);
});

test("two-level argmax: the first index of each row's maximum (ties, negative rows, padded chunks)", async () => {
  const rng = Rng.fromSeed('argmax');
  for (const V of [3, 259, 1009, 49152]) {
    const b = new GraphBuilder();
    const x = b.input('x', 'float32', ['B', V]);
    b.output(argMaxRows(b, x), 'i');
    const sess = await createSession(b.toBytes(), { threads: 1 });
    const B = 16;
    // values on a coarse grid (many ties), all negative in odd rows (the padding must not win)
    const xs = Float32Array.from(
      { length: B * V },
      (_, k) => Math.floor(rng.next() * 8) - (Math.floor(k / V) % 2 ? 20 : 0),
    );
    const got = Array.from((await sess.run({ x: tensor('float32', xs, [B, V]) })).i.data as BigInt64Array, Number);
    for (let r = 0; r < B; r++) {
      let best = 0;
      for (let v = 1; v < V; v++) if (xs[r * V + v] > xs[r * V + best]) best = v;
      assert.equal(got[r], best, `V ${V} row ${r}`);
    }
  }
});
