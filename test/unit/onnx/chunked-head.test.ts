/**
 * The LM head fused with log-softmax / entropy over vocabulary chunks (nn.ts chunkedLmHeadLogprob):
 * finite-difference gradients, and reference-vs-fast against the unchunked graph
 * (linear → tokenLogprobEntropy) for values and gradients, at several chunk sizes and temperatures.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { GraphBuilder, type Var } from '../../../lib/onnx/builder.ts';
import { chunkedLmHeadLogprob, linear, tokenLogprobEntropy, vocabChunks } from '../../../lib/onnx/nn.ts';
import { createSession, tensor } from '../../../lib/onnx/runtime.ts';
import { f64, gradCheck } from './gradcheck.ts';

const N = 5,
  D = 4,
  V = 11;
const targets = BigInt64Array.from([0n, 10n, 3n, 4n, 7n]);

describe('chunkedLmHeadLogprob', () => {
  it('splits the vocabulary into near-equal chunks covering it', () => {
    assert.deepEqual(vocabChunks(11, 4), [
      [0, 3],
      [3, 7],
      [7, 11],
    ]);
    assert.deepEqual(vocabChunks(8, 100), [[0, 8]]);
    assert.deepEqual(vocabChunks(151936, 8192).length, 19);
    assert.throws(() => vocabChunks(10, 0), /positive integer/);
  });

  for (const [chunk, tau] of [
    [4, 1],
    [3, 0.7],
    [1, 1.3],
  ] as const) {
    it(`gradient of log-prob and entropy matches finite differences (chunk ${chunk}, temperature ${tau})`, async () => {
      await gradCheck(
        [
          { name: 'h', shape: [N, D], data: f64(N * D, 1) },
          { name: 'w', shape: [V, D], data: f64(V * D, 2, 0.8) },
          { name: 't', dtype: 'int64', shape: [N], data: targets },
        ],
        (b, [h, w, t]) => {
          const r = chunkedLmHeadLogprob(b, h, w, t, { chunk, temperature: tau });
          return b.concat([r.logprob, r.entropy!], 0);
        },
        { rtol: 1e-5, atol: 1e-7 },
      );
    });
  }

  /** Outputs lp, H, correct and the gradients of Σ a·lp + Σ c·H wrt h and w, chunked or not. */
  async function run(chunked: number | null, opts: { tau: number | 'input'; entropy: boolean }) {
    const b = new GraphBuilder({ name: 'head', float: 'float64' });
    const h = b.input('h', 'float64', ['N', D]),
      w = b.input('w', 'float64', [V, D]),
      t = b.input('t', 'int64', ['N']);
    const a = b.input('a', 'float64', ['N']),
      c = b.input('c', 'float64', ['N']);
    const tau: number | Var = opts.tau === 'input' ? b.input('tau', 'float64', []) : opts.tau;
    let r: { logprob: Var; entropy: Var | null; correct: Var };
    if (chunked === null) {
      let z = linear(b, h, w);
      if (tau !== 1) z = b.div(z, tau);
      const u = tokenLogprobEntropy(b, z, t, { entropy: opts.entropy });
      r = { ...u, correct: b.equal(b.argMax(z, 1), t) };
    } else {
      const u = chunkedLmHeadLogprob(b, h, w, t, {
        chunk: chunked,
        temperature: tau,
        entropy: opts.entropy,
        correct: true,
      });
      r = { ...u, correct: u.correct! };
    }
    let L = b.reduceSum(b.mul(r.logprob, a), [0]);
    if (r.entropy) L = b.add(L, b.reduceSum(b.mul(r.entropy, c), [0]));
    const [gh, gw] = b.grad(L, [h, w]);
    b.output(r.logprob, 'lp');
    if (r.entropy) b.output(r.entropy, 'ent');
    b.output(r.correct, 'correct');
    b.output(gh, 'gh');
    b.output(gw, 'gw');
    const s = await createSession(b.toBytes(), { threads: 1 });
    const feeds: Record<string, ReturnType<typeof tensor>> = {
      h: tensor('float64', f64(N * D, 3, 2), [N, D]),
      w: tensor('float64', f64(V * D, 4, 2), [V, D]),
      t: tensor('int64', targets, [N]),
      a: tensor('float64', f64(N, 5), [N]),
      c: tensor('float64', f64(N, 6), [N]),
    };
    if (opts.tau === 'input') feeds.tau = tensor('float64', [0.6], []);
    const o = await s.run(feeds);
    return Object.fromEntries(
      Object.entries(o).map(([k, v]) => [k, Array.from(v.data as ArrayLike<number | boolean>, Number)]),
    );
  }

  for (const tau of [1, 0.5, 'input'] as const) {
    for (const entropy of [true, false]) {
      it(`equals the unchunked head in values and gradients (temperature ${tau}, entropy ${entropy})`, async () => {
        const ref = await run(null, { tau, entropy });
        for (const chunk of [1, 2, 5, 11, 64]) {
          const got = await run(chunk, { tau, entropy });
          for (const k of Object.keys(ref)) {
            assert.equal(got[k].length, ref[k].length, k);
            ref[k].forEach((v, i) =>
              assert.ok(
                Math.abs(v - got[k][i]) <= 1e-12 * (1 + Math.abs(v)),
                `chunk ${chunk} ${k}[${i}]: ${got[k][i]} vs unchunked ${v}`,
              ),
            );
          }
        }
      });
    }
  }

  it('refuses a symbolic vocabulary and mismatched shapes in one line', () => {
    const b = new GraphBuilder({ name: 'x' });
    const t = b.input('t', 'int64', ['N']);
    assert.throws(
      () => chunkedLmHeadLogprob(b, b.input('h', 'float32', ['N', 4]), b.input('w', 'float32', ['V', 4]), t),
      /vocabulary size .* must be static/,
    );
    assert.throws(
      () => chunkedLmHeadLogprob(b, b.input('h2', 'float32', ['N', 4]), b.input('w2', 'float32', [9, 3]), t),
      /need hidden \[N, D\]/,
    );
  });
});
