import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  cellText,
  formatResultCsv,
  formatResultJson,
  formatResultTable,
  uniqueColumnNames,
  type QueryResult,
} from '../../../lib/analysis/format.ts';
import { locateRun, isDatabaseUrl } from '../../../lib/analysis/target.ts';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const logprobs = Array.from({ length: 20 }, (_, i) => -0.1 * (i + 1));

const result: QueryResult = {
  command: 'SELECT',
  columns: [
    { name: 'step', typeId: 23 },
    { name: 'reward', typeId: 701 },
    { name: 'response', typeId: 25 },
    { name: 'behaviour_logprobs', typeId: 1021 },
    { name: 'details', typeId: 3802 },
    { name: 'payload', typeId: 17 },
    { name: 'filtered', typeId: 16 },
    { name: 'step', typeId: 23 },
  ],
  rows: [
    [
      1,
      0.123456789,
      'seven\nmaybe, "quoted"',
      logprobs,
      { accuracy: 1, nested: [1, 2] },
      Buffer.from([0xde, 0xad]),
      false,
      1,
    ],
    [12, null, 'x'.repeat(100), [], null, null, true, 2],
    [3, Number.NaN, '', [Number.NEGATIVE_INFINITY, 1.5], { loss: Number.NaN }, null, null, 3],
  ],
};

test('table mode aligns columns, right-aligns numbers, shortens arrays and long text', () => {
  const out = formatResultTable(result);
  const lines = out.split('\n');
  assert.equal(lines.length, 2 + 3);
  assert.match(lines[0], /^step\s+reward\s+response\s+behaviour_logprobs/);
  assert.match(lines[1], /^-+\s+-+/);
  // Numbers are right-aligned: " 1" under "step" width 4.
  assert.ok(lines[2].startsWith('   1  '), lines[2]);
  assert.ok(lines[3].startsWith('  12  '), lines[3]);
  // reward column: NULL shown as NULL, NaN as NaN, 4 decimals otherwise.
  assert.match(lines[2], /0\.1235/);
  assert.match(lines[3], /NULL/);
  assert.match(lines[4], /NaN/);
  // Newlines shown as ↵; the array cut after 8 elements with a count of the rest.
  assert.match(lines[2], /seven↵maybe, "quoted"/);
  assert.match(lines[2], /\[-0\.1, -0\.2, -0\.3, -0\.4, -0\.5, -0\.6, -0\.7, -0\.8, …\(\+12\)\]/);
  assert.match(lines[4], /\[-Infinity, 1\.5\]/);
  // Text longer than 60 characters is cut to 60 with an ellipsis.
  assert.match(lines[3], new RegExp(`${'x'.repeat(59)}…`));
  assert.doesNotMatch(lines[3], new RegExp('x'.repeat(60)));
  assert.match(lines[2], /\\xdead/);
  assert.match(lines[2], /\{"accuracy":1,"nested":\[1,2\]\}/);
  // --max-width 0 keeps everything.
  assert.match(formatResultTable(result, { maxWidth: 0 }), new RegExp('x'.repeat(100)));
  assert.equal(cellText(logprobs, { compact: true, maxArray: 2 }), '[-0.1, -0.2, …(+18)]');
});

test('CSV keeps full values, quotes what needs quoting, NULL as an empty field', () => {
  const csv = formatResultCsv(result);
  const lines = csv.split('\r\n');
  assert.equal(lines[0], 'step,reward,response,behaviour_logprobs,details,payload,filtered,step');
  assert.ok(lines[1].startsWith('1,0.123456789,"seven\nmaybe, ""quoted""",'), lines[1]);
  assert.ok(csv.includes(`"[${logprobs.join(',')}]"`), 'full array, JSON-like');
  assert.ok(csv.includes('"{""accuracy"":1,""nested"":[1,2]}"'));
  assert.ok(csv.includes(',\\xdead,false,1'));
  assert.ok(lines[2].startsWith(`12,,${'x'.repeat(100)},[],,,true,2`), lines[2]);
  assert.ok(csv.includes('3,NaN,,"[-Infinity,1.5]","{""loss"":""NaN""}",,,3'));
  assert.ok(csv.endsWith('\r\n'));
});

test('JSON: one object per row, repeated column names made unique, NaN/Infinity as strings', () => {
  const rows = JSON.parse(formatResultJson(result));
  assert.equal(rows.length, 3);
  assert.deepEqual(Object.keys(rows[0]), [
    'step',
    'reward',
    'response',
    'behaviour_logprobs',
    'details',
    'payload',
    'filtered',
    'step_2',
  ]);
  assert.equal(rows[0].reward, 0.123456789);
  assert.deepEqual(rows[0].behaviour_logprobs, logprobs);
  assert.deepEqual(rows[0].details, { accuracy: 1, nested: [1, 2] });
  assert.equal(rows[0].payload, '\\xdead');
  assert.equal(rows[1].reward, null);
  assert.equal(rows[2].reward, 'NaN');
  assert.deepEqual(rows[2].behaviour_logprobs, ['-Infinity', 1.5]);
  assert.deepEqual(rows[2].details, { loss: 'NaN' });
  assert.equal(formatResultJson({ ...result, rows: [] }), '[]\n');
  assert.deepEqual(
    uniqueColumnNames([
      { name: 'a', typeId: 0 },
      { name: 'a', typeId: 0 },
      { name: 'a_2', typeId: 0 },
    ]),
    ['a', 'a_3', 'a_2'],
  );
});

test('locating a run: URLs, run directories, pgdata itself, names under runs/, and clear errors', () => {
  const cwd = mkdtempSync(join(tmpdir(), 'rlstream-locate-'));
  try {
    assert.ok(isDatabaseUrl('postgres://u:secret@h/db'));
    const url = locateRun('postgresql://u:secret@h:5432/db');
    assert.equal(url.target.kind, 'postgres');
    assert.doesNotMatch(url.label, /secret/);
    const run = join(cwd, 'runs', 'number-game');
    mkdirSync(join(run, 'pgdata'), { recursive: true });
    writeFileSync(join(run, 'pgdata', 'PG_VERSION'), '17\n');
    assert.deepEqual(locateRun('runs/number-game', { cwd }).target, { kind: 'pglite', dir: run });
    assert.deepEqual(locateRun('number-game', { cwd }).target, { kind: 'pglite', dir: run });
    assert.deepEqual(locateRun(join(run, 'pgdata'), { cwd }).target, { kind: 'pglite', dir: run });
    assert.throws(
      () => locateRun('runs', { cwd }),
      /is not a run directory: it has no db\/pgdata\/ \(the embedded store a run writes\)/,
    );
    assert.throws(() => locateRun('nope', { cwd }), /no run directory at .*nope or .*runs\/nope; pass a run directory/);
  } finally {
    rmSync(cwd, { recursive: true, force: true });
  }
});
