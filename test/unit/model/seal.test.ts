/**
 * lib/model/seal.ts: a version sealed in a worker thread is named by the sha256 saveCheckpoint
 * writes for it, and its bf16 rounding equals roundedToBf16 (ties to even, NaN, ±Infinity), as
 * on the calling thread for weights not packed into one buffer; one worker thread serves every seal.
 */
import assert from 'node:assert/strict';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { it } from 'node:test';
import { modelConfig } from '../../../lib/model/config.ts';
import { initWeights } from '../../../lib/model/init.ts';
import { checkpointWeightsSha256, saveCheckpoint } from '../../../lib/model/checkpoint.ts';
import { roundedToBf16 } from '../../../lib/model/safetensors.ts';
import { sealWeights, sealWorkersStarted, packedWeights } from '../../../lib/model/seal.ts';
import { TINY_ONE_LAYER } from '../../support/tiny-models.ts';

const config = modelConfig(TINY_ONE_LAYER);

it('sealWeights: the sha256 of the file saveCheckpoint writes and the bf16 rounding, in a worker and on this thread', async () => {
  const w = initWeights(config, 7);
  // bf16 edge cases in the first array: a tie rounded to even (up and down), NaN, ±Infinity, a carry into the exponent
  const first = w.values().next().value!;
  first.set([1 + 2 ** -8, 1 + 3 * 2 ** -8, NaN, Infinity, -Infinity, 3.4e38, -0]);
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'rlstream-seal-'));
  try {
    for (const dtype of ['float32', 'bfloat16'] as const) {
      const opts = { dtype, metadata: { policy_version: '3' } };
      const written = await saveCheckpoint(path.join(dir, dtype), config, w, opts);
      assert.equal(checkpointWeightsSha256(config, w, opts), written.weightsSha256);
      const packed = packedWeights(w);
      assert.equal(new Set([...packed.values()].map((a) => a.buffer)).size, 1);
      for (const weights of [packed, w]) {
        const s = await sealWeights(config, weights, opts);
        assert.equal(s.sha256, written.weightsSha256, `${dtype}, ${weights === w ? 'this thread' : 'worker'}`);
        if (weights === packed) {
          // sealed in the worker: the buffer was moved there and back, not copied (the arrays given are detached)
          assert.ok([...packed.values()].every((a) => a.length === 0));
          assert.equal(new Set([...s.stored.values()].map((a) => a.buffer)).size, 1);
        }
        // onnxruntime takes no SharedArrayBuffer: the stored weights are in ordinary memory
        assert.ok([...s.stored.values()].every((a) => !(a.buffer instanceof SharedArrayBuffer)));
        for (const [k, a] of w) {
          const want = dtype === 'float32' ? a : roundedToBf16(a);
          assert.deepEqual(new Uint32Array(s.stored.get(k)!.slice().buffer), new Uint32Array(want.slice().buffer), k);
        }
      }
    }
  } finally {
    await fs.rm(dir, { recursive: true, force: true });
  }
});

it('sealWeights: one long-lived worker seals every version, concurrent seals included, and lets the process exit', async () => {
  const ws = [11, 12, 13].map((seed) => initWeights(config, seed));
  const opts = { dtype: 'bfloat16' as const, metadata: { policy_version: '1' } };
  const sealed = await Promise.all(ws.map((w) => sealWeights(config, packedWeights(w), opts)));
  sealed.forEach((s, i) => assert.equal(s.sha256, checkpointWeightsSha256(config, ws[i], opts), `seal ${i}`));
  assert.equal(new Set(sealed.map((s) => s.sha256)).size, 3);
  const again = await sealWeights(config, packedWeights(ws[0]), opts);
  assert.equal(again.sha256, sealed[0].sha256);
  // every seal of this file (the test above included) went to the same worker thread
  assert.equal(sealWorkersStarted(), 1);
});
