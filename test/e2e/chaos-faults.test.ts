/**
 * The combined fault test: the five stages as `rlstream serve` processes over the
 * embedded log on PostgreSQL, while (1) a seeded harness SIGKILLs random stages and restarts them,
 * (2) every backend of the run's database is terminated (pg_terminate_backend) every 1.5 s, and
 * (3) the policy directory is a tmpfs too small for the run: the update stage stops with ENOSPC
 * naming the path, the test frees space (a bigger tmpfs) and restarts it with the same command.
 * The run must end with the uninterrupted run's checkpoint sha256 and one row per sample.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { ROOT, freshDatabase } from '../../devkit/pipeline-procs.ts';
import { ChaosHarness, sleep } from '../support/chaos-procs.ts';
import { mountUnavailable, tinyDisk, type TinyDisk } from '../support/fault-mounts.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'chaosfaults';
const STEPS = 10;
const tmp = join(ROOT, 'test/.tmp', `chaos-faults-${process.pid}`);
const cleanups: Array<() => Promise<void> | void> = [];
after(async () => {
  for (const c of cleanups.reverse()) {
    try {
      await c();
    } catch {
      /* best effort */
    }
  }
  rmSync(tmp, { recursive: true, force: true });
});

// every version kept (keep_policy_versions), so the policy directory outgrows the small disk mid-run
const common = [
  `pipeline.run_id=${RUN_ID}`,
  `trainer.max_steps=${STEPS}`,
  'trainer.save_freq=5',
  'trainer.total_epochs=2',
  'data.task_size.train=32',
  `trainer.keep_policy_versions=${STEPS + 1}`,
];

async function final(target: { kind: 'pglite'; dir: string } | { kind: 'postgres'; url: string }) {
  const store = await openStore(target);
  try {
    return {
      checkpoints: (await store.listCheckpoints(RUN_ID)).map((c) => [c.step, c.sha256]),
      rows: await store.countTrajectories(RUN_ID),
    };
  } finally {
    await store.close();
  }
}

test(
  'kills, terminated database connections and a full disk freed mid-run: the run ends with the uninterrupted checkpoints',
  { skip: mountUnavailable() ?? false, timeout: 300_000 },
  async () => {
    const ref = await trainEmbedded(
      loadConfig({ file: CONFIG, overrides: [...common, `trainer.run_dir=${join(tmp, 'ref')}`] }),
      silentLogger(RUN_ID),
    );
    assert.equal(ref.status, 'completed', ref.message);
    const want = await final({ kind: 'pglite', dir: join(tmp, 'ref', 'db') });
    assert.equal(want.checkpoints.at(-1)?.[0], STEPS);

    const name = `rl_e2e_chaosfaults_${process.pid}`;
    const db = await freshDatabase(name);
    cleanups.push(db.drop);
    const runDir = join(tmp, 'dist');
    const disk: TinyDisk = tinyDisk(join(runDir, 'policy'), '280k'); // room for ~5 of the 11 policy versions (weights only, ~50 KB each)
    cleanups.push(() => disk.unmount());
    const admin = new pg.Client({ connectionString: db.url });
    await admin.connect();
    cleanups.push(() => admin.end());
    let terminated = 0,
      freed = false;
    const harness = new ChaosHarness({
      configFile: CONFIG,
      overrides: [
        ...common,
        `trainer.run_dir=${runDir}`,
        'pipeline.topic_prefix=chaosfaults',
        'pipeline.bus=embedded',
        'pipeline.store=postgres',
        `pipeline.database_url=${db.url}`,
      ],
      stages: ['update', 'controller', 'advantage', 'reward', 'rollout'],
      seed: 7,
      maxKills: 4,
      intervalMs: [2000, 4000],
      minUptimeMs: 5000,
      restartDelayMs: 200,
      timeoutMs: 200_000,
      hooks: { rollout: ['rollout:generated@2'] },
      expectedFault: {
        pattern: /cannot write \S*policy\S*: no space left on device \(ENOSPC\)/,
        async fix() {
          disk.grow('20m');
          freed = true;
        },
      },
      log: (l) => console.log(`  ${l}`),
    });
    cleanups.push(() => harness.stop());
    let lastTerm = 0;
    harness.onTick = async () => {
      if (Date.now() - lastTerm < 1500) return;
      lastTerm = Date.now();
      const r = await admin
        .query(
          `select count(*)::int as n from (select pg_terminate_backend(pid) from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()) t`,
          [name],
        )
        .catch(() => null);
      terminated += r?.rows[0].n ?? 0;
    };
    await harness.run();
    await sleep(100);
    console.log(
      `  ${harness.kills.length} kills/faults (${harness.kills.map((k) => `${k.stage}: ${k.how}`).join('; ')}), ${terminated} backends terminated`,
    );
    assert.ok(freed, 'the update stage hit the full disk and was restarted after space was freed');
    assert.ok(
      harness.kills.some((k) => k.how === 'random SIGKILL' || k.how.startsWith('RLSTREAM_CRASH_AT')),
      'stages were killed',
    );
    assert.ok(terminated >= 10, `database connections were terminated during the run (${terminated})`);
    const got = await final({ kind: 'postgres', url: db.url });
    assert.deepEqual(got, want, "every checkpoint (step, sha256) and the row count equal the uninterrupted run's");
  },
);
