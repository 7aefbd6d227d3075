/**
 * Every differentiable op's backward rule against a float64 central finite difference in ORT.
 */
import { describe, it } from 'node:test';
import { f64, gradCheck } from './gradcheck.ts';
import {
  embedding,
  gelu,
  layerNorm,
  linear,
  quickGelu,
  rmsNorm,
  rope,
  silu,
  swiglu,
  tokenLogprobEntropy,
} from '../../../lib/onnx/nn.ts';
import assert from 'node:assert/strict';
import { GraphBuilder } from '../../../lib/onnx/builder.ts';
import { createSession, tensor } from '../../../lib/onnx/runtime.ts';

const X = (name: string, shape: number[], seed: number, scale = 1, offset = 0) => ({
  name,
  shape,
  data: f64(
    shape.reduce((a, b) => a * b, 1),
    seed,
    scale,
    offset,
  ),
});

describe('elementwise ops', () => {
  it('add/sub/mul/div with broadcasting', async () => {
    const a = X('a', [2, 3, 4], 1),
      c = X('c', [3, 1], 2, 0.5, 2);
    await gradCheck([a, c], (b, [x, y]) => b.add(x, y));
    await gradCheck([a, c], (b, [x, y]) => b.sub(y, x));
    await gradCheck([a, c], (b, [x, y]) => b.mul(x, y));
    await gradCheck([a, c], (b, [x, y]) => b.div(x, y));
    await gradCheck([a], (b, [x]) => b.div(3, b.add(b.mul(x, x), 1)));
  });
  it('unary: neg exp log sqrt reciprocal tanh sigmoid abs pow square', async () => {
    const a = X('a', [3, 4], 3);
    const pos = X('p', [3, 4], 4, 0.3, 2);
    await gradCheck([a], (b, [x]) => b.neg(x));
    await gradCheck([a], (b, [x]) => b.exp(x));
    await gradCheck([pos], (b, [x]) => b.log(x));
    await gradCheck([pos], (b, [x]) => b.sqrt(x));
    await gradCheck([pos], (b, [x]) => b.reciprocal(x));
    await gradCheck([a], (b, [x]) => b.tanh(x));
    await gradCheck([a], (b, [x]) => b.sigmoid(x));
    await gradCheck([a], (b, [x]) => b.abs(x));
    await gradCheck([pos], (b, [x]) => b.pow(x, 2.5));
    await gradCheck([a], (b, [x]) => b.square(x));
  });
  it('max/min/clip/where (away from ties and boundaries)', async () => {
    const a = X('a', [4, 5], 5),
      c = X('c', [5], 6);
    await gradCheck([a, c], (b, [x, y]) => b.max(x, y));
    await gradCheck([a, c], (b, [x, y]) => b.min(x, y));
    await gradCheck([a], (b, [x]) => b.clip(x, -0.7, 0.4));
    await gradCheck([a], (b, [x]) => b.clip(x, -0.3));
    await gradCheck([a, c], (b, [x, y]) => b.where(b.greater(x, 0), x, b.mul(y, 2)));
  });
});

describe('linear algebra', () => {
  it('matmul: 2-D, batched, broadcast batch, rank-2 rhs', async () => {
    await gradCheck([X('a', [3, 4], 1), X('w', [4, 5], 2)], (b, [x, y]) => b.matmul(x, y));
    await gradCheck([X('a', [2, 3, 4], 1), X('w', [2, 4, 5], 2)], (b, [x, y]) => b.matmul(x, y));
    await gradCheck([X('a', [2, 1, 3, 4], 1), X('w', [1, 3, 4, 2], 2)], (b, [x, y]) => b.matmul(x, y));
    await gradCheck([X('a', [2, 3, 4], 1), X('w', [4, 5], 2)], (b, [x, y]) => b.matmul(x, y));
  });
  it('gemm: every transA/transB combination, alpha and bias', async () => {
    for (const transA of [false, true]) {
      for (const transB of [false, true]) {
        const a = X('a', transA ? [4, 3] : [3, 4], 1),
          w = X('w', transB ? [5, 4] : [4, 5], 2),
          c = X('c', [5], 3);
        await gradCheck([a, w, c], (b, [x, y, z]) => b.gemm(x, y, { transA, transB, alpha: 0.7, c: z }));
      }
    }
    await gradCheck([X('x', [3, 4], 1), X('w', [5, 4], 2), X('bias', [5], 3)], (b, [x, w, c]) => linear(b, x, w, c));
  });
});

