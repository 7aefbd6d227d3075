/**
 * A reward's text details (a user module returning the extracted answer and a verdict as string
 * metrics) travel through scored.v3 and land in the store's reward_details next to the numeric
 * ones, for training and validation samples alike; the numeric ones still drive the metrics
 * (val/accuracy).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const tmp = join(ROOT, 'test/.tmp', `reward-text-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

test(
  'string metrics of a reward function are stored in reward_details with the numeric ones',
  { timeout: 180_000 },
  async () => {
    const runId = 'reward-text';
    const cfg = loadConfig({
      file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
      overrides: [
        `trainer.run_dir=${join(tmp, 'run')}`,
        `pipeline.run_id=${runId}`,
        'trainer.max_steps=2',
        'reward.reward_fn=null',
        `reward.reward_fn_path=${join(ROOT, 'test/e2e/fixtures/reward-with-text.mjs')}`,
        'data.task_size.val=4',
        'trainer.val_before_train=true',
      ],
    });
    const out = await trainEmbedded(cfg, silentLogger(runId));
    assert.equal(out.status, 'completed', out.message);
    const store = await openStore({ kind: 'pglite', dir: join(tmp, 'run', 'db') });
    try {
      for (const kind of ['train', 'val'] as const) {
        const rows = await store.getTrajectories(runId, { kind });
        assert.ok(rows.length > 0, `${kind} rows stored`);
        for (const r of rows) {
          const d = r.rewardDetails as Record<string, unknown>;
          assert.equal(d.pred, r.responseText.trim(), `${r.id}: the extracted answer is stored as text`);
          assert.equal(d.verdict, d.accuracy === 1 ? 'correct' : `expected ${r.groundTruth!.trim()}`);
          assert.equal(typeof d.accuracy, 'number');
          assert.equal(d.accuracy, r.reward);
        }
      }
      const names = new Set((await store.getMetrics(runId)).map((m) => m.name));
      assert.ok(names.has('reward/accuracy'), 'numeric components are metrics');
      assert.ok(
        ![...names].some((n) => n.includes('pred') || n.includes('verdict')),
        'text components are not metrics',
      );
      // the numeric details still drive the metrics: val/accuracy is the mean of the val rows' accuracy
      const val = await store.getTrajectories(runId, { kind: 'val' });
      const v0 = val.filter((r) => r.step === 0);
      const acc = (await store.getMetrics(runId, ['val/accuracy'])).find((m) => m.step === 0);
      assert.ok(acc, 'val/accuracy at step 0');
      assert.ok(
        Math.abs(
          acc!.value -
            v0.reduce((a, r) => a + Number((r.rewardDetails as Record<string, unknown>).accuracy), 0) / v0.length,
        ) < 1e-9,
      );
    } finally {
      await store.close();
    }
  },
);
