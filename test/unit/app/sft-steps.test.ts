/**
 * The SFT step loop both policy kinds share (app/sft-run.ts runSftSteps): a step whose loss is not
 * finite skips its update, is counted in sft/skipped_steps and named in a warning, and the run goes
 * on to its last checkpoint; the image trainer skips such an update (weights, moments and step
 * count unchanged).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../../lib/config/index.ts';
import { runSftSteps, withSftRun } from '../../../app/sft-run.ts';
import { openStore } from '../../../lib/store/index.ts';
import { silentLogger } from '../../../lib/log.ts';
import { ditConfig, initDitWeights } from '../../../lib/image/dit.ts';
import { ImageTrainer } from '../../../lib/image/trainer.ts';
import { ROOT } from '../../../devkit/pipeline-procs.ts';

const tmp = join(ROOT, 'test/.tmp', `sft-steps-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

test('a non-finite step is skipped, counted in sft/skipped_steps and warned about; the run completes', async () => {
  const runDir = join(tmp, 'run');
  const cfg = loadConfig({
    command: 'sft',
    overrides: [
      `trainer.run_dir=${runDir}`,
      'pipeline.run_id=steps',
      'trainer.save_freq=-1',
      'data.train_files=[x.jsonl]',
    ],
  });
  const warnings: string[] = [];
  const log = silentLogger('sft-steps');
  const spy = Object.assign(Object.create(log) as typeof log, {
    warn: (_o: unknown, msg?: string) => void warnings.push(String(msg)),
  });
  const plan = { units: 3, batchSize: 1, epochs: 1, maxSteps: null, shuffle: false, seed: 1 };
  let written = 0;
  const out = await withSftRun(cfg, spy, {}, (run) =>
    runSftSteps(
      cfg,
      spy,
      run,
      { start: 0, total: 3, plan, last: null },
      {
        lora: false,
        step: async (step) => {
          const loss = step === 2 ? NaN : 1 / step;
          return { values: { 'sft/loss': loss }, skipped: !Number.isFinite(loss), line: `loss ${loss}` };
        },
        optimizerSteps: () => 2,
        writeActor: async () => {
          written++;
          return 'f'.repeat(64);
        },
      },
    ),
  );
  assert.equal(out.status, 'completed');
  assert.equal(out.checkpoint?.step, 3);
  assert.equal(written, 1, 'one checkpoint: the last step');
  assert.match(out.summary, /1 step\(s\) skipped/);
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /^step 2: the loss or gradient norm is not finite .*the update was skipped/);
  const store = await openStore({ kind: 'pglite', dir: join(runDir, 'db') });
  try {
    const rows = (await store.getMetrics('steps', ['sft/skipped_steps'])).sort((a, b) => a.step - b.step);
    assert.deepEqual(
      rows.map((r) => r.value),
      [0, 1, 0],
    );
  } finally {
    await store.close();
  }
});

test('the image trainer skips an update whose loss is not finite', async () => {
  const c = ditConfig({ numClasses: 2, imageSize: 4, patchSize: 2, hidden: 8, depth: 1, heads: 2, timeFreqs: 4 });
  const w = initDitWeights(c, 1, { zeroInit: false });
  const tr = new ImageTrainer(
    c,
    w,
    { betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0, maxGradNorm: 1, lr: 0.1 },
    { threads: 1 },
  );
  const x0 = new Float32Array(2 * 16).fill(0.5);
  x0[3] = NaN;
  const before = tr.optimizerState();
  const r = await tr.step(
    { name: 'flow_matching' },
    { floats: { x0, noise: new Float32Array(32), t: [0.5, 0.5] }, cls: [0, 1] },
  );
  assert.ok(!Number.isFinite(r.loss));
  assert.equal(tr.lastSkipped, true);
  assert.equal(tr.stepCount, 0);
  assert.deepEqual(tr.weights, w);
  assert.deepEqual(tr.optimizerState(), before);
  x0[3] = 0.5;
  await tr.step({ name: 'flow_matching' }, { floats: { x0, noise: new Float32Array(32), t: [0.5, 0.5] }, cls: [0, 1] });
  assert.equal(tr.lastSkipped, false);
  assert.equal(tr.stepCount, 1);
});
