/**
 * The arithmetic example learns: examples/arithmetic.yaml shortened to 25 steps without validation
 * or checkpoints, trained in-process through the embedded pipeline from the example's seeds and a
 * pinned run id (sample ids, and so the sampler's randomness, derive from it), so the run is
 * deterministic. The example trains on 64 fixed problems with the exact-match `arithmetic` reward
 * (accuracy + 0.1 · format); the untrained policy rarely writes a bare integer (reward ≈ 0.03).
 *
 * The format term alone can lift the reward to 0.1, so the test asks for more than that: the mean
 * train reward of the last 5 steps must be above 0.15 (accuracy above ≈ 5 %) and at least 0.08
 * above the mean of the first 5 steps. Measured with margin: the pinned run goes 0.028 → 0.099 →
 * 0.110 → 0.160 → 0.240 → 0.311 (steps 1/5/10/15/20/25), first-5 mean 0.072, last-5 mean 0.295;
 * the example's default run id (another sampling stream) has means 0.064 and 0.25.
 * About 55–60 s on 2 cores.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';

const ROOT = join(import.meta.dirname, '../..');
const RUN_ID = 'e2e-arithmetic';
const STEPS = 25;
const runDir = join(ROOT, 'test/.tmp', `arithmetic-${process.pid}`);
after(() => rmSync(runDir, { recursive: true, force: true }));

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

test('arithmetic: train reward rises well above the format-only level in 25 steps', { timeout: 600_000 }, async () => {
  const cfg = loadConfig({
    file: join(ROOT, 'examples/arithmetic.yaml'),
    overrides: [
      `trainer.run_dir=${runDir}`,
      `pipeline.run_id=${RUN_ID}`,
      `trainer.max_steps=${STEPS}`,
      'trainer.val_before_train=false',
      'trainer.val_freq=-1',
      'trainer.save_freq=-1',
    ],
  });
  const out = await trainEmbedded(cfg, silentLogger(RUN_ID));
  assert.equal(out.status, 'completed', out.message);
  const store = await openStore({ kind: 'pglite', dir: join(runDir, 'db') });
  try {
    const reward = (await store.getMetrics(RUN_ID, ['reward/mean'])).sort((a, b) => a.step - b.step);
    assert.deepEqual(
      reward.map((m) => m.step),
      Array.from({ length: STEPS }, (_, i) => i + 1),
      'one reward/mean per step',
    );
    const curve = reward.map((m) => `${m.step}:${m.value.toFixed(3)}`).join(' ');
    const first = mean(reward.slice(0, 5).map((m) => m.value));
    const last = mean(reward.slice(-5).map((m) => m.value));
    assert.ok(
      first < 0.1,
      `untrained policy's reward (mean of steps 1–5) is ${first.toFixed(3)}, expected below the format-only 0.1; curve: ${curve}`,
    );
    assert.ok(
      last > 0.15,
      `reward of the last 5 steps is ${last.toFixed(3)}: no better than writing integers (0.1); curve: ${curve}`,
    );
    assert.ok(last > first + 0.08, `reward rises only ${first.toFixed(3)} → ${last.toFixed(3)}; curve: ${curve}`);
    console.log(`# reward/mean first 5 steps ${first.toFixed(3)}, last 5 ${last.toFixed(3)}; curve: ${curve}`);
  } finally {
    await store.close();
  }
});
