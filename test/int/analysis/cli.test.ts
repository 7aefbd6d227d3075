/**
 * `rlstream sql`, `rlstream runs` and `rlstream report` end to end on embedded run directories:
 * a synthetic run is written through the store port into runs/number-game/pgdata, the store is
 * closed, and each command opens the run directory itself (taking its lock), as a user would.
 * A second run directory is held by another live process: it must be reported, not opened.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import {
  existsSync,
  linkSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { once } from 'node:events';
import { openDatabase } from '../../../lib/db/database.ts';
import { sql } from 'kysely';
import { directoryBytes } from '../../../lib/analysis/runs.ts';
import { createStore } from '../../../lib/store/index.ts';
import { runSql, sqlCommand, type CommandIo } from '../../../app/cli/commands/sql.ts';
import { runRuns, runsCommand } from '../../../app/cli/commands/runs.ts';
import { runReport, reportCommand } from '../../../app/cli/commands/report.ts';
import { REPORT_PLOTS } from '../../../lib/analysis/report.ts';
import { readScalars } from '../../../lib/analysis/tensorboard.ts';
import { buildSyntheticRun, writeSyntheticRun, type SyntheticRun } from '../../unit/analysis/synthetic-run.ts';

let root: string;
let runDir: string;
let lockedDir: string;
let holder: ChildProcess | undefined;
let run: SyntheticRun;
const cwd0 = process.cwd();

type Runner = (argv: string[], io: CommandIo) => Promise<number>;

/** Runs a command with its output collected. */
async function capture(cmd: Runner, argv: string[]): Promise<{ code: number; out: string; err: string }> {
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
  root = mkdtempSync(join(tmpdir(), 'rlstream-cli-'));
  runDir = join(root, 'runs', 'number-game');
  const database = await openDatabase({ kind: 'pglite', dir: runDir });
  run = buildSyntheticRun('number-game-cli', 6);
  try {
    await writeSyntheticRun(createStore(database), run);
    // two stored versions in the run's policy-store manifest: 2.5 MB + 1.5 MB
    for (const [version, size] of [
      [0, 2_500_000],
      [6, 1_500_000],
    ])
      await sql`insert into policy_files (run_id, kind, version, name, size_bytes, sha256, chunks) values (${run.runId}, 'policy', ${version}, 'model.safetensors', ${size}, ${'0'.repeat(64)}, 0)`.execute(
        database.db,
      );
  } finally {
    await database.close();
  }
  mkdirSync(join(root, 'runs', 'not-a-run'), { recursive: true });
  // A run directory whose lock is held by another live process (a training run).
  lockedDir = join(root, 'runs', 'training-now');
  mkdirSync(join(lockedDir, 'pgdata'), { recursive: true });
  writeFileSync(join(lockedDir, 'pgdata', 'PG_VERSION'), '17\n');
  const lockModule = new URL('../../../lib/db/lock-file.ts', import.meta.url).href;
  holder = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      '--input-type=module',
      '-e',
      `const { acquireLock } = await import(${JSON.stringify(lockModule)}); acquireLock(${JSON.stringify(lockedDir)}); console.log('held'); setInterval(() => {}, 1000);`,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const [line] = await once(holder.stdout!, 'data');
  assert.equal(String(line).trim(), 'held');
  process.chdir(root);
});

after(() => {
  process.chdir(cwd0);
  if (holder?.pid && holder.exitCode === null) holder.kill('SIGTERM');
  rmSync(root, { recursive: true, force: true });
});

describe('rlstream sql', () => {
  test('prints an aligned table, by run directory or by run name under runs/', async () => {
    const r = await capture(runSql, [
      'runs/number-game',
      'select step, reward_mean, kl_mean from v_step_metrics_wide where reward_mean is not null order by step',
    ]);
    assert.equal(r.code, 0);
    const lines = r.out.trimEnd().split('\n');
    assert.match(lines[0], /^step\s+reward_mean\s+kl_mean$/);
    assert.equal(lines.length, 2 + run.steps + 1);
    assert.equal(lines.at(-1), `(${run.steps} rows)`);
    const byName = await capture(runSql, ['number-game', 'select count(*) as n from trajectories']);
    assert.match(byName.out, new RegExp(`\\b${run.trajectories.length}\\b`));
  });

  test('--json and --csv carry full arrays', async () => {
    const q = 'select id, behaviour_logprobs from trajectories where response_length = 11 order by id limit 1';
    const j = await capture(runSql, [runDir, q, '--json']);
    const rows = JSON.parse(j.out);
    assert.equal(rows.length, 1);
    assert.equal(rows[0].behaviour_logprobs.length, 11);
    const c = await capture(runSql, [runDir, q, '--csv']);
    const [header, line] = c.out.split('\r\n');
    assert.equal(header, 'id,behaviour_logprobs');
    assert.equal(JSON.parse(line.slice(line.indexOf(',"[') + 2, -1)).length, 11);
    const t = await capture(runSql, [runDir, q]);
    assert.match(t.out, /…\(\+3\)\]/);
  });

  test('shows dead letters; --views lists the views', async () => {
    const r = await capture(runSql, [
      runDir,
      'select stage, source_topic, source_offset, reason from v_dead_letters order by source_offset',
    ]);
    assert.match(r.out, /reward\s+number-game-cli\.rollouts\s+17\s+undecodable Avro message/);
    assert.match(r.out, /advantage\s+number-game-cli\.scored\s+42\s+unknown schema id 99/);
    const v = await capture(runSql, [runDir, '--views']);
    for (const name of ['v_step_metrics_wide', 'v_dead_letters', 'v_checkpoint_lineage', 'v_runs'])
      assert.match(v.out, new RegExp(name));
  });

  test('an INSERT fails with a clear message and writes nothing', async () => {
    await assert.rejects(
      sqlCommand.run([runDir, "insert into runs (run_id, project, experiment) values ('x', 'p', 'e')"]),
      /the query must only read: INSERT is refused/,
    );
    const r = await capture(runSql, [runDir, 'select run_id from runs', '--json']);
    assert.deepEqual(JSON.parse(r.out), [{ run_id: run.runId }]);
    // The run directory's lock was released after every command.
    assert.equal(existsSync(join(runDir, 'rlstream.lock')), false);
  });

  test('usage errors and a locked run directory', async () => {
    for (const c of [sqlCommand, runsCommand, reportCommand])
      assert.ok(c.usage.startsWith(`rlstream ${c.name} `) && c.help.length > 0, c.name);
    await assert.rejects(sqlCommand.run([runDir]), /give the query as one quoted argument/);
    await assert.rejects(sqlCommand.run([runDir, 'select', '1']), /quote the whole query/);
    await assert.rejects(sqlCommand.run([runDir, 'select 1', '--csv', '--json']), /choose one of --csv and --json/);
    await assert.rejects(
      sqlCommand.run([join(root, 'runs', 'not-a-run'), 'select 1']),
      /is not a run directory: it has no db\/pgdata\/ \(the embedded store a run writes\)/,
    );
    await assert.rejects(
      sqlCommand.run([lockedDir, 'select 1']),
      new RegExp(`in use by another process \\(PID ${holder!.pid}`),
    );
  });
});