describe('shape ops', () => {
  it('reshape/transpose/unsqueeze/squeeze/expand', async () => {
    const a = X('a', [2, 3, 4], 1);
    await gradCheck([a], (b, [x]) => b.reshape(x, [6, 4]));
    await gradCheck([a], (b, [x]) => b.transpose(x, [2, 0, 1]));
    await gradCheck([a], (b, [x]) => b.squeeze(b.unsqueeze(b.mul(x, x), [1, 3]), [3]));
    await gradCheck([X('r', [3, 1], 2)], (b, [x]) => b.expand(x, [2, 3, 4]));
  });
  it('reshape and expand with symbolic dims', async () => {
    const a = { name: 'a', shape: ['B', 'T', 4], dims: [2, 3, 4], data: f64(24, 1) };
    await gradCheck([a], (b, [x]) => b.reshape(b.mul(x, x), ['B*T', 4]));
    await gradCheck([a], (b, [x]) => b.reshape(b.reshape(x, ['B*T', 2, 2]), ['B', 'T', 2, 2]));
    await gradCheck([a], (b, [x]) => b.mul(b.expand(b.reduceSum(x, [1], true), ['B', 'T', 4]), x));
  });
  it('concat/split/slice (static and symbolic end)', async () => {
    const a = X('a', [2, 3], 1),
      c = X('c', [2, 5], 2);
    await gradCheck([a, c], (b, [x, y]) => b.concat([x, b.mul(y, y)], 1));
    await gradCheck([c], (b, [x]) => {
      const [p, q] = b.split(x, 1, [2, 3]);
      return b.mul(b.slice(q, 1, 1), p);
    });
    await gradCheck([c], (b, [x]) => b.slice(x, 1, 1, 4));
    const s = { name: 's', shape: ['T', 3], dims: [4, 3], data: f64(12, 3) };
    const tab = X('tab', [6, 3], 4);
    await gradCheck([s, tab], (b, [x, t]) => b.mul(x, b.slice(t, 0, 0, 'T')));
  });
  it('gather (duplicate indices, 2 threads) and gatherElements', async () => {
    const emb = X('emb', [5, 3], 1);
    const idx = { name: 'idx', dtype: 'int64' as const, shape: [2, 4], data: [0, 3, 3, 1, 4, 3, 0, 3] };
    await gradCheck([emb, idx], (b, [e, i]) => b.gather(e, i), { threads: 2 });
    const d = X('d', [3, 4], 2);
    const gi = { name: 'gi', dtype: 'int64' as const, shape: [3, 2], data: [0, 3, 1, 1, 2, 0] };
    await gradCheck([d, gi], (b, [x, i]) => b.gatherElements(x, i, 1), { threads: 2 });
  });
});

describe('reductions and softmax', () => {
  it('reduceSum/reduceMean (keepdims both ways, symbolic count)', async () => {
    const a = X('a', [2, 3, 4], 1);
    await gradCheck([a], (b, [x]) => b.reduceSum(b.mul(x, x), [0, 2]));
    await gradCheck([a], (b, [x]) => b.reduceMean(b.mul(x, x), [1], true));
    const s = { name: 's', shape: ['B', 'T'], dims: [3, 5], data: f64(15, 2) };
    await gradCheck([s], (b, [x]) => b.reduceMean(b.exp(x), [0, 1]));
  });
  it('softmax/logSoftmax on inner and last axes', async () => {
    const a = X('a', [2, 3, 4], 1);
    await gradCheck([a], (b, [x]) => b.softmax(x, -1));
    await gradCheck([a], (b, [x]) => b.softmax(x, 1));
    await gradCheck([a], (b, [x]) => b.logSoftmax(x, -1));
  });
});

