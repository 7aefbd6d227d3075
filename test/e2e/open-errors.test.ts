/**
 * Faults while opening a run's embedded database get one line naming the path and what to do
 *, not "[object Object]", "Aborted(). Build with -sASSERTIONS…" or "could not take
 * the lock": a disk too small for the database, a missing pg_control, a read-only run directory
 * holding a stale lock.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { hostname } from 'node:os';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { spawnCli } from '../support/chaos-procs.ts';
import { mountUnavailable, tinyDisk, type TinyDisk } from '../support/fault-mounts.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const tmp = join(ROOT, 'test/.tmp', `open-errors-${process.pid}`);
const unmounts: Array<() => void> = [];
after(() => {
  for (const u of unmounts.reverse()) {
    try {
      u();
    } catch {
      /* already gone */
    }
  }
  rmSync(tmp, { recursive: true, force: true });
});

async function trainLine(dir: string, extra: string[] = []): Promise<string> {
  const p = spawnCli([
    'train',
    CONFIG,
    `trainer.run_dir=${dir}`,
    'pipeline.run_id=openerr',
    'trainer.max_steps=2',
    ...extra,
  ]);
  const ex = await p.exit;
  assert.equal(ex.code, 1, p.output().slice(-2000));
  const lines = p
    .output()
    .split('\n')
    .filter((l) => l.startsWith('rlstream train: '));
  assert.equal(lines.length, 1, p.output().slice(-2000));
  assert.doesNotMatch(p.output(), /\[object Object\]|-sASSERTIONS|^\s+at /m);
  return lines[0];
}

test(
  'a disk too small for the database: ENOSPC with the path',
  { skip: mountUnavailable() ?? false, timeout: 60_000 },
  async () => {
    const disk: TinyDisk = tinyDisk(join(tmp, 'small'), '2m');
    unmounts.push(() => disk.unmount());
    const line = await trainLine(join(disk.dir, 'run'));
    assert.match(line, /cannot write .*small\/run\/db\/pgdata: no space left on device \(ENOSPC\)/);
  },
);

test(
  'a missing pg_control: the database is named damaged, with how to continue from a checkpoint',
  { timeout: 120_000 },
  async () => {
    const dir = join(tmp, 'damaged');
    const ok = spawnCli([
      'train',
      CONFIG,
      `trainer.run_dir=${dir}`,
      'pipeline.run_id=openerr',
      'trainer.max_steps=2',
      'trainer.save_freq=1',
    ]);
    assert.equal((await ok.exit).code, 0, ok.output().slice(-2000));
    rmSync(join(dir, 'db/pgdata/global/pg_control'));
    const line = await trainLine(dir);
    assert.match(
      line,
      /the embedded database .*damaged\/db\/pgdata cannot be opened: its files are damaged or incomplete/,
    );
    assert.match(line, /trainer\.load_checkpoint_path=/);
  },
);

test(
  'a read-only run directory with a stale lock: EROFS with the path',
  { skip: mountUnavailable() ?? false, timeout: 60_000 },
  async () => {
    const dir = join(tmp, 'ro');
    mkdirSync(join(dir, 'db'), { recursive: true });
    writeFileSync(join(dir, 'db', 'rlstream.lock'), JSON.stringify({ pid: 999999, host: hostname(), since: 'then' }));
    execFileSync('mount', ['--bind', dir, dir]);
    unmounts.push(() => execFileSync('umount', [dir]));
    execFileSync('mount', ['-o', 'remount,ro,bind', dir]);
    const line = await trainLine(dir);
    assert.match(line, /read-only file system \(EROFS\)/);
    assert.ok(line.includes(dir), line);
  },
);

test('a truncated table file: named damaged with the file, not a stack trace', { timeout: 120_000 }, async () => {
  const dir = join(tmp, 'truncated');
  const ok = spawnCli(['train', CONFIG, `trainer.run_dir=${dir}`, 'pipeline.run_id=openerr', 'trainer.max_steps=1']);
  assert.equal((await ok.exit).code, 0, ok.output().slice(-2000));
  truncateSync(join(dir, 'db/pgdata/base/5/1255'), 8192); // pg_proc, read when the database is opened
  const line = await trainLine(dir);
  assert.match(
    line,
    /the embedded database .*truncated\/db\/pgdata cannot be opened: its files are damaged or incomplete \(could not read block.*base\/5\/1255/,
  );
});
