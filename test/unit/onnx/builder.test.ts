/**
 * Graph builder: dimension algebra, build-time shape checks with clear errors, readable node
 * names, one graph serving a shape family, autodiff plumbing (a scatter gradient folded into the
 * other gradient of its table, accumulation into given tensors), graph outputs written by the node
 * that computes them, and that the gradient checker rejects a wrong backward rule.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { GraphBuilder, GraphError, type Var } from '../../../lib/onnx/builder.ts';
import { canonDim, dimDiv, dimEq, dimMul } from '../../../lib/onnx/dims.ts';
import { createSession, tensor } from '../../../lib/onnx/runtime.ts';
import { f64, gradCheck, randn } from './gradcheck.ts';

describe('dims', () => {
  it('canonical products and sums', () => {
    assert.ok(dimEq('T*B', 'B*T'));
    assert.equal(dimMul('B', 4), '4*B');
    assert.equal(dimMul(dimMul('B', 'T'), 2), '2*B*T');
    assert.equal(canonDim('T+P'), 'P+T');
    assert.equal(dimDiv('4*B*T', 'T'), '4*B');
    assert.equal(dimDiv('B', 'T'), undefined);
    assert.ok(!dimEq('B', 'T'));
  });
});

describe('builder', () => {
  it('checks shapes at build time and names the problem', () => {
    const b = new GraphBuilder();
    const x = b.input('x', 'float32', ['B', 8]);
    const w = b.input('w', 'float32', [4, 6]);
    assert.throws(
      () => b.gemm(x, w, { transB: true }),
      (e: Error) => e instanceof GraphError && /Gemm: inner dims differ: x \[B, 8\] · w \[4, 6\]ᵀ/.test(e.message),
    );
    assert.throws(() => b.add(x, b.input('y', 'float32', ['T', 8])), /Add: cannot broadcast \[B, 8\] with \[T, 8\]/);
    assert.throws(() => b.reshape(x, [3, 5]), /Reshape x: \[B, 8\] \(8\*B elements\) cannot become \[3, 5\]/);
    assert.throws(() => b.add(x, b.input('i', 'int64', ['B', 8])), /dtype mismatch/);
    assert.throws(() => b.input('x', 'float32', [1]), /already defined/);
    assert.throws(() => b.grad(x, [x]), /not a scalar; pass dy/);
    assert.throws(() => b.dimTensor('Q'), /dimension "Q" .* cannot be computed at runtime/);
  });

  it('readable node names from scopes; backward nodes under grad/', () => {
    const b = new GraphBuilder();
    const x = b.input('x', 'float32', [2, 3]);
    const y = b.scope('layers.0/mlp', () => b.tanh(x));
    assert.equal(y.name, 'layers.0/mlp/tanh');
    const s = b.reduceSum(y, [0, 1]);
    const [g] = b.grad(s, [x]);
    assert.ok(g.name.startsWith('grad/layers.0/mlp/'), g.name);
  });

  it('one graph serves a shape family (symbolic B, T; runtime reshape)', async () => {
    const b = new GraphBuilder();
    const x = b.input('x', 'float32', ['B', 'T', 4]);
    const flat = b.reshape(x, ['B*T', 4]);
    const y = b.reshape(
      b.gemm(
        flat,
        b.initializer(
          'w',
          Float32Array.from({ length: 8 }, (_, i) => i),
          [2, 4],
        ),
        { transB: true },
      ),
      ['B', 'T', 2],
    );
    b.output(y, 'y');
    const s = await createSession(b.toBytes(), { threads: 1 });
    for (const [B, T] of [
      [1, 1],
      [2, 3],
      [5, 7],
    ]) {
      const r = await s.run({ x: tensor('float32', new Float32Array(B * T * 4).fill(1), [B, T, 4]) });
      assert.deepEqual(r.y.dims, [B, T, 2]);
      assert.deepEqual(Array.from(r.y.data as Float32Array).slice(0, 2), [6, 22]);
    }
  });

  it('gradient of an unreachable input is zeros; stopGradient blocks flow', async () => {
    const b = new GraphBuilder({ float: 'float64' });
    const x = b.input('x', 'float64', [3]),
      z = b.input('z', 'float64', [3]);
    const s = b.reduceSum(b.mul(b.stopGradient(b.exp(x)), z), [0]);
    const [gx, gz] = b.grad(s, [x, z]);
    b.output(gx, 'gx');
    b.output(gz, 'gz');
    const sess = await createSession(b.toBytes(), { threads: 1 });
    const r = await sess.run({ x: tensor('float64', [0, 1, 2], [3]), z: tensor('float64', [1, 1, 1], [3]) });
    assert.deepEqual(Array.from(r.gx.data as Float64Array), [0, 0, 0]);
    assert.deepEqual(
      Array.from(r.gz.data as Float64Array).map((v) => +v.toFixed(6)),
      [1, 2.718282, 7.389056],
    );
  });

  it('the gradient checker rejects a wrong backward rule', async () => {
    await assert.rejects(
      gradCheck([{ name: 'x', shape: [4], data: f64(4, 1) }], (b, [x]) => {
        const y = b.stopGradient(b.mul(x, x));
        b.customVjp([x], [y], ([g]) => [b.mul(g!, x)]); // should be 2·x·g
        return y;
      }),
      /autodiff .* vs finite difference/,
    );
  });

  it('a graph output is written by the node that computes it; an input named as an output is copied', async () => {
    const b = new GraphBuilder();
    const x = b.input('x', 'float32', [3]);
    b.output(b.tanh(x), 'y');
    b.output(x, 'x_out');
    const nodes = b.toModelProto().graph!.node!;
    assert.deepEqual(
      nodes.map((n) => [n.opType, n.output![0]]),
      [
        ['Tanh', 'y'],
        ['Identity', 'x_out'],
      ],
    );
    const y = new Float32Array(3);
    const sess = await createSession(b.toBytes(), { threads: 1 });
    await sess.run({ x: tensor('float32', [0, 1, 2], [3]) }, { y: tensor('float32', y, [3]), x_out: null });
    assert.deepEqual(
      Array.from(y),
      [0, 1, 2].map((v) => Math.fround(Math.tanh(v))),
    );
  });

  it("a gather's gradient is scattered into the table's other gradient: no zeros, no Add", async () => {
    // a tied embedding: rows of `table` looked up, and `table` as the output projection
    const fn = (b: GraphBuilder, [table, ids, h]: Var[]) =>
      b.add(b.reduceSum(b.gather(table, ids), [0, 1]), b.reduceSum(b.gemm(h, table, { transB: true }), [0]));
    await gradCheck(
      [
        { name: 'table', shape: [5, 3], data: randn(15, 1) },
        { name: 'ids', dtype: 'int64', shape: [4], data: [1, 3, 1, 0] },
        { name: 'h', shape: [2, 3], data: randn(6, 2) },
      ],
      fn,
    );
    const b = new GraphBuilder();
    const xs = [b.input('table', 'float32', [5, 3]), b.input('ids', 'int64', [4]), b.input('h', 'float32', [2, 3])];
    b.output(b.grad(b.reduceSum(fn(b, xs), [0]), [xs[0]])[0], 'g');
    const ops = b.toModelProto().graph!.node!.map((n) => n.opType);
    assert.ok(ops.includes('ScatterElements'), ops.join(' '));
    assert.ok(!ops.includes('ConstantOfShape') && !ops.includes('Add'), ops.join(' '));
  });

  it('grad into: each gradient is added to its tensor, in checkpointed blocks too', async () => {
    const build = (into: boolean) => {
      const b = new GraphBuilder({ float: 'float64' });
      const x = b.input('x', 'float64', [2, 3]);
      const ws = [b.input('w0', 'float64', [3, 3]), b.input('w1', 'float64', [3, 3])];
      let h = x;
      for (const w of ws) h = b.checkpoint([h, w], ([a, v]) => [b.tanh(b.gemm(a, v))])[0];
      const acc = ws.map((_, i) => b.input(`acc${i}`, 'float64', [3, 3]));
      const gs = b.grad(b.reduceSum(h, [0, 1]), ws, undefined, into ? { into: acc } : {});
      gs.forEach((g, i) => b.output(into ? g : b.add(g, acc[i]), `g${i}`));
      return b.toBytes();
    };
    const feeds = () => ({
      x: tensor('float64', randn(6, 3), [2, 3]),
      w0: tensor('float64', randn(9, 4), [3, 3]),
      w1: tensor('float64', randn(9, 5), [3, 3]),
      acc0: tensor('float64', randn(9, 6), [3, 3]),
      acc1: tensor('float64', randn(9, 7), [3, 3]),
    });
    const [a, b] = await Promise.all(
      [true, false].map(async (into) => (await createSession(build(into), { threads: 1 })).run(feeds())),
    );
    for (const k of ['g0', 'g1'])
      (a[k].data as Float64Array).forEach((v, i) => assert.ok(Math.abs(v - (b[k].data as Float64Array)[i]) < 1e-12, k));
  });
});
