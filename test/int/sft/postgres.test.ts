/**
 * `rlstream sft` over PostgreSQL (pipeline.store = postgres): the run's row, its metrics rows with
 * run_id and its checkpoint rows go to the shared database, where v_runs and `rlstream runs --db`
 * see it like a `train` run; a second run started with the same run id and config resumes it.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { loadConfig } from '../../../lib/config/index.ts';
import { sftRun } from '../../../app/sft.ts';
import { silentLogger } from '../../../lib/log.ts';
import { openDatabase } from '../../../lib/db/database.ts';
import { freshDatabase } from '../../../devkit/pipeline-procs.ts';

const dir = mkdtempSync(join(tmpdir(), 'rl-sft-pg-'));
after(() => rmSync(dir, { recursive: true, force: true }));

test(
  'sft over PostgreSQL: run row, metrics rows with run_id, checkpoints and v_runs; the same command again reports the run complete',
  { timeout: 180_000 },
  async () => {
    const pg = await freshDatabase(`rlstream_sft_int_${process.pid}`);
    try {
      const rows = join(dir, 'rows.jsonl');
      writeFileSync(
        rows,
        Array.from({ length: 24 }, (_, i) =>
          JSON.stringify({ prompt: `${i % 7}+${i % 5}=`, response: String((i % 7) + (i % 5)) }),
        ).join('\n'),
      );
      const cfg = loadConfig({
        command: 'sft',
        env: {},
        overrides: [
          `data.train_files=${rows}`,
          'actor.model.d_model=32',
          'actor.model.n_layers=1',
          'actor.model.n_heads=2',
          'actor.model.n_kv_heads=2',
          'actor.model.ffn=64',
          'actor.model.max_seq_len=32',
          'actor.global_batch_size=8',
          'actor.micro_batch_size_per_device_for_update=8',
          'actor.threads=1',
          'sft.max_length=32',
          'trainer.save_freq=2',
          `trainer.run_dir=${join(dir, 'run')}`,
          'pipeline.store=postgres',
          `pipeline.database_url=${pg.url}`,
          'pipeline.run_id=sft-pg',
        ],
      });
      const out = await sftRun(cfg, silentLogger('sft-pg'));
      assert.equal(out.status, 'completed');
      assert.equal(out.checkpoint?.step, 3);
      const db = await openDatabase({ kind: 'postgres', url: pg.url });
      try {
        const runs = (
          await sql<{
            status: string;
            steps: number;
            checkpoints: number;
            last_checkpoint_step: number;
          }>`select status, steps::int, checkpoints::int, last_checkpoint_step::int from v_runs where run_id = 'sft-pg'`.execute(
            db.db,
          )
        ).rows;
        assert.deepEqual(runs, [{ status: 'completed', steps: 3, checkpoints: 2, last_checkpoint_step: 3 }]);
        const names = (
          await sql<{
            name: string;
            n: number;
          }>`select name, count(*)::int as n from step_metrics where run_id = 'sft-pg' group by name order by name`.execute(
            db.db,
          )
        ).rows;
        assert.deepEqual(
          names.filter((r) => r.name.startsWith('sft/')),
          ['sft/grad_norm', 'sft/loss', 'sft/lr', 'sft/skipped_steps', 'sft/token_acc', 'sft/tokens'].map((name) => ({
            name,
            n: 3,
          })),
        );
      } finally {
        await db.close();
      }
      const again = await sftRun(cfg, silentLogger('sft-pg'));
      assert.equal(again.status, 'completed');
      assert.match(again.message ?? '', /already complete \(step 3\)/);
      assert.equal(again.checkpoint?.sha256, out.checkpoint?.sha256);
    } finally {
      await pg.drop();
    }
  },
);
