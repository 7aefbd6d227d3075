/**
 * Uses the shared test database (RLSTREAM_TEST_PG_URL): this file runs alone (@runs-alone).
 * The analysis views, the read-only runner, the example queries and the commands on a real
 * PostgreSQL (RLSTREAM_TEST_PG_URL, default postgres://postgres@127.0.0.1:5432/test). The database
 * is shared with other tests, so the synthetic run has a unique id, every check filters by it, and
 * its rows are deleted afterwards.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import { createStore } from '../../../lib/store/index.ts';
import { queryObjects, runReadOnlyQuery } from '../../../lib/analysis/query.ts';
import { REPORT_PLOTS } from '../../../lib/analysis/report.ts';
import { runSql, type CommandIo } from '../../../app/cli/commands/sql.ts';
import { readerUrl } from '../../../devkit/pipeline-procs.ts';
import { runRuns } from '../../../app/cli/commands/runs.ts';
import { runReport } from '../../../app/cli/commands/report.ts';
import { readScalars } from '../../../lib/analysis/tensorboard.ts';
import { buildSyntheticRun, writeSyntheticRun, type SyntheticRun } from '../../unit/analysis/synthetic-run.ts';
import { VIEW_NAMES, viewChecks } from '../../unit/analysis/view-checks.ts';
import { docQueries } from '../../unit/analysis/doc-queries.ts';

const url = process.env.RLSTREAM_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const runId = `analysis-pg-${process.pid}-${Date.now().toString(36)}`;
let db: Database;
let run: SyntheticRun;
let tmp: string;

async function capture(cmd: (argv: string[], io: CommandIo) => Promise<number>, argv: string[]) {
  const out: string[] = [],
    err: string[] = [];
  const code = await cmd(argv, {
    out: (t) => {
      out.push(t);
    },
    err: (t) => {
      err.push(t);
    },
  });
  return { code, out: out.join(''), err: err.join('') };
}

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), 'rlstream-analysis-pg-'));
  db = await openDatabase({ kind: 'postgres', url });
  run = buildSyntheticRun(runId, 6, { replay: true });
  await writeSyntheticRun(createStore(db), run);
});

after(async () => {
  if (db) {
    await sql`delete from dead_letters where run_id = ${runId}`.execute(db.db);
    await sql`delete from runs where run_id = any(${[runId, `${runId}-replay`]}::text[])`.execute(db.db);
    await db.close();
  }
  rmSync(tmp, { recursive: true, force: true });
});

describe('views on PostgreSQL', () => {
  for (const name of VIEW_NAMES) test(name, () => viewChecks[name](db, run));
});

describe('read-only queries on PostgreSQL', () => {
  test('writes, DDL, sequences and early commits are refused; nothing changes', async () => {
    const count = async () =>
      (await queryObjects(db, 'select count(*) as n from step_metrics where run_id = $1', [runId]))[0].n;
    const before = await count();
    await assert.rejects(
      runReadOnlyQuery(db, `delete from step_metric_parts where run_id = '${runId}'`),
      /the query must only read: DELETE is refused/,
    );
    await assert.rejects(runReadOnlyQuery(db, 'create table analysis_evil (x int)'), /CREATE is refused/);
    await assert.rejects(
      runReadOnlyQuery(db, `commit; delete from step_metrics where run_id = '${runId}'`),
      /give one SQL statement per call/,
    );
    await assert.rejects(
      runReadOnlyQuery(db, 'select pg_sleep(5)', { timeoutS: 0.2 }),
      /the query was cancelled: .*statement timeout.*raise --timeout-s/,
    );
    assert.equal(await count(), before);
  });
});

describe('docs/queries.md on PostgreSQL', () => {
  // The database is shared, so only "runs and answers" is checked here; the exact answers are
  // checked on PGlite (test/unit/analysis/store-analysis.test.ts), where the store holds only the fixture.
  for (const q of docQueries()) {
    test(q.title, async () => {
      const res = await runReadOnlyQuery(db, q.sql);
      assert.ok(res.rows.length > 0, 'the query answers with rows');
    });
  }
});

describe('commands against a PostgreSQL URL', () => {
  test("rlstream sql prints the run's rows as JSON", async () => {
    const r = await capture(runSql, [
      await readerUrl(url),
      `select step, reward_mean from v_step_metrics_wide where run_id = '${runId}' and reward_mean is not null order by step`,
      '--json',
    ]);
    const rows = JSON.parse(r.out);
    assert.deepEqual(
      rows.map((x: any) => x.step),
      [1, 2, 3, 4, 5, 6],
    );
    const want = run.metrics.filter((m) => m.name === 'reward/mean').map((m) => m.value);
    rows.forEach((x: any, i: number) => assert.ok(Math.abs(x.reward_mean - want[i]) < 1e-12));
  });

  test('rlstream runs --db lists the run with its status and best validation score', async () => {
    const r = await capture(runRuns, ['--db', url, '--json']);
    const rows = JSON.parse(r.out);
    const mine = rows.find((x: any) => x.run_id === runId);
    assert.ok(mine, 'the run is listed');
    assert.equal(mine.status, 'finished');
    assert.equal(mine.steps, 6);
    assert.equal(mine.best_val_acc, 0.6);
    assert.equal(mine.best_val_step, 3);
    assert.equal(mine.checkpoints, 2);
    assert.equal(mine.dir, undefined, 'no dir column for a database listing');
    assert.equal(rows.find((x: any) => x.run_id === `${runId}-replay`).parent, runId);
  });

  test('rlstream report needs --run on a shared database, then writes the report and TensorBoard files', async () => {
    await assert.rejects(
      runReport([url], { out: () => {}, err: () => {} }),
      /holds \d+ runs; choose one with --run <run_id>/,
    );
    const out = join(tmp, 'report.html');
    const tb = join(tmp, 'tb');
    const r = await capture(runReport, [url, '--run', runId, '--out', out, '--tensorboard-dir', tb]);
    assert.equal(r.code, 0);
    const html = readFileSync(out, 'utf8');
    for (const p of REPORT_PLOTS) {
      const svg = new RegExp(`<svg[^>]*data-plot="${p.id}"[\\s\\S]*?</svg>`).exec(html)?.[0];
      assert.ok(svg && svg.includes('<path class="series"'), `plot ${p.id} has a line`);
    }
    assert.equal(readScalars(tb).length, run.metrics.length);
    assert.match(r.out, /tensorboard events written: .*\(\d+ scalars, \d+ tags\)/);
  });
});
