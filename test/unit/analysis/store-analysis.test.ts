/**
 * The analysis layer against a real embedded store (PGlite, one per file): a synthetic run is
 * written through the store port, then every view, the read-only query runner, the example
 * queries of docs/queries.md, the report and the TensorBoard export are checked against it.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import { createStore } from '../../../lib/store/index.ts';
import { describeRelations, queryObjects, resolveRunId, runReadOnlyQuery } from '../../../lib/analysis/query.ts';
import { formatResultTable } from '../../../lib/analysis/format.ts';
import { REPORT_PLOTS, loadReportData, plotSeries, renderReport, summaryRows } from '../../../lib/analysis/report.ts';
import { exportRunToTensorBoard, readEventFile, readScalars } from '../../../lib/analysis/tensorboard.ts';
import { buildSyntheticRun, writeSyntheticRun, NEVER_SOLVED, STAGES, type SyntheticRun } from './synthetic-run.ts';
import { VIEW_NAMES, viewChecks } from './view-checks.ts';
import { docQueries } from './doc-queries.ts';

let dir: string;
let db: Database;
let run: SyntheticRun;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rlstream-analysis-'));
  db = await openDatabase({ kind: 'pglite', dir });
  run = buildSyntheticRun('analysis-unit', 6, { replay: true });
  await writeSyntheticRun(createStore(db), run);
});

after(async () => {
  await db?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('views', () => {
  for (const name of VIEW_NAMES) test(name, () => viewChecks[name](db, run));

  test('--views lists every analysis view with its columns', async () => {
    const res = await describeRelations(db);
    const rows = res.rows.map((r) => ({ relation: r[0] as string, kind: r[1] as string, columns: r[2] as string }));
    for (const v of VIEW_NAMES)
      assert.ok(
        rows.some((r) => r.relation === v && r.kind === 'view'),
        `${v} listed`,
      );
    assert.match(rows.find((r) => r.relation === 'v_dead_letters')!.columns, /source_offset/);
    assert.ok(rows.some((r) => r.relation === 'trajectories' && r.kind === 'table'));
  });
});

describe('read-only queries', () => {
  const counts = () =>
    queryObjects(
      db,
      'select (select count(*) from runs) as runs, (select count(*) from trajectories) as t, (select count(*) from step_metrics) as m',
    );

  test('writes are refused with a clear message and change nothing', async () => {
    const before = await counts();
    await assert.rejects(
      runReadOnlyQuery(db, "insert into runs (run_id, project, experiment) values ('evil', 'p', 'e')"),
      (e: any) => e.code === 'ERR_READ_ONLY' && /the query must only read: INSERT is refused/.test(e.message),
    );
    await assert.rejects(runReadOnlyQuery(db, 'delete from step_metric_parts'), /DELETE is refused/);
    await assert.rejects(runReadOnlyQuery(db, "update runs set status = 'failed'"), /UPDATE is refused/);
    await assert.rejects(runReadOnlyQuery(db, 'create table evil (x int)'), /CREATE is refused/);
    await assert.rejects(runReadOnlyQuery(db, 'drop view v_runs'), /DROP is refused/);
    // Ending the transaction early inside one call is impossible: one statement only.
    await assert.rejects(
      runReadOnlyQuery(db, "commit; insert into runs (run_id, project, experiment) values ('evil', 'p', 'e')"),
      /give one SQL statement per call/,
    );
    await assert.rejects(runReadOnlyQuery(db, 'select 1; select 2'), /one SQL statement/);
    assert.deepEqual(await counts(), before);
    assert.equal(
      (await queryObjects(db, "select status from runs where run_id = 'analysis-unit'"))[0].status,
      'completed',
    );
  });

  test('errors say what to fix', async () => {
    await assert.rejects(runReadOnlyQuery(db, 'selec 1'), /syntax error at character 1/);
    await assert.rejects(
      runReadOnlyQuery(db, 'select * from v_nothing'),
      /relation "v_nothing" does not exist.*the analysis views are v_step_metrics_wide/,
    );
    await assert.rejects(runReadOnlyQuery(db, '  '), /the query is empty/);
    await assert.rejects(
      runReadOnlyQuery(db, 'select no_such_column from runs'),
      /column "no_such_column" does not exist.*SQLSTATE 42703/,
    );
    // The connection is usable after a failed query.
    assert.equal((await runReadOnlyQuery(db, 'select 41 + 1 as answer')).rows[0][0], 42);
  });

  test('rows keep their types: real[] arrays, jsonb, timestamps as server text, int8 as numbers', async () => {
    const res = await runReadOnlyQuery(
      db,
      `select id, behaviour_logprobs, reward_details, created_at, count(*) over () as n
      from trajectories where run_id = $1 and response_length = 11 order by id limit 1`,
      { params: [run.runId] },
    );
    const [id, lp, details, created, n] = res.rows[0] as [string, number[], object, string, number];
    const t = run.trajectories.find((x) => x.id === id)!;
    // real comes back as PostgreSQL's shortest float4 text (-0.45), which is the stored float32 exactly.
    assert.deepEqual(lp.map(Math.fround), Array.from(t.behaviourLogprobs));
    assert.ok(
      lp.some((x) => x !== Math.fround(x)),
      'printed as the short decimal, not the float32 expansion',
    );
    assert.deepEqual(details, t.rewardDetails);
    assert.match(created, /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?[+-]\d\d/);
    assert.equal(typeof n, 'number');
    const table = formatResultTable(res);
    assert.match(table, /…\(\+3\)\]/, 'an 11-token array is cut after 8 in table mode');
  });

  test('the run of a store: the only one, or the one asked for', async () => {
    await assert.rejects(resolveRunId(db), /holds 2 runs; choose one with --run <run_id>: .*analysis-unit/);
    assert.equal(await resolveRunId(db, run.replayRunId), run.replayRunId);
    await assert.rejects(resolveRunId(db, 'nope'), /run "nope" is not in .*runs there: /);
  });
});

describe('docs/queries.md', () => {
  const queries = docQueries();
  test('has 6 to 10 example queries, each a shell-safe rlstream sql command', () => {
    assert.ok(queries.length >= 6 && queries.length <= 10, `${queries.length} queries`);
    for (const q of queries) {
      assert.equal(q.target, 'runs/number-game', q.title);
      assert.doesNotMatch(q.sql, /[$`"\\]/, `${q.title}: the query must survive double quotes in a shell`);
    }
  });

  const answers: Record<string, (rows: Array<Record<string, any>>) => void> = {
    'Did reward rise while KL stayed bounded?': (rows) => {
      assert.deepEqual(
        rows.map((r) => r.quarter),
        [1, 2, 3, 4],
      );
      assert.ok(rows.every((r) => r.max_kl < 0.05));
    },
    'Which prompts never got solved?': (rows) =>
      assert.deepEqual(
        rows.map((r) => r.prompt),
        [NEVER_SOLVED],
      ),
    'Which steps had the longest responses?': (rows) => {
      assert.ok(rows.length > 0 && rows.length <= 5);
      for (let i = 1; i < rows.length; i++) assert.ok(rows[i - 1].p90_len >= rows[i].p90_len);
    },
    'How stale were the trajectories?': (rows) => assert.equal(rows.length, run.steps),
    'What failed in the reward stage?': (rows) =>
      assert.deepEqual(rows.map((r) => [r.source, r.failure]).sort(), [
        ['trajectory', 'reward function threw'],
        ['val_generation', 'reward server timeout after 3 attempts'],
      ]),
    'Which groups did the online filter drop, and why?': (rows) =>
      assert.deepEqual(
        rows.map((r) => r.filter_reason),
        ['dapo: all rewards equal (std = 0)'],
      ),
    'Where did the time go?': (rows) => {
      const phases = rows.map((r) => `${r.stage}/${r.phase}`).sort();
      assert.deepEqual(
        phases,
        [
          ...STAGES.flatMap((s) => [`${s}/compute_s`, `${s}/wait_s`]),
          'rollout/generate_s',
          'update/checkpoint_s',
        ].sort(),
      );
      for (let i = 1; i < rows.length; i++) assert.ok(rows[i - 1].total_s >= rows[i].total_s, 'largest total first');
    },
    'Does the logged KL agree with the stored log-probs?': (rows) => {
      assert.equal(rows.length, run.steps);
      for (const r of rows)
        assert.ok(Math.abs(r.kl_k1_from_logprobs - 0.02) < 1e-6, `k1 ≈ 0.02, got ${r.kl_k1_from_logprobs}`);
    },
    'What went to the dead-letter topic?': (rows) =>
      assert.deepEqual(rows.map((r) => r.source_offset).sort(), [17, 42]),
    'Is a replay bit-for-bit identical to its parent?': (rows) => {
      const rep = rows.filter((r) => r.run_id === run.replayRunId);
      assert.deepEqual(
        rep.map((r) => r.matches_parent),
        [true, false],
      );
    },
  };

  for (const q of queries) {
    test(q.title, async () => {
      const rows = await queryObjects(db, q.sql);
      assert.ok(rows.length > 0, 'the query answers with rows on a populated store');
      const check = answers[q.title];
      assert.ok(check, `no expected answer recorded for "${q.title}" in this test`);
      check(rows);
    });
  }
});

describe('report and TensorBoard export', () => {
  test('the report has every plot with its series, and the summary numbers', async () => {
    const data = await loadReportData(db, run.runId);
    const html = renderReport(data, { generatedAt: new Date('2026-11-21T12:00:00Z') });
    assert.match(html, /^<!DOCTYPE html>/);
    assert.doesNotMatch(
      html,
      /<script|https?:\/\/(?!www\.w3\.org\/2000\/svg)/,
      'self-contained: no scripts, nothing fetched',
    );
    for (const p of REPORT_PLOTS) {
      const svg = new RegExp(`<svg[^>]*data-plot="${p.id}"[\\s\\S]*?</svg>`).exec(html)?.[0];
      assert.ok(svg, `plot ${p.id} present`);
      assert.ok(/<path class="series"/.test(svg), `plot ${p.id} has a line`);
      assert.doesNotMatch(svg, /no data logged/);
    }
    assert.deepEqual(
      plotSeries(data, 'step_time').map((s) => s.name),
      [...STAGES],
    );
    assert.deepEqual(
      plotSeries(data, 'reward').map((s) => s.name),
      ['reward/mean', 'reward/max', 'reward/min'],
    );
    assert.equal(plotSeries(data, 'reward')[0].points.length, run.steps);
    const summary = Object.fromEntries(summaryRows(data));
    assert.equal(summary.status, 'finished');
    assert.equal(summary['steps (last step)'], '6 (6)');
    assert.equal(summary['best validation accuracy'], '0.6000 at step 3');
    assert.equal(summary['final validation accuracy'], '0.5000 at step 6');
    assert.match(summary.checkpoints, /^2 \(latest: step 6, policy v6, sha256 [0-9a-f]{12}…\)$/);
    assert.equal(summary['dead letters'], '2');
    assert.equal(summary['reward failures'], '2');
    assert.match(html, /reward function threw: division by zero/);
    assert.match(html, /undecodable Avro message/);
    assert.match(html, /2026-11-21T12:00:00.000Z/);
  });

  test('the replay report shows the checkpoint comparison with its parent', async () => {
    const html = renderReport(await loadReportData(db, run.replayRunId!));
    assert.match(html, /parent run \(replay\/fork\)<\/td><td>analysis-unit</);
    assert.match(html, /<td>yes<\/td>/);
    assert.match(html, /<td>NO<\/td>/);
    assert.equal(
      (html.match(/no data logged/g) ?? []).length,
      REPORT_PLOTS.length,
      'a run without metrics says so in every plot',
    );
  });

  test('every step metric goes to the TensorBoard event file; re-export replaces it', async () => {
    const tb = join(dir, 'tensorboard');
    const first = await exportRunToTensorBoard(db.db, run.runId, tb);
    assert.equal(first.scalars, run.metrics.length);
    assert.deepEqual(first.tags, [...new Set(run.metrics.map((m) => m.name))].sort());
    const second = await exportRunToTensorBoard(db.db, run.runId, tb);
    assert.equal(second.path, first.path);
    assert.equal(readEventFile(first.path).events[0].fileVersion, 'brain.Event:2');
    const scalars = readScalars(tb);
    assert.equal(scalars.length, run.metrics.length, 'one file, no duplicates after re-export');
    const key = (tag: string, step: number) => `${tag}@${step}`;
    const got = new Map(scalars.map((s) => [key(s.tag, s.step), s.value]));
    for (const m of run.metrics) {
      const v = got.get(key(m.name, m.step));
      if (Number.isNaN(m.value)) assert.ok(Number.isNaN(v));
      else assert.equal(v, Math.fround(m.value), key(m.name, m.step));
    }
    assert.ok(
      scalars.every((s) => s.wallTime > 1.7e9),
      'wall time is when the metric was written',
    );
    await assert.rejects(exportRunToTensorBoard(db.db, 'nope', tb), /run "nope" is not in this database/);
    assert.ok(readFileSync(first.path).length > 0);
  });
});
