/**
 * A damaged embedded log: `rlstream train` is killed at the start of a rollout batch (the step's
 * prompt batches are in the log, not yet consumed), the unconsumed prompt messages are overwritten
 * with bytes no reader can decode (what a damaged run directory, or one written by an
 * incompatible rlstream version, looks like), and the same command is run again. The rollout
 * stage dead-letters them; since only this process writes a PGlite log, they were the run's own,
 * and the step can never finish — the command must fail with a reason that says so, not wait
 * forever. (Over PostgreSQL or Kafka, foreign messages are dead-lettered and the run goes on:
 * test/e2e/poison.test.ts.)
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { openDatabase } from '../../lib/db/database.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { deadline, killHard, selfKilledAt, spawnCli, type CliProc } from '../support/chaos-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'damaged';
const tmp = join(ROOT, 'test/.tmp', `damaged-${process.pid}`);
const procs: CliProc[] = [];
after(async () => {
  for (const p of procs) await killHard(p);
  rmSync(tmp, { recursive: true, force: true });
});

test(
  "an unreadable message in a PGlite run's own log fails the run with the reason instead of hanging",
  { timeout: 240_000 },
  async () => {
    const runDir = join(tmp, 'run');
    const args = ['train', CONFIG, `trainer.run_dir=${runDir}`, `pipeline.run_id=${RUN_ID}`, 'trainer.max_steps=4'];

    const first = spawnCli(args, { RLSTREAM_CRASH_AT: 'rollout:start@2' });
    procs.push(first);
    const killed = await Promise.race([first.exit, deadline(120_000)]);
    assert.ok(killed, `the first run did not reach the crash point:\n${first.output().slice(-3000)}`);
    assert.equal(selfKilledAt(first.output()), 'rollout:start@2', first.output().slice(-3000));

    // overwrite every prompt message the rollout group has not consumed yet
    const database = await openDatabase({ kind: 'pglite', dir: join(runDir, 'db') });
    let damaged = 0;
    try {
      const r = await sql<{ n: number }>`
      with unread as (
        select m.topic, m.partition, m.msg_offset from bus_messages m
        left join bus_offsets o on o.group_id = ${`${RUN_ID}.rollout`} and o.topic = m.topic and o.partition = m.partition
        where m.topic like ${'%.prompts'} and m.msg_offset >= coalesce(o.next_offset, 0)
      )
      update bus_messages b set value = '\\xfffe0013370042'::bytea from unread u
      where b.topic = u.topic and b.partition = u.partition and b.msg_offset = u.msg_offset
      returning 1 as n`.execute(database.db);
      damaged = r.rows.length;
    } finally {
      await database.close();
    }
    assert.ok(damaged > 0, 'the crash left unconsumed prompt batches');

    const second = spawnCli(args);
    procs.push(second);
    const done = await Promise.race([second.exit, deadline(120_000)]);
    if (!done) {
      await killHard(second);
      assert.fail(`the resumed run hung on the unreadable messages:\n${second.output().slice(-3000)}`);
    }
    assert.notEqual(done.code, 0, 'the run failed');
    const out = second.output();
    assert.match(
      out,
      /rollout could not read a prompts message \(rlstream\.damaged\.prompts\[\d\]@\d+: .*\) and dead-lettered it/,
    );
    assert.match(out, /the step that needs it can never finish; the run stops/);
    assert.match(out, /rlstream sql .*v_dead_letters/);

    // the message is kept where the reason says
    const db2 = await openDatabase({ kind: 'pglite', dir: join(runDir, 'db') });
    try {
      const dl = await sql<{
        stage: string;
        n: number;
      }>`select stage, count(*)::int as n from dead_letters where run_id = ${RUN_ID} group by stage`.execute(db2.db);
      assert.equal(dl.rows.length, 1);
      assert.equal(dl.rows[0]!.stage, 'rollout');
      assert.ok(dl.rows[0]!.n >= 1 && dl.rows[0]!.n <= damaged);
    } finally {
      await db2.close();
    }
  },
);
