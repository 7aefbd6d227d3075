/**
 * The issue's repro of two processes holding one embedded run (18.2): process A trains under
 * another hostname (`unshare --uts`), process B starts on the same run directory while A runs.
 * B must refuse, naming A's PID and host and `--break-lock`, instead of treating the lock as
 * stale and writing duplicate rows.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { killHard, sleep, spawnCli, type CliProc } from '../support/chaos-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const tmp = join(ROOT, 'test/.tmp', `lock-other-host-${process.pid}`);
const procs: CliProc[] = [];
after(async () => {
  for (const p of procs) await killHard(p);
  rmSync(tmp, { recursive: true, force: true });
});

const unshareMissing =
  process.getuid?.() !== 0 || spawnSync('unshare', ['--uts', 'true']).status !== 0
    ? 'needs root and unshare --uts'
    : false;

test(
  'a run held by a process on another host is refused, not taken over as stale',
  { skip: unshareMissing, timeout: 90_000 },
  async () => {
    const dir = join(tmp, 'run');
    const args = ['train', CONFIG, `trainer.run_dir=${dir}`, 'pipeline.run_id=otherhost', 'trainer.max_steps=200'];
    // A: `rlstream train` under the hostname "otherhost" (its own UTS namespace)
    const child = spawn(
      'unshare',
      [
        '--uts',
        'sh',
        '-c',
        `hostname otherhost && exec "${process.execPath}" "${join(ROOT, 'bin/rlstream.mjs')}" ${args.map((x) => `'${x}'`).join(' ')}`,
      ],
      { cwd: ROOT, stdio: 'ignore', env: { ...process.env, RLSTREAM_LOG_JSON: '1' } },
    );
    const lock = join(dir, 'db', 'rlstream.lock');
    try {
      for (let i = 0; i < 300 && !existsSync(lock); i++) await sleep(100);
      assert.ok(existsSync(lock), 'A took the lock');
      assert.equal(JSON.parse(readFileSync(lock, 'utf8')).host, 'otherhost');
      const b = spawnCli(args);
      procs.push(b);
      const ex = await b.exit;
      assert.equal(ex.code, 1, b.output().slice(-2000));
      const line =
        b
          .output()
          .split('\n')
          .find((l) => l.startsWith('rlstream train: ')) ?? '';
      // the lock names this machine's boot id, so a holder under another hostname but on the same
      // boot is known to be local and checked by PID (alive: refused); without a boot id it is
      // another host's, refused with --break-lock as the way out
      assert.match(
        line,
        /is (locked by PID \d+ on host otherhost .*--break-lock|in use by another process \(PID \d+)/,
        line,
      );
      assert.equal(child.exitCode, null, 'A is still running');
    } finally {
      child.kill('SIGKILL');
      await new Promise((r) => (child.exitCode !== null || child.signalCode !== null ? r(null) : child.on('exit', r)));
    }
  },
);
