/**
 * A run lifecycle that tells the truth (issue 14): a run that fails at start is marked failed with
 * its reason (rlstream runs, report); a checkpoint directory given to val_only validates its
 * actor; a finished run says so; extending it trains the extra steps; a resume whose config
 * changes the meaning of the stored state is refused.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../lib/app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { listRunsInDir } from '../../lib/analysis/runs.ts';
import { loadReportData, summaryRows } from '../../lib/analysis/report.ts';
import { openDatabase } from '../../lib/db/database.ts';
import { ROOT } from '../support/pipeline-procs.ts';

const root = join(ROOT, 'test/.tmp', `lifecycle-${process.pid}`);
after(() => rmSync(root, { recursive: true, force: true }));
const tiny = (dir: string, runId: string, extra: string[] = []) => loadConfig({ file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'), overrides: [`trainer.run_dir=${dir}`, `pipeline.run_id=${runId}`, ...extra], onWarning: () => undefined });

test('a run that fails at start (missing weights) is failed, with its reason in runs and report', { timeout: 120_000 }, async () => {
  const runs = join(root, 'runs-a');
  const empty = join(root, 'no-weights');
  mkdirSync(empty, { recursive: true });
  const cfg = tiny(join(runs, 'bad'), 'bad-start', [`actor.model.path=${empty}`]);
  const err = await trainEmbedded(cfg, silentLogger('bad-start')).then(() => null, (e: unknown) => e as Error);
  assert.ok(err, 'the run fails');
  const [row] = await listRunsInDir(runs);
  assert.equal(row!.status, 'failed');
  assert.equal(row!.error, err.message);
  const db = await openDatabase({ kind: 'pglite', dir: join(runs, 'bad', 'db') });
  try {
    const rows = summaryRows(await loadReportData(db, 'bad-start'));
    assert.deepEqual(rows.find(([k]) => k === 'error'), ['error', err.message]);
  } finally { await db.close(); }
});