describe('composite nn ops', () => {
  it('rmsNorm', async () => {
    await gradCheck([X('x', [3, 6], 1), X('w', [6], 2, 0.3, 1)], (b, [x, w]) => rmsNorm(b, x, w, 1e-6));
  });
  it('layerNorm (vision tower)', async () => {
    await gradCheck([X('x', [3, 6], 1, 1, 0.5), X('w', [6], 2, 0.3, 1), X('bias', [6], 3, 0.3)], (b, [x, w, c]) =>
      layerNorm(b, x, w, c, 1e-6),
    );
  });
  it('quickGelu and exact gelu (float64 erf by series / continued fraction on both sides of |z| = 2)', async () => {
    await gradCheck([X('x', [3, 5], 1, 2)], (b, [x]) => quickGelu(b, x));
    await gradCheck([X('x', [4, 5], 1, 3)], (b, [x]) => gelu(b, x));
  });
  it('gelu values: x·(1 + erf(x/√2))/2 in float64 (series / continued fraction) and float32 (ORT Erf)', async () => {
    // erf(z) from Python's math.erf at z = −1.5, 0.5, 1, 2, 3, 5
    const zs = [-1.5, 0.5, 1, 2, 3, 5],
      erf = [
        -0.9661051464753108, 0.5204998778130465, 0.8427007929497149, 0.9953222650189527, 0.9999779095030014,
        0.9999999999984626,
      ];
    for (const float of ['float64', 'float32'] as const) {
      const g = new GraphBuilder({ float });
      g.output(gelu(g, g.input('x', float, [zs.length])), 'y');
      const sess = await createSession(g.toBytes());
      const xs = zs.map((z) => z * Math.SQRT2);
      const y = (
        await sess.run({
          x: tensor(float, float === 'float64' ? Float64Array.from(xs) : Float32Array.from(xs), [zs.length]),
        })
      ).y.data as Float64Array;
      xs.forEach((x, i) =>
        assert.ok(
          Math.abs(y[i] - (x * (1 + erf[i])) / 2) < (float === 'float64' ? 1e-14 : 1e-6),
          `${float} gelu(${x}) = ${y[i]}`,
        ),
      );
    }
  });
  it('silu and swiglu', async () => {
    await gradCheck([X('x', [3, 5], 1, 2)], (b, [x]) => silu(b, x));
    await gradCheck([X('g', [3, 5], 1, 2), X('u', [3, 5], 2)], (b, [g, u]) => swiglu(b, g, u));
  });
  it('rope', async () => {
    await gradCheck(
      [
        X('x', [2, 3, 2, 4], 1),
        { ...X('cos', [3, 1, 4], 2, 0.5), diff: false },
        { ...X('sin', [3, 1, 4], 3, 0.5), diff: false },
      ],
      (b, [x, c, s]) => b.add(rope(b, x, c, s), b.mul(rope(b, b.mul(x, x), c, s), 0.5)),
    );
  });
  it('embedding: one-hot Gemm and ScatterElements backward agree with finite differences (duplicates, 2 threads)', async () => {
    const emb = X('emb', [5, 3], 1);
    const idx = { name: 'idx', dtype: 'int64' as const, shape: ['N'], dims: [7], data: [0, 3, 3, 1, 4, 3, 3] };
    await gradCheck([emb, idx], (b, [e, i]) => embedding(b, e, i), { threads: 2 });
    await gradCheck([emb, idx], (b, [e, i]) => embedding(b, e, i, { oneHotMaxVocab: 0 }), { threads: 2 });
  });
  it('token log-prob and entropy', async () => {
    const z = X('z', [4, 6], 1, 2),
      t = { name: 't', dtype: 'int64' as const, shape: [4], data: [5, 0, 2, 5] };
    await gradCheck([z, t], (b, [x, tt]) => tokenLogprobEntropy(b, x, tt).logprob);
    await gradCheck([z, t], (b, [x, tt]) => tokenLogprobEntropy(b, x, tt).entropy!);
    await gradCheck([z, t], (b, [x, tt]) => {
      const r = tokenLogprobEntropy(b, x, tt);
      return b.add(b.mul(r.logprob, 2), b.mul(r.entropy!, r.logprob));
    });
  });
});
