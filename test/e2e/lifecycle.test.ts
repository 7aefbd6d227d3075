/**
 * A run lifecycle that tells the truth: a run that fails at start is marked failed with
 * its reason (rlstream runs, report); a checkpoint directory given to val_only validates its
 * actor; a finished run says so; extending it trains the extra steps; a resume whose config
 * changes the meaning of the stored state is refused.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { listRunsInDir } from '../../lib/analysis/runs.ts';
import { loadReportData, summaryRows } from '../../lib/analysis/report.ts';
import { openDatabase } from '../../lib/db/database.ts';
import { ROOT, freshDatabase } from '../../devkit/pipeline-procs.ts';
import { serve } from '../../app/serve.ts';
import { openStore } from '../../lib/store/index.ts';

const root = join(ROOT, 'test/.tmp', `lifecycle-${process.pid}`);
after(() => rmSync(root, { recursive: true, force: true }));
const tiny = (dir: string, runId: string, extra: string[] = []) =>
  loadConfig({
    file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
    overrides: [`trainer.run_dir=${dir}`, `pipeline.run_id=${runId}`, ...extra],
    onWarning: () => undefined,
  });

test(
  'a run that fails at start (unreadable weights) is failed, with its reason in runs and report',
  { timeout: 120_000 },
  async () => {
    const runs = join(root, 'runs-a');
    // complete enough for the checks before the start (config.json, model.safetensors), unreadable weights
    const bad = join(root, 'bad-weights');
    mkdirSync(bad, { recursive: true });
    writeFileSync(join(bad, 'config.json'), '{"model_type": "llama"}');
    writeFileSync(join(bad, 'model.safetensors'), Buffer.alloc(64, 7));
    const cfg = tiny(join(runs, 'bad'), 'bad-start', [`actor.model.path=${bad}`]);
    const err = await trainEmbedded(cfg, silentLogger('bad-start')).then(
      () => null,
      (e: unknown) => e as Error,
    );
    assert.ok(err, 'the run fails');
    const [row] = await listRunsInDir(runs);
    assert.equal(row!.status, 'failed');
    assert.equal(row!.error, err.message);
    const db = await openDatabase({ kind: 'pglite', dir: join(runs, 'bad', 'db') });
    try {
      const rows = summaryRows(await loadReportData(db, 'bad-start'));
      assert.deepEqual(
        rows.find(([k]) => k === 'error'),
        ['error', err.message],
      );
    } finally {
      await db.close();
    }
  },
);

test(
  'a served stage that cannot start (missing weights) fails its run, with the reason',
  { timeout: 120_000 },
  async () => {
    const db = await freshDatabase(`rl_e2e_lifecycle_${process.pid}`);
    try {
      const empty = join(root, 'no-weights-serve');
      mkdirSync(empty, { recursive: true });
      const cfg = tiny(join(root, 'serve-bad'), 'bad-serve', [
        'pipeline.store=postgres',
        `pipeline.database_url=${db.url}`,
        'pipeline.migrate_on_start=true',
        `actor.model.path=${empty}`,
      ]);
      const store = await openStore({ kind: 'postgres', url: db.url });
      try {
        await store.upsertRun({ runId: 'bad-serve', project: 'p', experiment: 'e', config: {} as never });
        const err = await serve(cfg, 'update', silentLogger('bad-serve'), { httpPort: null }).then(
          () => null,
          (e: unknown) => e as Error,
        );
        assert.ok(err, 'the stage exits with the reason');
        const run = await store.getRun('bad-serve');
        assert.equal(run?.status, 'failed');
        assert.equal((run?.summary as { error?: string } | undefined)?.error, `update: ${err.message}`);
      } finally {
        await store.close();
      }
    } finally {
      await db.drop();
    }
  },
);

test(
  'a finished run says it is complete, is extended by more steps, and refuses a resume that changes rollout.n',
  { timeout: 240_000 },
  async () => {
    const dir = join(root, 'extend');
    const first = await trainEmbedded(tiny(dir, 'extend-run', ['trainer.max_steps=2']), silentLogger('extend-run'));
    assert.equal(first.status, 'completed', first.message);
    assert.equal(first.message, undefined);
    const again = await trainEmbedded(tiny(dir, 'extend-run', ['trainer.max_steps=2']), silentLogger('extend-run'));
    assert.equal(again.status, 'completed');
    assert.match(again.message ?? '', /^run extend-run already complete \(step 2\); nothing to do/);
    await assert.rejects(
      trainEmbedded(tiny(dir, 'extend-run', ['trainer.max_steps=2', 'rollout.n=2']), silentLogger('extend-run')),
      /run extend-run was started with another config: rollout\.n changes what the stored state means/,
    );
    await assert.rejects(
      trainEmbedded(
        tiny(dir, 'extend-run', ['trainer.max_steps=2', 'actor.optim.lr=1e-4']),
        silentLogger('extend-run'),
      ),
      /actor\.optim\.lr differs from the run's stored config; add trainer\.resume_with_changed_config=true/,
    );
    const more = await trainEmbedded(
      tiny(dir, 'extend-run', [
        'trainer.max_steps=4',
        'actor.optim.lr=1e-4',
        'trainer.resume_with_changed_config=true',
      ]),
      silentLogger('extend-run'),
    );
    assert.equal(more.status, 'completed', more.message);
    assert.equal(more.finalVersion, 4);
    const db = await openDatabase({ kind: 'pglite', dir: join(dir, 'db') });
    try {
      const data = await loadReportData(db, 'extend-run');
      assert.deepEqual(
        data.checkpoints.map((c) => c.step),
        [2, 4],
        'the final checkpoint of each end',
      );
      assert.equal(data.run.status, 'finished');
      assert.equal(data.run.lastStep, 4);
    } finally {
      await db.close();
    }
  },
);

test('val_only with a checkpoint directory validates its actor (as with …/actor)', { timeout: 240_000 }, async () => {
  const dir = join(root, 'valonly-src');
  const src = await trainEmbedded(
    tiny(dir, 'vo-src', ['trainer.max_steps=2', 'data.task_size.val=4']),
    silentLogger('vo-src'),
  );
  assert.equal(src.status, 'completed', src.message);
  for (const [name, path] of [
    ['ck', join(dir, 'checkpoints', 'global_step_2')],
    ['actor', join(dir, 'checkpoints', 'global_step_2', 'actor')],
  ] as const) {
    const runDir = join(root, `valonly-${name}`);
    const out = await trainEmbedded(
      tiny(runDir, `vo-${name}`, [
        'trainer.val_only=true',
        'data.task_size.val=4',
        `trainer.load_checkpoint_path=${path}`,
      ]),
      silentLogger(`vo-${name}`),
    );
    assert.equal(out.status, 'completed', out.message);
    const db = await openDatabase({ kind: 'pglite', dir: join(runDir, 'db') });
    try {
      const data = await loadReportData(db, `vo-${name}`);
      assert.equal(data.metrics.get('val/accuracy')?.length, 1, `${name}: one validation round stored`);
    } finally {
      await db.close();
    }
  }
});
