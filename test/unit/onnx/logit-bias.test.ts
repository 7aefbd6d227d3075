/**
 * The sampling mask in the fused LM head (nn.ts chunkedLmHeadLogprob `logitBias`): with
 * −1e9 at masked ids, log-prob, entropy and gradients equal the unchunked graph with the bias
 * added to the logits, at several chunk sizes, the masked ids get probability 0, and finite
 * differences agree.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { GraphBuilder } from '../../../lib/onnx/builder.ts';
import { chunkedLmHeadLogprob, linear, tokenLogprobEntropy } from '../../../lib/onnx/nn.ts';
import { createSession, tensor } from '../../../lib/onnx/runtime.ts';
import { f64, gradCheck } from './gradcheck.ts';

const N = 5,
  D = 4,
  V = 11;
const targets = BigInt64Array.from([0n, 10n, 3n, 4n, 7n]);
const masked = [2, 6, 9];
const bias = new Float32Array(V);
for (const m of masked) bias[m] = -1e9;

describe('chunkedLmHeadLogprob with a logit bias', () => {
  for (const [chunk, tau] of [
    [4, 1],
    [3, 0.7],
  ] as const) {
    it(`finite differences (chunk ${chunk}, temperature ${tau})`, async () => {
      await gradCheck(
        [
          { name: 'h', shape: [N, D], data: f64(N * D, 1) },
          { name: 'w', shape: [V, D], data: f64(V * D, 2, 0.8) },
          { name: 't', dtype: 'int64', shape: [N], data: targets },
        ],
        (b, [h, w, t]) => {
          const r = chunkedLmHeadLogprob(b, h, w, t, { chunk, temperature: tau, logitBias: bias });
          return b.concat([r.logprob, r.entropy!], 0);
        },
        { rtol: 1e-5, atol: 1e-7 },
      );
    });
  }

  async function run(chunk: number | null, tau: number, withBias: boolean) {
    const b = new GraphBuilder({ name: 'head', float: 'float64' });
    const h = b.input('h', 'float64', ['N', D]),
      w = b.input('w', 'float64', [V, D]),
      t = b.input('t', 'int64', ['N']);
    let r;
    if (chunk === null) {
      let z = linear(b, h, w);
      if (withBias) z = b.add(z, b.initializer('bias', Float64Array.from(bias), [1, V], 'float64'));
      if (tau !== 1) z = b.div(z, tau);
      r = tokenLogprobEntropy(b, z, t, { entropy: true });
    } else r = chunkedLmHeadLogprob(b, h, w, t, { chunk, temperature: tau, logitBias: withBias ? bias : null });
    const L = b.add(b.reduceSum(r.logprob, [0]), b.reduceSum(r.entropy!, [0]));
    const [gh, gw] = b.grad(L, [h, w]);
    b.output(r.logprob, 'lp');
    b.output(r.entropy!, 'ent');
    b.output(gh, 'gh');
    b.output(gw, 'gw');
    const s = await createSession(b.toBytes(), { threads: 1 });
    const out = await s.run({
      h: tensor('float64', f64(N * D, 1), [N, D]),
      w: tensor('float64', f64(V * D, 2, 0.8), [V, D]),
      t: tensor('int64', targets, [N]),
    });
    const get = (k: string) => Array.from(out[k].data as Float64Array);
    return { lp: get('lp'), ent: get('ent'), gh: get('gh'), gw: get('gw') };
  }

  it('equals the unchunked head with the bias added to the logits; masked rows get no gradient; differs without the bias', async () => {
    for (const tau of [1, 0.7]) {
      const ref = await run(null, tau, true);
      for (const chunk of [3, 4, V]) {
        const got = await run(chunk, tau, true);
        for (const k of ['lp', 'ent', 'gh', 'gw'] as const) {
          got[k].forEach((v, i) =>
            assert.ok(
              Math.abs(v - ref[k][i]) <= 1e-9 + 1e-7 * Math.abs(ref[k][i]),
              `${k}[${i}] chunk ${chunk} τ ${tau}: ${v} vs ${ref[k][i]}`,
            ),
          );
        }
        for (const m of masked)
          for (let d = 0; d < D; d++)
            assert.equal(got.gw[m * D + d], 0, `masked row ${m} of the head gets no gradient`);
      }
      const unbiased = await run(4, tau, false);
      assert.ok(
        unbiased.lp.some((v, i) => Math.abs(v - ref.lp[i]) > 1e-3),
        'the bias changes the log-probs',
      );
    }
  });
});
