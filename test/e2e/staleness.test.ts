/**
 * pipeline.max_staleness = 1 in the embedded pipeline: the controller may hand out step s's prompts
 * while step s − 1 trains, so some steps' samples come from the version before the one they
 * update (staleness 1, never more); they keep their behaviour log-probs for the importance ratio,
 * and the run trains to the end. With max_staleness = 0 every sample is on-policy.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { openPipeline } from '../../lib/pipeline/runtime.ts';
import { silentLogger } from '../../lib/log.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const dir = join(ROOT, 'test/.tmp', `staleness-${process.pid}`);
after(() => rmSync(dir, { recursive: true, force: true }));

async function trainWith(
  staleness: number,
): Promise<{ perStep: Array<{ step: number; max: number; n: number }>; metric: Map<number, number> }> {
  const cfg = loadConfig({
    file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
    overrides: [
      `trainer.run_dir=${join(dir, `s${staleness}`)}`,
      `pipeline.run_id=staleness-${staleness}`,
      'trainer.max_steps=4',
      `pipeline.max_staleness=${staleness}`,
    ],
  });
  const out = await trainEmbedded(cfg, silentLogger(`staleness-${staleness}`));
  assert.equal(out.status, 'completed', out.message);
  assert.equal(out.finalVersion, 4);
  const p = await openPipeline(cfg);
  try {
    const { rows } = await sql<{
      step: number;
      max: number;
      n: number;
    }>`select step, max(staleness)::int as max, count(*)::int as n from trajectories
      where run_id = ${p.runId} and kind = 'train' group by step order by step`.execute(p.db.db);
    const metric = new Map((await p.store.getMetrics(p.runId, ['staleness/max'])).map((m) => [m.step, m.value]));
    return { perStep: rows, metric };
  } finally {
    await p.close();
  }
}

test(
  'max_staleness 1: some steps train on samples of the previous version, none older; max_staleness 0: none',
  { timeout: 300_000 },
  async () => {
    const stale = await trainWith(1);
    assert.deepEqual(
      stale.perStep.map((r) => [r.step, r.n]),
      [
        [1, 16],
        [2, 16],
        [3, 16],
        [4, 16],
      ],
      'every step trained on its 4 × 4 samples',
    );
    assert.ok(
      stale.perStep.every((r) => r.max <= 1),
      `no sample more than one version stale: ${JSON.stringify(stale.perStep)}`,
    );
    // step 2's prompts go out with version 0 at the start, before step 1 has trained
    assert.equal(stale.perStep[1].max, 1, `step 2 used version 0: ${JSON.stringify(stale.perStep)}`);
    for (const r of stale.perStep)
      assert.equal(stale.metric.get(r.step), r.max, `staleness/max of step ${r.step} matches the stored rows`);
    const sync = await trainWith(0);
    assert.ok(
      sync.perStep.every((r) => r.max === 0),
      `max_staleness 0 is on-policy: ${JSON.stringify(sync.perStep)}`,
    );
  },
);
