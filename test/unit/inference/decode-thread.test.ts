/**
 * The decode thread (lib/inference/decode-thread.ts): sequences batched on the worker are the ones
 * `Sampler.generate` draws for their (seed, id) alone, a sequence ends at the token whose onToken
 * returned true (tokens the worker decoded after it are dropped), top log-probs come across, bad
 * requests are ConfigErrors, a new policy version is read by the worker from its directory (a
 * failed read keeps the version before), the HTTP thread's side holds no weights, and a worker
 * that died is restarted with the version it served.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Worker } from 'node:worker_threads';
import { initWeights, modelConfig } from '../../../lib/model/index.ts';
import { saveCheckpoint } from '../../../lib/model/checkpoint.ts';
import { Sampler, type SamplingParamsInput } from '../../../lib/model/sample.ts';
import { ThreadedBatcher } from '../../../lib/inference/decode-thread.ts';
import { ConfigError, RlError } from '../../../lib/errors.ts';
import { TINY_GQA_BIAS, TINY_ONE_LAYER } from '../../support/tiny-models.ts';

const cfg = modelConfig(TINY_GQA_BIAS);
const W = initWeights(cfg, 7, { std: 0.3 });
const W2 = initWeights(cfg, 8, { std: 0.3 });
const sampler = new Sampler(cfg, { threads: 1 });
const root = mkdtempSync(join(tmpdir(), 'rlstream-decode-thread-'));
after(() => rmSync(root, { recursive: true, force: true }));

/** Bytes of typed arrays reachable from `o`'s fields, the worker handle left out. */
function typedBytes(o: unknown, seen = new Set<unknown>()): number {
  if (o === null || typeof o !== 'object' || seen.has(o)) return 0;
  seen.add(o);
  if (ArrayBuffer.isView(o)) return o.byteLength;
  if (o.constructor?.name === 'Worker') return 0;
  let n = 0;
  const vals = o instanceof Map ? [...o.keys(), ...o.values()] : o instanceof Set ? [...o] : Object.values(o);
  for (const v of vals) n += typedBytes(v, seen);
  return n;
}

test('the decode thread samples what Sampler.generate does, stops where onToken says, and follows a new version', async () => {
  const [a, b2, other] = [join(root, 'v1'), join(root, 'v2'), join(root, 'other')];
  await saveCheckpoint(a, cfg, W);
  await saveCheckpoint(b2, cfg, W2);
  const oc = modelConfig(TINY_ONE_LAYER);
  await saveCheckpoint(other, oc, initWeights(oc, 1));
  const b = new ThreadedBatcher(cfg, { threads: 1, windowMs: 0 });
  try {
    // the HTTP thread names a version's directory (typechecked, not run): the worker reads the weights
    // @ts-expect-error setPolicy takes no weights
    const byWeights = () => b.setPolicy({ version: 0, dir: a, weights: W });
    void byWeights;
    await b.setPolicy({ version: 1, dir: a });
    assert.deepEqual(b.version, { version: 1, dir: a });
    const p: SamplingParamsInput = { maxNewTokens: 10, temperature: 1, seed: 3, eosTokenIds: [] };
    const seqs = [
      { id: 'x0', prompt: [1, 5, 6, 7] },
      { id: 'x1', prompt: [1, 9, 10] },
    ];
    const streamed: number[][] = [[], []];
    let yTokens = 0;
    const [whole, stopped] = await Promise.all([
      b.submit(seqs, p, { topLogprobs: 2, onToken: (s, t) => void streamed[s].push(t.token) }),
      b.submit([{ id: 'y0', prompt: [1, 4] }], p, { onToken: () => ++yTokens === 3 }),
    ]);
    const solo = await sampler.generate(W, [...seqs, { id: 'y0', prompt: [1, 4] }], p);
    assert.equal(whole.version, 1);
    whole.generations.forEach((g, i) => {
      assert.deepEqual(g.tokens, Array.from(solo[i].tokens), `${g.id}: the sampler's own draw`);
      assert.deepEqual(g.tokens, streamed[i], 'onToken saw every token in order');
      assert.equal(g.top.length, g.tokens.length);
      assert.ok(g.top.every((t) => t.length === 2 && t[0].logprob >= t[1].logprob));
      assert.equal(g.finishReason, 'length');
    });
    const y = stopped.generations[0];
    assert.equal(y.finishReason, 'stopped');
    assert.equal(y.tokens.length, 3, 'the sequence ends at the token whose onToken returned true');
    assert.deepEqual(y.tokens, Array.from(solo[2].tokens.slice(0, 3)));

    await assert.rejects(b.submit([{ id: 'z', prompt: [cfg.vocabSize] }], p), ConfigError);

    // failed loads answer with their error and leave version 1 serving
    await assert.rejects(
      b.setPolicy({ version: 9, dir: join(root, 'absent') }),
      (e) => e instanceof RlError && e.code === 'ERR_NO_MODEL_PATH' && /does not exist/.test(e.message),
    );
    await assert.rejects(
      b.setPolicy({ version: 9, dir: other }),
      (e) =>
        e instanceof RlError && e.code === 'ERR_MODEL_MISMATCH' && /does not match the served model/.test(e.message),
    );
    assert.equal((await b.submit([seqs[0]], p)).version, 1);

    await b.setPolicy({ version: 2, dir: b2 });
    const want2 = Array.from((await sampler.generate(W2, [seqs[0]], p))[0].tokens);
    const after2 = await b.submit([seqs[0]], p);
    assert.equal(after2.version, 2);
    assert.deepEqual(after2.generations[0].tokens, want2);
    assert.ok(typedBytes(b) < 4096, `the HTTP thread's side holds ${typedBytes(b)} bytes of typed arrays`);

    // a worker that dies is restarted by the next request, reading version 2's directory again
    const worker = (b as unknown as { worker: Worker }).worker;
    const gone = new Promise((res) => worker.once('exit', res));
    await worker.terminate();
    await gone;
    const restarted = await b.submit([seqs[0]], p);
    assert.notEqual((b as unknown as { worker: Worker }).worker, worker, 'a fresh worker');
    assert.equal(restarted.version, 2);
    assert.deepEqual(restarted.generations[0].tokens, want2);
  } finally {
    await b.close();
  }
});
