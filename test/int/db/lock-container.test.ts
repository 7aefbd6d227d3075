/**
 * The embedded database lock (lib/db/lock-file.ts) across container restarts: a lock naming this
 * very PID that this process does not hold (a restarted container's PID 1 finds its predecessor's)
 * is stale; so is one taken before the machine last booted; one held from another PID namespace
 * (another container) is refused while its holder's heartbeat moves and taken over once the holder
 * is gone. The lock this process does hold is still refused a second time.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir, hostname } from 'node:os';
import { acquireLock } from '../../../lib/db/lock-file.ts';

const root = mkdtempSync(join(tmpdir(), 'rlstream-lockns-'));
after(() => rmSync(root, { recursive: true, force: true }));
const lockModule = new URL('../../../lib/db/lock-file.ts', import.meta.url).href;

function writeLock(dir: string, holder: Record<string, unknown>): void {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'rlstream.lock'), JSON.stringify({ host: hostname(), since: 'then', ...holder }));
}

test("a lock naming this process's PID that it does not hold is its predecessor's (PID 1 in a restarted container): taken over", () => {
  const dir = join(root, 'self');
  writeLock(dir, { pid: process.pid, nonce: 'predecessor' });
  const lock = acquireLock(dir);
  assert.notEqual(JSON.parse(readFileSync(lock.path, 'utf8')).nonce, 'predecessor');
  // the one it holds is still its own: a second open in this process is refused
  assert.throws(() => acquireLock(dir), /already open in this process/);
  lock.release();
});

test('a lock taken before this machine last booted is stale, even naming a live PID', () => {
  const dir = join(root, 'boot');
  writeLock(dir, { pid: process.ppid, nonce: 'old', boot: 'an-earlier-boot' });
  acquireLock(dir).release();
});

const unshare = spawnSync('unshare', ['-pf', '--mount-proc', 'true']).status === 0;
test(
  'a lock held from another PID namespace: refused while its holder lives, taken over when it is gone',
  { skip: unshare ? false : 'needs unshare -p (root)', timeout: 60_000 },
  async () => {
    const dir = join(root, 'ns');
    const code = `const { acquireLock } = await import(${JSON.stringify(lockModule)});
      acquireLock(${JSON.stringify(dir)}); console.log('held ' + process.pid); setInterval(() => {}, 1000);`;
    const child = spawn(
      'unshare',
      ['-pf', '--mount-proc', '--kill-child', process.execPath, '--import', 'tsx', '--input-type=module', '-e', code],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    after(() => {
      child.kill('SIGKILL');
    });
    const held = await new Promise<string>((r) => child.stdout!.once('data', (d) => r(String(d).trim())));
    assert.equal(held, 'held 1', 'the holder is PID 1 of its namespace');
    const holder = JSON.parse(readFileSync(join(dir, 'rlstream.lock'), 'utf8'));
    assert.equal(holder.pid, 1);
    assert.notEqual(holder.pidns, spawnSync('readlink', ['/proc/self/ns/pid'], { encoding: 'utf8' }).stdout.trim());
    assert.throws(() => acquireLock(dir, 'embedded database', { heartbeatStaleMs: 8000 }), /another PID namespace/);
    child.kill('SIGKILL');
    await new Promise((r) => child.once('close', r));
    const t0 = Date.now();
    const lock = acquireLock(dir, 'embedded database', { heartbeatStaleMs: 8000 });
    assert.ok(Date.now() - t0 < 20_000);
    assert.equal(JSON.parse(readFileSync(lock.path, 'utf8')).pid, process.pid);
    lock.release();
  },
);
