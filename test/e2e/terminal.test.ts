/**
 * `rlstream train` in a terminal and off one. On a TTY (a pseudo-terminal made by
 * util-linux `script`): one progress bar redrawn in place, only warnings and errors above it by
 * default (`--verbose` adds info), the resolved config written to <run_dir>/config.yaml and
 * printed only with --print-config, the summary on its own lines. Off a TTY: JSON log lines.
 * Ctrl-C: exit code 130 and nothing printed after the stop message.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const tmp = join(ROOT, 'test/.tmp', `terminal-${process.pid}`);
mkdirSync(tmp, { recursive: true });
after(() => rmSync(tmp, { recursive: true, force: true }));
const BIN = join(ROOT, 'bin/rlstream.mjs');
const TINY = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const hasScript = spawnSync('script', ['--version']).status === 0;
const quote = (s: string) => `'${s.replaceAll("'", "'\\''")}'`;
const CLEAR = '\r\x1b[2K';

/** Runs the CLI in a pseudo-terminal; returns everything it wrote (stdout and stderr share the terminal). */
function inTerminal(args: string[]): { status: number | null; out: string } {
  const cmd = ['node', BIN, ...args].map(quote).join(' ');
  const r = spawnSync('script', ['-qfec', cmd, '/dev/null'], {
    cwd: tmp,
    encoding: 'utf8',
    timeout: 120_000,
    env: { ...process.env, RLSTREAM_LOG_LEVEL: '', RLSTREAM_LOG_JSON: '' },
  });
  return { status: r.status, out: r.stdout.replaceAll('\r\n', '\n') };
}
const ESC = String.fromCharCode(27);
const plain = (s: string) => s.replace(new RegExp(`${ESC}\\[[0-9;]*m`, 'g'), '');

test(
  'on a TTY: the bar is redrawn in place, no info lines or config dump, the summary on its own lines',
  { skip: !hasScript && 'util-linux script is not installed', timeout: 150_000 },
  () => {
    const dir = join(tmp, 'tty');
    const { status, out } = inTerminal(['train', TINY, `trainer.run_dir=${dir}`, 'pipeline.run_id=tty-run']);
    assert.equal(status, 0, out);
    assert.doesNotMatch(out, /# resolved config/);
    assert.doesNotMatch(plain(out), /INFO/);
    const first = out.indexOf(`${CLEAR}step 0/3`),
      last = out.lastIndexOf(`${CLEAR}step 3/3`);
    assert.ok(first >= 0 && last > first, 'bar drawn from step 0 to 3');
    assert.ok(!out.slice(first, last).includes('\n'), 'every redraw overwrites the same line');
    assert.match(
      out.slice(last + CLEAR.length),
      /^step 3\/3 [^\n]*\nmetric +first +last/,
      'the summary starts on a new line after the bar',
    );
    const cfg = readFileSync(join(dir, 'config.yaml'), 'utf8');
    assert.match(cfg, /run_id: tty-run/);
    assert.match(cfg, /max_steps: 3/);
  },
);

test(
  'on a TTY with --verbose --print-config: info and warning lines above the bar, the config printed',
  { skip: !hasScript && 'util-linux script is not installed', timeout: 150_000 },
  () => {
    const dir = join(tmp, 'tty-verbose');
    const { status, out } = inTerminal([
      'train',
      TINY,
      `trainer.run_dir=${dir}`,
      'pipeline.run_id=tty-verbose',
      'trainer.max_steps=20',
      'data.task_size.train=12',
      '--verbose',
      '--print-config',
    ]);
    assert.equal(status, 0, out);
    assert.match(out, /# resolved config\n/);
    const text = plain(out);
    assert.match(text, /WARN: trainer\.max_steps = 20, but trainer\.total_epochs = 1 gives only 3 steps/);
    // each log line starts at the beginning of a line the bar was cleared from, and is one line
    const lines = [...text.matchAll(/\] (INFO|WARN): ([^\n]*)/g)];
    assert.ok(
      lines.some((m) => m[1] === 'INFO' && m[2]!.startsWith('step 1 trained')),
      'info lines with --verbose',
    );
    for (const m of text.matchAll(/\[\d\d:\d\d:\d\d\] (INFO|WARN)/g)) {
      const before = text.slice(Math.max(0, m.index! - CLEAR.length), m.index);
      assert.ok(
        before === CLEAR || before.endsWith('\n'),
        `log line at ${m.index} starts on a clear line: ${JSON.stringify(before)}`,
      );
    }
    assert.ok(existsSync(join(dir, 'config.yaml')));
  },
);

test(
  'off a TTY: JSON log lines; rlstream sql reads the live run; Ctrl-C exits 130 with the stop message as the last line',
  { timeout: 150_000 },
  async () => {
    const dir = join(tmp, 'pipe');
    const child = spawn(
      process.execPath,
      [
        BIN,
        'train',
        TINY,
        `trainer.run_dir=${dir}`,
        'pipeline.run_id=pipe-run',
        'trainer.max_steps=200',
        'data.task_size.train=1024',
      ],
      { cwd: tmp, env: { ...process.env, RLSTREAM_LOG_LEVEL: '' } },
    );
    let stderr = '',
      stdout = '',
      sent = false;
    let live: { status: number | null; stdout: string; stderr: string } | null = null;
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
      if (!sent && /"msg":"step 2 trained"/.test(stderr)) {
        sent = true;
        // the run holds its database: another process reads it through a snapshot
        live = spawnSync(
          process.execPath,
          [BIN, 'sql', dir, 'select status, (select count(*) from trajectories) > 0 as has_rows from runs', '--csv'],
          { encoding: 'utf8', timeout: 60_000 },
        );
        child.kill('SIGINT');
      }
    });
    const code = await new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
    assert.ok(sent, `the run reached step 2: ${stderr.slice(-2000)}`);
    const q = live as unknown as { status: number | null; stdout: string; stderr: string };
    assert.equal(q.status, 0, q.stderr);
    assert.equal(q.stdout, 'status,has_rows\r\nrunning,true\r\n');
    assert.match(q.stderr, /is in use by a live process \(PID \d+\): reading a snapshot taken now/);
    assert.equal(code, 130, stderr.slice(-2000));
    const lines = stderr.trimEnd().split('\n');
    const stopAt = lines.findIndex((l) => l.startsWith('rlstream train: run stopped: interrupted'));
    assert.equal(stopAt, lines.length - 1, `the stop message is the last line: ${lines.slice(-3).join('\n')}`);
    // the stop is said at once, in plain words like the final line; every other line is JSON
    const notice = (l: string) => l.startsWith('rlstream train: Ctrl-C: stopping the run');
    assert.ok(lines.some(notice), `the stop is said when Ctrl-C arrives: ${lines.slice(-3).join('\n')}`);
    for (const l of lines.slice(0, -1))
      if (!notice(l)) assert.doesNotThrow(() => JSON.parse(l), `a JSON log line: ${l}`);
    assert.doesNotMatch(stderr, /# resolved config|\r/);
    assert.match(stdout, /^metric +first/m, 'the summary on stdout');
  },
);
