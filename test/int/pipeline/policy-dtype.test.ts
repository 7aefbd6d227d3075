/**
 * policy.dtype: bf16 over a one-step embedded run (the tiny number game): the stored versions are
 * BF16, the embedded rollout samples with the rounded weights (the in-memory hand-off), so the
 * sampler's log-probs differ from the trainer's f32 ones by a small nonzero amount
 * (rollout/logprob_mismatch_abs_*; with f32 they agree to f32 rounding, ~1e-7, which
 * test/e2e/inference-engine.test.ts checks on its f32 run), and the checkpoint's optimizer state
 * keeps the f32 master weights whose rounding the version stores.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../../lib/config/index.ts';
import { trainEmbedded } from '../../../app/run.ts';
import { silentLogger } from '../../../lib/log.ts';
import { openStore } from '../../../lib/store/index.ts';
import { loadCheckpoint } from '../../../lib/model/checkpoint.ts';
import { decodeSafetensors, roundedToBf16 } from '../../../lib/model/safetensors.ts';
import { policyDir } from '../../../lib/pipeline/policy.ts';

const ROOT = join(import.meta.dirname, '../../..');
const RUN_ID = 'int-policy-dtype';
const tmp = join(ROOT, 'test/.tmp', `policy-dtype-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

/** Trains one step with policy.dtype bf16; returns its run directory and each step's value of a metric. */
async function trainBf16(): Promise<{ dir: string; metric: (n: string) => number[] }> {
  const dir = join(tmp, 'bf16');
  const cfg = loadConfig({
    file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
    overrides: ['trainer.max_steps=1', `trainer.run_dir=${dir}`, `pipeline.run_id=${RUN_ID}`, 'policy.dtype=bf16'],
  });
  const out = await trainEmbedded(cfg, silentLogger(RUN_ID));
  assert.equal(out.status, 'completed', out.message);
  const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
  try {
    const ms = await store.getMetrics(RUN_ID);
    const byStep = (n: string) =>
      ms
        .filter((m) => m.name === n)
        .sort((a, b) => a.step - b.step)
        .map((m) => m.value);
    return { dir, metric: byStep };
  } finally {
    await store.close();
  }
}

test('policy.dtype: bf16 stores rounded versions, samples with them, keeps f32 masters and reports the mismatch', async (t) => {
  const bf16 = await trainBf16();
  const [mean] = bf16.metric('rollout/logprob_mismatch_abs_mean');
  const [max] = bf16.metric('rollout/logprob_mismatch_abs_max');
  assert.ok(mean > 0 && mean < 0.05, `bf16: mean |Δ log-prob| ${mean}`);
  // f32 gives ~1e-7 (rounding in a different summation order): bf16's gap is well above it
  assert.ok(max > 1e-5 && max < 0.5, `bf16: max |Δ log-prob| ${max}`);

  t.diagnostic(`bf16: |Δ log-prob| mean ${mean}, max ${max}`);

  // version 1 on disk: BF16 weights; its checkpoint (step 1, the last) holds the f32 masters they round
  const v1 = policyDir(bf16.dir, 1);
  const file = decodeSafetensors(readFileSync(join(v1, 'model.safetensors')), 'model.safetensors');
  assert.ok([...file.tensors.values()].every((t) => t.dtype === 'BF16'));
  const actor = join(bf16.dir, 'checkpoints', 'global_step_1', 'actor');
  const masters = (await loadCheckpoint(actor)).weights;
  const rounded = (await loadCheckpoint(v1, { optimizer: false })).weights;
  let kept = 0;
  for (const [k, w] of masters) {
    assert.deepEqual(rounded.get(k), roundedToBf16(w), k);
    if (w.some((x, i) => x !== rounded.get(k)![i])) kept++;
  }
  assert.ok(kept > 0, 'the masters keep f32 precision the version does not');
});
