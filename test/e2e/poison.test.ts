/**
 * Poison messages in a running pipeline: an undecodable Avro body, a record written with a schema
 * the stage cannot read, and a record of another run are appended to the `trajectories` topic
 * while the run trains. Each goes to the dead-letter topic with its reason and source offset, is
 * recorded in `dead_letters` (shown by `rlstream sql … v_dead_letters`), and the run completes
 * with exactly its own trajectories. The pipeline runs embedded (all stages in this process) over
 * a PostgreSQL-backed log, so the test can write to the live topic through a second connection.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { openPipeline } from '../../lib/pipeline/runtime.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { hashId, topicCodecs, type TrajectoryGroup } from '../../lib/contracts/index.ts';
import { ROOT, freshDatabase, readerUrl } from '../../devkit/pipeline-procs.ts';
import { deadline, killHard, sleep, spawnCli } from '../support/chaos-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'poison';
const STEPS = 6;
const tmp = join(ROOT, 'test/.tmp', `poison-${process.pid}`);
const cleanups: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  rmSync(tmp, { recursive: true, force: true });
});

test(
  'undecodable, unreadable-schema and other-run messages are dead-lettered with reason and offset; the run completes',
  { timeout: 300_000 },
  async () => {
    const db = await freshDatabase(`rl_e2e_poison_${process.pid}`);
    cleanups.push(db.drop);
    const cfg = loadConfig({
      file: CONFIG,
      overrides: [
        `trainer.run_dir=${join(tmp, 'run')}`,
        `pipeline.run_id=${RUN_ID}`,
        `trainer.max_steps=${STEPS}`,
        'pipeline.bus=embedded',
        'pipeline.store=postgres',
        `pipeline.database_url=${db.url}`,
      ],
    });
    const run = trainEmbedded(cfg, silentLogger(RUN_ID));
    run.catch(() => undefined);

    // a second connection to the live log: wait until the run is under way, then append the poison
    const side = await openPipeline(cfg);
    cleanups.push(() => side.close());
    const topic = side.topic('trajectories');
    let first: Awaited<ReturnType<typeof side.bus.read>> = [];
    for (let i = 0; i < 600 && first.length === 0; i++) {
      first = await side.bus.read(topic, 0, 0, 1);
      if (!first.length) first = await side.bus.read(topic, 1, 0, 1);
      if (!first.length) await sleep(100);
    }
    assert.ok(first.length, 'the run produced trajectories');
    const real = (await side.codecs.trajectories.decode(first[0].value, first[0].headers)) as TrajectoryGroup;
    const other = 'someone-else';
    const id = `${other}${real.id.slice(RUN_ID.length)}`;
    const foreign = topicCodecs(
      { schema_wire_format: 'plain', schema_registry_url: null },
      cfg.pipeline.topic_prefix,
      other,
    ).trajectories.encode({
      ...real,
      run_id: other,
      id,
      group_uid: hashId(id),
      samples: real.samples.map((x) => ({ ...x, id: `${id}/n${x.sample_index}` })),
    });
    const valid = side.codecs.trajectories.encode(real);
    const poison = [
      { kind: 'undecodable', value: Buffer.from([0xff, 0xfe, 0x00, 0x13, 0x37]), headers: valid.headers },
      { kind: 'unknown schema', value: valid.value, headers: { ...valid.headers, 'rl-schema': 'trajectories.v99' } },
      { kind: 'other run', value: foreign.value, headers: foreign.headers },
    ];
    const before = await side.bus.endOffsets(topic);
    await side.bus.produce(
      poison.map((x) => ({ topic, key: 'poison', partition: 0, value: x.value, headers: x.headers })),
    );
    // the live run may append to the same partition between endOffsets and produce: find ours by key
    const offsets = (await side.bus.read(topic, 0, before[0], 10_000))
      .filter((m) => m.key === 'poison')
      .map((m) => m.offset);
    assert.equal(offsets.length, poison.length, 'the poison messages were appended');

    const out = await Promise.race([run, deadline(240_000)]);
    assert.ok(out, 'the run finished');
    assert.equal(out!.status, 'completed', out!.message);

    const store = await openStore({ kind: 'postgres', url: db.url });
    try {
      assert.equal(await store.countTrajectories(RUN_ID), STEPS * 4 * 4, "only the run's own trajectories");
      const dl = (await store.listDeadLetters({ runId: RUN_ID }))
        .filter((d) => d.topic === topic)
        .sort((a, b) => a.offset - b.offset);
      assert.deepEqual(
        dl.map((d) => [d.stage, d.partition, d.offset]),
        offsets.map((o) => ['reward', 0, o]),
        'each poison message dead-lettered once by the reward stage at its source offset',
      );
      assert.match(dl[0].reason, /trajectories|decode|Avro|truncated|invalid/i);
      assert.match(dl[1].reason, /trajectories\.v99/);
      assert.match(dl[2].reason, /unknown run someone-else/);
    } finally {
      await store.close();
    }

    // the dead-letter topic holds them too, with the source offsets
    const letters = await side.bus.read(side.topic('deadletter'), 0, 0, 100);
    const decoded = await Promise.all(letters.map(async (m) => side.codecs.deadletter.decode(m.value, m.headers)));
    assert.deepEqual(
      decoded
        .filter((d) => d.source_topic === topic)
        .map((d) => d.source_offset)
        .sort((a, b) => a - b),
      offsets,
    );

    // rlstream sql shows them (as the read-only role it runs queries as)
    const p = spawnCli([
      'sql',
      await readerUrl(db.url),
      `select stage, source_partition, source_offset, reason from v_dead_letters where run_id = '${RUN_ID}' order by source_offset`,
      '--csv',
    ]);
    const ex = await Promise.race([p.exit, deadline(60_000)]);
    if (!ex) await killHard(p);
    assert.equal(ex?.code, 0, p.output());
    console.log(p.output().trim());
    for (const o of offsets) assert.match(p.output(), new RegExp(`^reward,0,${o},`, 'm'));
    assert.match(p.output(), /unknown run someone-else/);
  },
);
