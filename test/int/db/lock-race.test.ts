/**
 * The embedded database lock (lib/db/lock-file.ts) under races: many processes
 * calling acquireLock on the same directory at the same instant — on a fresh directory, over a
 * stale lock of a dead process, over an empty lock file an older version left — and exactly one
 * wins each time. A lock held on another host is never taken over without `breakLock`.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, utimesSync, writeFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir, hostname } from 'node:os';
import { acquireLock } from '../../../lib/db/lock-file.ts';

const root = mkdtempSync(join(tmpdir(), 'rlstream-lock-'));
after(() => rmSync(root, { recursive: true, force: true }));
const lockModule = new URL('../../../lib/db/lock-file.ts', import.meta.url).href;
const TAKERS = 8;

/** Starts TAKERS processes that all call acquireLock(dir) at time `at` (ms since epoch); each says won/lost and holds a won lock for a while. */
async function race(dir: string, at: number): Promise<{ won: number; lost: string[] }> {
  const code = `const { acquireLock } = await import(${JSON.stringify(lockModule)});
    while (Date.now() < ${at}) {}
    try { acquireLock(${JSON.stringify(dir)}); console.log('won'); setTimeout(() => {}, 1500); }
    catch (e) { console.log('lost ' + e.message); }`;
  const procs = Array.from({ length: TAKERS }, () =>
    spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], {
      stdio: ['ignore', 'pipe', 'inherit'],
    }),
  );
  const outs = await Promise.all(
    procs.map(
      (p) =>
        new Promise<string>((r) => {
          let o = '';
          p.stdout!.on('data', (d) => {
            o += d;
          });
          p.on('close', () => r(o.trim()));
        }),
    ),
  );
  return { won: outs.filter((o) => o === 'won').length, lost: outs.filter((o) => o.startsWith('lost')) };
}

function deadPid(): number {
  const r = spawnSync(process.execPath, ['-e', 'console.log(process.pid)'], { encoding: 'utf8' });
  return Number(r.stdout.trim());
}

test(
  "of many simultaneous takers exactly one wins: fresh directory, a dead holder's lock, an old empty lock file",
  { timeout: 120_000 },
  async () => {
    const scenarios: Array<[string, (dir: string) => void]> = [
      ['fresh', () => undefined],
      [
        'stale (dead PID, this host)',
        (dir) =>
          writeFileSync(
            join(dir, 'rlstream.lock'),
            JSON.stringify({ pid: deadPid(), host: hostname(), since: 'then' }),
          ),
      ],
      [
        'empty (old version)',
        (dir) => {
          const f = join(dir, 'rlstream.lock');
          writeFileSync(f, '');
          utimesSync(f, new Date(Date.now() - 60_000), new Date(Date.now() - 60_000));
        },
      ],
    ];
    for (const [name, setup] of scenarios) {
      for (let round = 0; round < 1; round++) {
        const dir = join(root, `${name.split(' ')[0]}-${round}`);
        mkdirSync(dir, { recursive: true });
        setup(dir);
        // start them all at one instant, after every process has loaded (≈1 s each on 2 cores)
        const { won, lost } = await race(dir, Date.now() + 4000);
        assert.equal(
          won,
          1,
          `${name}, round ${round}: exactly one taker wins (${won}); the others: ${lost.join(' | ')}`,
        );
        for (const l of lost) assert.match(l, /in use by another process \(PID \d+/, name);
        assert.deepEqual(
          readdirSync(dir).filter((f) => f !== 'rlstream.lock' && !f.startsWith('.rlstream')),
          [],
          'no break file left',
        );
      }
    }
  },
);

test('a lock held on another host is not stale without breakLock; with it, it is taken over', () => {
  const dir = join(root, 'otherhost');
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'rlstream.lock'), JSON.stringify({ pid: deadPid(), host: 'some-other-host', since: 'then' }));
  assert.throws(() => acquireLock(dir), /locked by PID \d+ on host some-other-host .*--break-lock/);
  const h = acquireLock(dir, 'embedded database', { breakLock: true });
  assert.throws(() => acquireLock(dir), /already open in this process/);
  h.release();
  assert.equal(existsSync(join(dir, 'rlstream.lock')), false);
});
