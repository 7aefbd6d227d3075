/**
 * A full disk is a fault of the stage's own environment, not of the message it was processing
 *: the update stage cannot write `policy/.vNNNNNN.tmp-…` (ENOSPC on a tmpfs mounted
 * over `<run_dir>/policy`). The run must stop with one line naming the path and the reason,
 * dead-letter nothing, commit nothing past the failed batch, and the same command must continue
 * once space is back, ending with the uninterrupted run's final checkpoint (sha256).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { spawnCli } from '../support/chaos-procs.ts';
import { mountUnavailable, tinyDisk, type TinyDisk } from '../support/fault-mounts.ts';
import { openStore } from '../../lib/store/index.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'diskfull';
const tmp = join(ROOT, 'test/.tmp', `disk-full-${process.pid}`);
const disks: TinyDisk[] = [];
after(() => {
  for (const d of disks) d.unmount();
  rmSync(tmp, { recursive: true, force: true });
});

// every version written (policy.version_files) and kept (keep_policy_versions), so the policy
// directory outgrows the small disk
const args = (dir: string) => [
  'train',
  CONFIG,
  `trainer.run_dir=${dir}`,
  `pipeline.run_id=${RUN_ID}`,
  'trainer.max_steps=8',
  'trainer.save_freq=4',
  'trainer.keep_policy_versions=8',
  'policy.version_files=every_step',
];

async function finalState(dir: string) {
  const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
  try {
    const cks = await store.listCheckpoints(RUN_ID);
    const dead = await store.listDeadLetters({ runId: RUN_ID });
    return {
      sha: cks.at(-1)?.sha256,
      step: cks.at(-1)?.step,
      rows: await store.countTrajectories(RUN_ID),
      dead: dead.length,
    };
  } finally {
    await store.close();
  }
}

test(
  'ENOSPC on the policy directory stops the run with the path and reason; the same command continues once space is back',
  { skip: mountUnavailable() ?? false, timeout: 180_000 },
  async () => {
    const ref = join(tmp, 'ref');
    const r0 = spawnCli(args(ref));
    assert.equal((await r0.exit).code, 0, r0.output().slice(-3000));
    const want = await finalState(ref);

    const dir = join(tmp, 'full');
    const disk = tinyDisk(join(dir, 'policy'), '230k'); // room for ~4 of the 8 policy versions (weights only, ~50 KB each)
    disks.push(disk);
    const r1 = spawnCli(args(dir));
    const ex1 = await r1.exit;
    const out1 = r1.output();
    assert.equal(ex1.code, 1, out1.slice(-3000));
    const line = out1.split('\n').find((l) => l.startsWith('rlstream train: '));
    assert.ok(line, out1.slice(-3000));
    assert.match(line, /no space left on device|ENOSPC/i);
    assert.ok(line.includes(join(dir, 'policy')), `names the path: ${line}`);
    assert.doesNotMatch(line, /another rlstream version|damaged|dead-letter/i);
    const mid = await finalState(dir);
    assert.equal(mid.dead, 0, 'nothing was dead-lettered');

    disk.grow('20m');
    const r2 = spawnCli(args(dir));
    const ex2 = await r2.exit;
    assert.equal(ex2.code, 0, r2.output().slice(-3000));
    const got = await finalState(dir);
    assert.deepEqual(got, want, 'same final checkpoint, rows and no dead letters as the uninterrupted run');
  },
);
