/**
 * `rlstream replay` from a run whose log is Kafka (the librdkafka mock) and whose store is
 * PostgreSQL: the source's recorded trajectories are read back from its Kafka topic, and the
 * replay with the source's config reproduces its checkpoint, generating nothing. The source is
 * killed between checkpoints (trainer.save_freq 3, after step 2): its restart re-trains steps 1–2
 * from the update groups it reads back from Kafka, and the replay's checkpoint shows it exact.
 * (The embedded-log replay: test/e2e/replay.test.ts.)
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { replayRun } from '../../app/replay.ts';
import { silentLogger } from '../../lib/log.ts';
import { spawnCli } from '../support/chaos-procs.ts';
import { openStore } from '../../lib/store/index.ts';
import { ROOT, freshDatabase, kafkaForRun } from '../../devkit/pipeline-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const SRC = 'replaykafkasrc',
  DST = 'replaykafkadst',
  PREFIX = 'rk';
const tmp = join(ROOT, 'test/.tmp', `replay-kafka-${process.pid}`);
const cleanups: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  rmSync(tmp, { recursive: true, force: true });
});

test("replay reads a Kafka run's trajectories back and reproduces its checkpoint", { timeout: 300_000 }, async () => {
  const db = await freshDatabase(`rl_e2e_replay_kafka_${process.pid}`);
  cleanups.push(db.drop);
  const kafka = await kafkaForRun(PREFIX, [SRC, DST], 2);
  cleanups.push(() => kafka.stop());
  const overrides = [
    `trainer.run_dir=${join(tmp, 'src')}`,
    `pipeline.run_id=${SRC}`,
    `pipeline.topic_prefix=${PREFIX}`,
    'trainer.max_steps=3',
    'trainer.save_freq=3',
    'pipeline.bus=kafka',
    `pipeline.brokers=[${kafka.brokers.join(',')}]`,
    'pipeline.store=postgres',
    `pipeline.database_url=${db.url}`,
  ];
  // the source is killed as step 3 starts (steps 1–2 committed, no checkpoint yet): its restart
  // re-trains them from the groups it reads back from the Kafka topic, from the run's start
  const killed = spawnCli(['train', CONFIG, ...overrides], { RLSTREAM_CRASH_AT: 'update:start@3' });
  assert.equal((await killed.exit).signal, 'SIGKILL', killed.output().slice(-3000));
  const restarted = spawnCli(['train', CONFIG, ...overrides]);
  assert.equal((await restarted.exit).code, 0, restarted.output().slice(-3000));
  assert.match(restarted.output(), /re-trained steps 1–2 from the update stage's input log/);

  const replay = await replayRun({
    from: SRC,
    overrides: [
      `pipeline.store=postgres`,
      `pipeline.database_url=${db.url}`,
      `pipeline.run_id=${DST}`,
      `trainer.run_dir=${join(tmp, 'dst')}`,
    ],
    log: silentLogger(DST),
  });
  assert.equal(replay.status, 'completed', replay.message);
  assert.equal(replay.sourceRunId, SRC);
  assert.equal(replay.copied, 3 * 4, 'every training group of the 3 steps, read from the Kafka topic');

  const store = await openStore({ kind: 'postgres', url: db.url });
  try {
    const want = await store.listCheckpoints(SRC),
      got = await store.listCheckpoints(DST);
    assert.deepEqual(
      want.map((c) => c.step),
      [3],
    );
    assert.deepEqual(
      got.map((c) => [c.step, c.sha256]),
      want.map((c) => [c.step, c.sha256]),
      "the replay's checkpoint equals the source's",
    );
    assert.equal(replay.finalSha256, want[0]!.sha256);
    assert.equal((await store.getRun(DST))?.parentRunId, SRC);
    assert.equal(await store.countTrajectories(DST), 3 * 4 * 4);
    assert.equal((await store.getMetrics(DST, ['perf/rollout_tokens'])).length, 0, 'no rollout ran');
  } finally {
    await store.close();
  }
});
