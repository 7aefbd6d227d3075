/**
 * Reading an embedded database while another holder has it open (a live training run): the
 * holder serves snapshots over <dir>/snapshot.sock; readers load them (lib/db/snapshot.ts,
 * lib/analysis/target.ts). Committed rows are seen, a transaction in flight is not.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { openDatabase } from '../../../lib/db/database.ts';
import { openRun, locateRun } from '../../../lib/analysis/target.ts';
import { runSql } from '../../../app/cli/commands/sql.ts';
import { listRunsInDir } from '../../../lib/analysis/runs.ts';
import { snapshotSocket } from '../../../lib/db/snapshot.ts';

const root = mkdtempSync(join(tmpdir(), 'rl-live-'));
after(() => rmSync(root, { recursive: true, force: true }));

test(
  'sql, runs and report read a live embedded run through a snapshot of its holder',
  { timeout: 120_000 },
  async () => {
    const runDir = join(root, 'runs', 'live');
    const holder = await openDatabase({ kind: 'pglite', dir: join(runDir, 'db') });
    try {
      assert.ok(existsSync(snapshotSocket(join(runDir, 'db'))), 'the holder listens for snapshot requests');
      await sql`insert into runs (run_id, project, experiment, config, status) values ('live-1', 'p', 'e', '{}'::jsonb, 'running')`.execute(
        holder.db,
      );
      // a transaction in flight while the snapshot is taken: its row is not in the copy
      await holder.db.transaction().execute(async (tx) => {
        await sql`insert into runs (run_id, project, experiment, config, status) values ('uncommitted', 'p', 'e', '{}'::jsonb, 'running')`.execute(
          tx,
        );
        const notes: string[] = [];
        const reader = await openRun(locateRun(runDir), { onSnapshot: (n) => notes.push(n) });
        try {
          const rows = (await sql<{ run_id: string }>`select run_id from runs order by run_id`.execute(reader.db)).rows;
          assert.deepEqual(
            rows.map((r) => r.run_id),
            ['live-1'],
          );
          assert.match(notes[0]!, /is in use by a live process \(PID \d+\): reading a snapshot taken now/);
        } finally {
          await reader.close();
        }
      });
      const out: string[] = [],
        err: string[] = [];
      assert.equal(
        await runSql([runDir, 'select run_id, status from v_runs order by run_id', '--csv'], {
          out: (t) => out.push(t),
          err: (t) => err.push(t),
        }),
        0,
      );
      assert.equal(out.join(''), 'run_id,status\r\nlive-1,running\r\nuncommitted,running\r\n');
      assert.match(err.join(''), /reading a snapshot/);
      const listed = await listRunsInDir(join(root, 'runs'));
      assert.deepEqual(listed.map((r) => [r.runId, r.status]).sort(), [
        ['live-1', 'running'],
        ['uncommitted', 'running'],
      ]);
      // the holder goes on writing; the readers changed nothing
      await sql`update runs set status = 'completed' where run_id = 'live-1'`.execute(holder.db);
    } finally {
      await holder.close();
    }
    assert.ok(!existsSync(snapshotSocket(join(runDir, 'db'))), 'the socket is removed with the holder');
  },
);
