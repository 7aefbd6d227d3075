/**
 * GenerationBatcher: requests submitted together share one sampler call per sampling setting, a
 * sequence id appears once per call, and requests that arrive while a call runs go into the next.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { GenerationBatcher } from '../../../lib/inference/batcher.ts';
import type { Generation, GenerationRequest, Sampler, SamplingParamsInput } from '../../../lib/model/sample.ts';
import type { Weights } from '../../../lib/model/params.ts';

function fakeSampler(calls: Array<{ ids: string[]; temperature: number | undefined }>, gate?: Promise<void>) {
  return {
    async generate(_w: Weights, reqs: readonly GenerationRequest[], p: SamplingParamsInput): Promise<Generation[]> {
      calls.push({ ids: reqs.map((r) => r.id), temperature: p.temperature });
      if (gate) await gate;
      return reqs.map((r) => ({
        id: r.id,
        tokens: Int32Array.from([r.prompt.length]),
        logprobs: Float32Array.from([-1]),
        finishReason: 'length' as const,
      }));
    },
  } as unknown as Sampler;
}

const policy = { version: 3, weights: new Map() as Weights, dir: '/x' };
const seqs = (tag: string, n: number) => Array.from({ length: n }, (_, i) => ({ id: `${tag}${i}`, prompt: [1, 2] }));
const params = (temperature: number): SamplingParamsInput => ({ temperature, maxNewTokens: 2 });

test('batcher: together-submitted requests share a call per setting; duplicate ids split', async () => {
  const calls: Array<{ ids: string[]; temperature: number | undefined }> = [];
  const b = new GenerationBatcher(fakeSampler(calls), () => policy, { windowMs: 1 });
  const rs = await Promise.all([
    b.submit(seqs('a', 2), params(1)),
    b.submit(seqs('b', 3), params(1)),
    b.submit(seqs('c', 1), params(0.5)),
    b.submit(seqs('a', 1), params(1)), // a0 again: its own call
  ]);
  assert.deepEqual(calls, [
    { ids: ['a0', 'a1', 'b0', 'b1', 'b2'], temperature: 1 },
    { ids: ['c0'], temperature: 0.5 },
    { ids: ['a0'], temperature: 1 },
  ]);
  assert.deepEqual(
    rs.map((r) => r.generations.map((g) => g.id)),
    [['a0', 'a1'], ['b0', 'b1', 'b2'], ['c0'], ['a0']],
  );
  assert.ok(rs.every((r) => r.version === 3));
});

test('batcher: requests that arrive while a call runs go together into the next call', async () => {
  const calls: Array<{ ids: string[]; temperature: number | undefined }> = [];
  let open!: () => void;
  const gate = new Promise<void>((r) => (open = r));
  const b = new GenerationBatcher(fakeSampler(calls, gate), () => policy, { windowMs: 1 });
  const first = b.submit(seqs('x', 1), params(1));
  while (calls.length === 0) await new Promise((r) => setTimeout(r, 1));
  const later = [b.submit(seqs('y', 2), params(1)), b.submit(seqs('z', 2), params(1))];
  assert.equal(b.pending, 4);
  open();
  await Promise.all([first, ...later]);
  assert.deepEqual(
    calls.map((c) => c.ids),
    [['x0'], ['y0', 'y1', 'z0', 'z1']],
  );
});
