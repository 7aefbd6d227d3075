/**
 * runInto: pre-allocated outputs are written in place, the other outputs are returned, and the
 * copies onnxruntime-node makes of pre-allocated outputs are collected at once above the threshold
 * (below it they stay until V8 next collects). V8 frees a collected ArrayBuffer's memory on a background
 * thread (concurrent array-buffer sweeping), so the process's count is read once it has settled.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { GraphBuilder } from '../../../lib/onnx/builder.ts';
import { createSession, runInto, tensor } from '../../../lib/onnx/runtime.ts';
import { collectGarbage } from '../../../lib/util/gc.ts';

const N = 16 * 2 ** 20; // 64 MiB of float32
const ab = () => process.memoryUsage().arrayBuffers;

/** The process's ArrayBuffer bytes once they fall below `below`, or after `ms` (no allocation meanwhile, so V8 does not collect on its own). */
async function settled(below: number, ms = 2000): Promise<number> {
  const until = Date.now() + ms;
  while (ab() >= below && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
  return ab();
}

async function session() {
  const b = new GraphBuilder();
  const x = b.input('x', 'float32', [N]);
  b.output(b.neg(x), 'y');
  b.output(b.reduceSum(x, [0]), 'sum');
  return createSession(b.toBytes(), { threads: 1, lowMemory: true });
}

describe('runInto', () => {
  it('writes pre-allocated outputs in place, returns the others, and collects the copies above the threshold', async () => {
    const sess = await session();
    const x = tensor('float32', new Float32Array(N).fill(2), [N]);
    const y = new Float32Array(N);
    // grown: the ArrayBuffer bytes a run adds, once V8's sweep of what it collected has finished
    const grown = async (collectAbove: number) => {
      // the second collection first finishes the first one's sweep: every earlier copy is freed
      collectGarbage();
      collectGarbage();
      const before = ab();
      const r = await runInto(sess, { x }, { y: tensor('float32', y, [N]) }, ['sum'], collectAbove);
      assert.deepEqual(Object.keys(r), ['sum']);
      assert.equal((r.sum.data as Float32Array)[0], 2 * N);
      return (await settled(before + N * 4 * 0.1)) - before;
    };
    const kept = await grown(Infinity);
    assert.equal(y[0], -2);
    assert.equal(y[N - 1], -2);
    // the binding's copy of `y` (64 MiB) is garbage that is still there without the collection …
    assert.ok(kept >= N * 4 * 0.9, `without collection the copy stays (grew ${kept} bytes)`);
    // … and gone with it
    const collected = await grown(0);
    assert.ok(collected < N * 4 * 0.1, `collected at once (grew ${collected} bytes)`);
    await sess.release();
  });
});
