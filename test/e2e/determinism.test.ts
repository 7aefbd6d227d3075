/**
 * The same config and seed with max_staleness 0 end with the same final checkpoint sha256 in
 * (A) the embedded default, (B) five stage processes over Kafka (librdkafka mock) and
 * PostgreSQL, and (C) that with two rollout replicas sharing the prompts.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { ROOT, freshDatabase, kafkaForRun, runDistributed } from '../../devkit/pipeline-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'determinism';
const tmp = join(ROOT, 'test/.tmp', `determinism-${process.pid}`);
const cleanups: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  rmSync(tmp, { recursive: true, force: true });
});

async function finalSha(url: string): Promise<{ sha: string; trajectories: number }> {
  const store = await openStore({ kind: 'postgres', url });
  try {
    const ck = await store.latestCheckpoint(RUN_ID);
    assert.ok(ck, 'the run recorded a checkpoint');
    assert.equal(ck!.step, 3);
    return { sha: ck!.sha256, trajectories: await store.countTrajectories(RUN_ID) };
  } finally {
    await store.close();
  }
}

async function distributed(name: string, replicas: number): Promise<{ sha: string; trajectories: number }> {
  const db = await freshDatabase(`rl_e2e_${name}_${process.pid}`);
  cleanups.push(db.drop);
  const kafka = await kafkaForRun(name, RUN_ID, 2);
  cleanups.push(() => kafka.stop());
  const procs = await runDistributed(
    CONFIG,
    [
      `trainer.run_dir=${join(tmp, name)}`,
      `pipeline.run_id=${RUN_ID}`,
      `pipeline.topic_prefix=${name}`,
      'pipeline.bus=kafka',
      `pipeline.brokers=[${kafka.brokers.join(',')}]`,
      'pipeline.store=postgres',
      `pipeline.database_url=${db.url}`,
    ],
    { rolloutReplicas: replicas },
  );
  for (const p of procs)
    assert.equal(await p.exit, 0, `${p.stage}#${p.replica} exited non-zero:\n${p.output().slice(-2000)}`);
  return finalSha(db.url);
}

test(
  'embedded, multi-process Kafka, and two rollout replicas end with the same checkpoint',
  { timeout: 600_000 },
  async () => {
    const cfg = loadConfig({
      file: CONFIG,
      overrides: [`trainer.run_dir=${join(tmp, 'embedded')}`, `pipeline.run_id=${RUN_ID}`],
    });
    const a = await trainEmbedded(cfg, silentLogger(RUN_ID));
    assert.equal(a.status, 'completed', a.message);
    const m = /sha256 ([0-9a-f]{64})/.exec(a.summary);
    assert.ok(m, a.summary);
    const b = await distributed('kafka1', 1);
    assert.equal(b.trajectories, 3 * 4 * 4, 'one row per (step, prompt, sample)');
    assert.equal(b.sha, m![1], "multi-process Kafka run ends with the embedded run's checkpoint");
    const c = await distributed('kafka2', 2);
    assert.equal(c.sha, m![1], 'two rollout replicas end with the same checkpoint');
  },
);
