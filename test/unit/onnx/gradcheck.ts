/**
 * Finite-difference gradient check helper: builds a float64 graph, scalarises the output with a
 * fixed random projection L = Σ y ⊙ R, emits the autodiff backward, runs it in ORT, and compares
 * every gradient element with a central difference of L (also run in ORT).
 */
import assert from 'node:assert/strict';
import { GraphBuilder, Var, type DType, type TensorData } from '../../../lib/onnx/builder.ts';
import { createSession, tensor } from '../../../lib/onnx/runtime.ts';
import { Rng } from '../../../lib/util/rng.ts';

export interface GcInput {
  name: string;
  dtype?: DType;
  shape: (number | string)[];
  data: TensorData | number[];
  dims?: number[];
  diff?: boolean;
}

export interface GcOptions {
  h?: number;
  rtol?: number;
  atol?: number;
  seed?: number;
  threads?: number;
}

export function randn(n: number, seed: number, scale = 1): Float64Array {
  const rng = Rng.fromSeed(`gc:${seed}`);
  const a = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    const u = Math.max(rng.next(), 1e-12),
      v = rng.next();
    a[i] = Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v) * scale;
  }
  return a;
}

/**
 * `fn` receives the declared input Vars and returns the output to check. Float inputs (dtype
 * float64) are differentiated unless `diff: false`. Returns the max abs error seen.
 */
export async function gradCheck(
  inputs: GcInput[],
  fn: (b: GraphBuilder, xs: Var[]) => Var,
  opts: GcOptions = {},
): Promise<{ maxErr: number; grads: Float64Array[] }> {
  const h = opts.h ?? 1e-6,
    rtol = opts.rtol ?? 1e-5,
    atol = opts.atol ?? 1e-7;
  const b = new GraphBuilder({ name: 'gradcheck', float: 'float64' });
  const xs = inputs.map((i) => b.input(i.name, i.dtype ?? 'float64', i.shape));
  const y = fn(b, xs);
  const dimsOf = (i: GcInput) => i.dims ?? (i.shape as number[]);
  // concrete output size: run a forward-only probe first
  const probe = new GraphBuilder({ name: 'probe', float: 'float64' });
  const pxs = inputs.map((i) => probe.input(i.name, i.dtype ?? 'float64', i.shape));
  probe.output(fn(probe, pxs), 'y');
  const feeds = () =>
    Object.fromEntries(
      inputs.map((i) => [
        i.name,
        tensor(i.dtype ?? 'float64', i.data instanceof Float64Array ? Float64Array.from(i.data) : i.data, dimsOf(i)),
      ]),
    );
  const ps = await createSession(probe.toBytes(), { threads: opts.threads ?? 1, graphOptimizationLevel: 'basic' });
  const py = (await ps.run(feeds())).y;
  const R = randn(py.data.length, opts.seed ?? 7);
  const r = b.input('__R', 'float64', y.shape);
  const L = b.reduceSum(
    b.reshape(b.mul(y, r), [
      y.shape.reduce<number | string>(
        (p, d) => (typeof p === 'number' && typeof d === 'number' ? p * d : `${p}*${d}`),
        1,
      ),
    ]),
    [0],
  );
  const diffIdx = inputs
    .map((inp, k) => ((inp.dtype ?? 'float64') === 'float64' && inp.diff !== false ? k : -1))
    .filter((k) => k >= 0);
  const gs = b.grad(
    L,
    diffIdx.map((k) => xs[k]),
  );
  b.output(L, 'L');
  gs.forEach((g, j) => b.output(g, `g${j}`));
  const sess = await createSession(b.toBytes(), { threads: opts.threads ?? 1, graphOptimizationLevel: 'basic' });
  const base = Object.fromEntries(
    inputs.map((i) => [i.name, i.data instanceof Float64Array ? Float64Array.from(i.data) : i.data]),
  );
  const run = async (over?: { k: number; data: Float64Array }) => {
    const f: Record<string, any> = {};
    inputs.forEach((i, k) => {
      f[i.name] = tensor(i.dtype ?? 'float64', over && over.k === k ? over.data : base[i.name], dimsOf(i));
    });
    f.__R = tensor('float64', R, py.dims as number[]);
    return sess.run(f);
  };
  const out = await run();
  let maxErr = 0;
  const grads: Float64Array[] = [];
  for (let j = 0; j < diffIdx.length; j++) {
    const k = diffIdx[j];
    const g = out[`g${j}`].data as Float64Array;
    grads.push(g);
    const x0 = base[inputs[k].name] as Float64Array;
    assert.equal(g.length, x0.length, `gradient of ${inputs[k].name} has ${g.length} elements, input has ${x0.length}`);
    for (let e = 0; e < x0.length; e++) {
      const xp = Float64Array.from(x0);
      xp[e] += h;
      const xm = Float64Array.from(x0);
      xm[e] -= h;
      const lp = ((await run({ k, data: xp })).L.data as Float64Array)[0];
      const lm = ((await run({ k, data: xm })).L.data as Float64Array)[0];
      const fd = (lp - lm) / (2 * h);
      const err = Math.abs(fd - g[e]);
      maxErr = Math.max(maxErr, err);
      assert.ok(
        err <= atol + rtol * Math.abs(fd),
        `d/d ${inputs[k].name}[${e}]: autodiff ${g[e]} vs finite difference ${fd} (err ${err})`,
      );
    }
  }
  return { maxErr, grads };
}

export function f64(n: number, seed: number, scale = 1, offset = 0): Float64Array {
  return randn(n, seed, scale).map((v) => v + offset);
}
