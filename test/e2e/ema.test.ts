/** algorithm.ema: the update stage keeps θ_ema ← d·θ_ema + (1 − d)·θ after every step, next to each version. */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { loadCheckpoint } from '../../lib/model/index.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const dir = join(ROOT, 'test/.tmp', `ema-${process.pid}`);
after(() => rmSync(dir, { recursive: true, force: true }));

test('EMA weights follow the decay rule across steps', { timeout: 300_000 }, async () => {
  const cfg = loadConfig({
    file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
    overrides: [
      `trainer.run_dir=${dir}`,
      'pipeline.run_id=ema-test',
      'trainer.max_steps=2',
      'algorithm.ema.enable=true',
      'algorithm.ema.decay=0.75',
      // version 1's policy weights are read below (rlstream train keeps it in memory by default)
      'policy.version_files=every_step',
    ],
  });
  const out = await trainEmbedded(cfg, silentLogger('ema-test'));
  assert.equal(out.status, 'completed', out.message);
  const v = async (sub: string) => (await loadCheckpoint(join(dir, sub), { optimizer: false })).weights;
  const [p0, p1, p2, e0, e1, e2] = await Promise.all(
    ['policy/v000000', 'policy/v000001', 'policy/v000002', 'ema/v000000', 'ema/v000001', 'ema/v000002'].map(v),
  );
  let moved = 0;
  for (const [name, w0] of p0) {
    assert.deepEqual(e0.get(name), w0, `EMA starts at the initial weights (${name})`);
    const a = e1.get(name)!,
      b = e2.get(name)!,
      w1 = p1.get(name)!,
      w2 = p2.get(name)!;
    for (let i = 0; i < w0.length; i++) {
      const x1 = 0.75 * w0[i] + 0.25 * w1[i];
      assert.ok(Math.abs(a[i] - x1) <= 1e-6 * (1 + Math.abs(x1)), `${name}[${i}] after step 1: ${a[i]} vs ${x1}`);
      const x2 = 0.75 * a[i] + 0.25 * w2[i];
      assert.ok(Math.abs(b[i] - x2) <= 1e-6 * (1 + Math.abs(x2)), `${name}[${i}] after step 2: ${b[i]} vs ${x2}`);
      if (b[i] !== w0[i]) moved++;
    }
  }
  assert.ok(moved > 0, 'training moved the EMA');
});
