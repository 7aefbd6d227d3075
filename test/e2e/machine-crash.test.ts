/**
 * A machine crash under the embedded database (a power loss, a kernel crash, ext4 going read-only
 * after an I/O error): the run directory is an ext4 file system on a loop device; the run stops
 * itself right after a batch of its embedded log committed (RLSTREAM_CRASH_AT=bus:committed@n
 * with RLSTREAM_CRASH_STOP=1), the file system is aborted under it (`mount -o remount,abort`:
 * whatever is not on the disk yet is lost), the process is killed and the file system mounted
 * again (journal replayed, page cache gone). Every time, the database opens and holds the commit
 * that was reported (what PostgreSQL promises), and the same command, run again, continues; after
 * a crash at every `EVERY`-th commit of each restart (controller, rollout, reward, advantage and
 * update batches, checkpoints among them) the run ends with the undisturbed run's checkpoint
 * sha256 and one trajectory row per sample.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, rmSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { spawnCli, killHard, type CliProc } from '../support/chaos-procs.ts';
import { loopDisk, loopUnavailable, type LoopDisk } from '../support/fault-mounts.ts';
import { openStore } from '../../lib/store/index.ts';
import { createPglite } from '../../lib/db/pglite-durable.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'machinecrash';
const EVERY = 4;
const tmp = join(ROOT, 'test/.tmp', `machine-crash-${process.pid}`);
const disks: LoopDisk[] = [];
const procs: CliProc[] = [];
after(async () => {
  for (const p of procs) await killHard(p);
  for (const d of disks) d.unmount();
  rmSync(tmp, { recursive: true, force: true });
});

const args = (dir: string) => [
  'train',
  CONFIG,
  `trainer.run_dir=${dir}`,
  `pipeline.run_id=${RUN_ID}`,
  'trainer.max_steps=2',
  'trainer.save_freq=1',
];

async function finalState(dir: string) {
  const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
  try {
    const cks = await store.listCheckpoints(RUN_ID);
    return { sha: cks.at(-1)?.sha256, step: cks.at(-1)?.step, rows: await store.countTrajectories(RUN_ID) };
  } finally {
    await store.close();
  }
}

const stopped = (pid: number) => {
  try {
    return / T /.test(readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^\d+ \(.*\)/, ''));
  } catch {
    return false;
  }
};

test(
  'a machine crash right after commits: the embedded database reopens holding each commit, and the run ends with the undisturbed sha256',
  { skip: loopUnavailable() ?? false, timeout: 600_000 },
  async () => {
    mkdirSync(tmp, { recursive: true });
    const ref = join(tmp, 'ref');
    const r0 = spawnCli(args(ref));
    procs.push(r0);
    assert.equal((await r0.exit).code, 0, r0.output().slice(-3000));
    const want = await finalState(ref);
    assert.equal(want.step, 2);

    const disk = loopDisk(join(tmp, 'mnt'), join(tmp, 'disk.img'), 160);
    disks.push(disk);
    const dir = join(disk.dir, 'run');
    const crashes: string[] = [];
    for (let restart = 0; ; restart++) {
      assert.ok(restart < 30, `the run did not finish after ${restart} restarts: ${crashes.join('; ')}`);
      const p = spawnCli(args(dir), { RLSTREAM_CRASH_AT: `bus:committed@${EVERY}`, RLSTREAM_CRASH_STOP: '1' });
      procs.push(p);
      const crashed = await p.waitFor(/SIGSTOP at bus:committed@\d+ .*\n/, 300_000);
      if (!crashed) {
        const ex = await p.exit;
        assert.equal(ex.code, 0, `restart ${restart} failed:\n${p.output().slice(-3000)}`);
        break;
      }
      const at = /SIGSTOP at bus:committed@\d+ (\S+) (\S+)\[(\d+)\]@(\d+)/.exec(p.output())!;
      while (!stopped(p.pid) && p.child.exitCode === null) await new Promise((r) => setTimeout(r, 20));
      disk.abort(); // the machine goes down: nothing more reaches the disk
      await killHard(p);
      disk.remount(); // and comes back
      const [, group, topic, partition, next] = at;
      crashes.push(`${group} ${topic}[${partition}]@${next}`);
      // the commit reported before the crash is in the database after it
      const pg = await createPglite(join(dir, 'db', 'pgdata'), true);
      try {
        const row = await pg.query<{ next_offset: number }>(
          'select next_offset from bus_offsets where group_id = $1 and topic = $2 and partition = $3',
          [group, topic, Number(partition)],
        );
        assert.equal(
          Number(row.rows[0]?.next_offset),
          Number(next),
          `after the crash at ${crashes.at(-1)} the commit is durable`,
        );
      } finally {
        await pg.close();
      }
    }
    assert.ok(crashes.length >= 3, `crashed ${crashes.length} times: ${crashes.join('; ')}`);
    process.stderr.write(`# ${crashes.length} machine crashes, after: ${crashes.join('; ')}\n`);
    const got = await finalState(dir);
    assert.deepEqual(got, want, `after ${crashes.length} machine crashes (${crashes.join('; ')})`);
  },
);