describe('rlstream runs', () => {
  test('lists each run directory with status, steps and best validation score; a locked one as in use', async () => {
    const r = await capture(runRuns, ['--runs-dir', 'runs']);
    assert.equal(r.code, 0);
    const lines = r.out.trimEnd().split('\n');
    assert.match(
      lines[0],
      /^dir\s+run_id\s+status\s+steps\s+last_step\s+final_reward\s+best_val_acc\s+best_val_step\s+checkpoints/,
    );
    const ng = lines.find((l) => l.startsWith('number-game '))!;
    assert.match(ng, /number-game-cli\s+finished\s+6\s+6\s+\S+\s+0\.6000\s+3\s+2\s+96\s+2/);
    const busy = lines.find((l) => l.startsWith('training-now '))!;
    assert.match(busy, new RegExp(`in use \\(PID ${holder!.pid}\\)`));
    assert.ok(!lines.some((l) => l.startsWith('not-a-run')));
    assert.match(r.err, /training-now: .*in use by another process/);
    const j = await capture(runRuns, ['--json']);
    const rows = JSON.parse(j.out);
    assert.deepEqual(
      rows.map((x: any) => x.dir),
      ['number-game', 'training-now'],
    );
    assert.equal(rows[0].best_val_acc, 0.6);
    assert.equal(rows[0].versions_mb, 4, 'the versions its policy store records');
    assert.ok(rows[0].disk_mb > 0, 'the run directory');
    // a checkpoint's hard link to a version's file is counted once
    const before = directoryBytes(runDir);
    mkdirSync(join(runDir, 'policy', 'v000001'), { recursive: true });
    writeFileSync(join(runDir, 'policy', 'v000001', 'model.safetensors'), Buffer.alloc(300_000));
    mkdirSync(join(runDir, 'checkpoints', 'global_step_1', 'actor'), { recursive: true });
    linkSync(
      join(runDir, 'policy', 'v000001', 'model.safetensors'),
      join(runDir, 'checkpoints', 'global_step_1', 'actor', 'model.safetensors'),
    );
    assert.equal(directoryBytes(runDir) - before, 300_000);
    await assert.rejects(runsCommand.run(['--runs-dir', 'nowhere']), /no runs directory at .*nowhere/);
    await assert.rejects(runsCommand.run(['--db', 'runs']), /--db needs a postgres:\/\/ URL/);
  });
});

describe('rlstream report', () => {
  test('writes report.html into the run directory with every plot, and TensorBoard events', async () => {
    const r = await capture(runReport, ['runs/number-game', '--tensorboard']);
    assert.equal(r.code, 0);
    const file = join(runDir, 'report.html');
    assert.match(r.out, new RegExp(`report written: ${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}\\n`));
    const html = readFileSync(file, 'utf8');
    for (const p of REPORT_PLOTS) {
      const svg = new RegExp(`<svg[^>]*data-plot="${p.id}"[\\s\\S]*?</svg>`).exec(html)?.[0];
      assert.ok(svg, `plot ${p.id}`);
      assert.match(
        svg,
        /<path class="series" data-series="[^"]+" d="M[\d.]+ [\d.]+( L[\d.]+ [\d.]+)+"/,
        `plot ${p.id} has a line`,
      );
    }
    assert.match(html, /best validation accuracy<\/td><td>0\.6000 at step 3/);
    const tb = join(runDir, 'tensorboard');
    const files = readdirSync(tb);
    assert.equal(files.length, 1);
    assert.match(files[0], /^events\.out\.tfevents\.\d+\.rlstream-export\.number-game-cli$/);
    assert.equal(readScalars(tb).length, run.metrics.length);
    const other = join(root, 'elsewhere', 'r.html');
    await capture(runReport, [runDir, '--out', other, '--run', run.runId]);
    assert.ok(readFileSync(other, 'utf8').includes('data-plot="step_time"'));
    await assert.rejects(reportCommand.run([runDir, '--run', 'nope']), /run "nope" is not in embedded database/);
  });
});
