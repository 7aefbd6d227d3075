/**
 * Mistakes that used to give no clear answer: `trainer.run_dir` under /proc (Node's recursive
 * mkdir spun there forever, deaf to Ctrl-C and SIGTERM), a run directory on a read-only mount
 * (reported as "ENOENT … mkdir"), `rlstream export --out` under /proc (a raw ENOENT). Each now
 * ends at once, exit status 1, with one line naming the directory and the reason.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { execFileSync } from 'node:child_process';
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { mountUnavailable } from '../support/fault-mounts.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const tmp = join(ROOT, 'test/.tmp', `unclear-errors-${process.pid}`);
let mounted = false;
after(() => {
  if (mounted) execFileSync('umount', ['-l', join(tmp, 'ro')]);
  rmSync(tmp, { recursive: true, force: true });
});

function cli(args: string[]): { code: number | null; line: string; out: string } {
  const r = spawnSync(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), ...args], {
    cwd: ROOT,
    encoding: 'utf8',
    timeout: 90_000,
    killSignal: 'SIGKILL',
  });
  const out = `${r.stdout}${r.stderr}`;
  return { code: r.status, line: out.split('\n').find((l) => /^rlstream \w+: /.test(l)) ?? '', out };
}

test('trainer.run_dir under /proc: one line at once, not a hang', { timeout: 120_000 }, () => {
  const r = cli(['train', CONFIG, 'trainer.run_dir=/proc/x']);
  assert.equal(r.code, 1, r.out.slice(-2000));
  assert.match(r.line, /cannot create the run directory \(trainer\.run_dir\) \/proc\/x: .*\/proc/);
});

test('rlstream export --out under /proc: one line naming it', { timeout: 120_000 }, () => {
  const r = cli(['export', join(ROOT, 'test/e2e/fixtures'), '--out', '/proc/x']);
  assert.equal(r.code, 1, r.out.slice(-2000));
  assert.match(r.line, /cannot create the export directory \(--out\) \/proc\/x/);
});

test(
  'a run directory on a read-only mount: EROFS, not ENOENT',
  { skip: mountUnavailable() ?? false, timeout: 120_000 },
  () => {
    const ro = join(tmp, 'ro');
    mkdirSync(ro, { recursive: true });
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'ro,size=1m', 'tmpfs', ro]);
    mounted = true;
    const r = cli(['train', CONFIG, `trainer.run_dir=${join(ro, 'run')}`]);
    assert.equal(r.code, 1, r.out.slice(-2000));
    assert.match(r.line, /read-only file system \(EROFS\)/);
    assert.ok(r.line.includes(join(ro, 'run')), r.line);
    assert.doesNotMatch(r.line, /ENOENT/);
  },
);
