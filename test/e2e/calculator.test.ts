/**
 * The calculator example, short: `rlstream sft` on a calc tool-call demonstration
 * (examples/calculator/sft.yaml, a few steps), then one GRPO step with the calc tool
 * (examples/calculator/rl.yaml) from its checkpoint. Whatever the policy writes, the run completes,
 * no episode fails, and the recording agrees: episodes.tool_calls / tool_errors equal the recorded
 * tool turns (with and without an error), a run call's text is calc's result, an error's is
 * `Error: <error>`, v_tool_usage_by_step sums them, and env/tool_calls_mean, env/tool_error_rate
 * are the episodes' mean and rate. The few-step policy writes the call's text well-formed, so at
 * least one episode's `calc` call runs (its operands are not yet the prompt's).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { loadConfig } from '../../lib/config/index.ts';
import { sftRun } from '../../app/sft.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { generateProblems, toolDemonstration } from '../../examples/calculator/problems.ts';

const tmp = join(ROOT, 'test/.tmp', `calculator-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

test(
  'calculator: SFT on tool-call demonstrations, then GRPO with the calc tool; calls recorded and counted',
  { timeout: 300_000 },
  async () => {
    mkdirSync(tmp, { recursive: true });
    const ps = generateProblems(72, 7);
    const lines = (rows: unknown[]) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
    // 64 demonstrations, 64 steps at sft.yaml's lr (warmup, cosine): the policy writes the call's
    // constant text well-formed for any prompt (the copied operands are not learnt in so few steps),
    // so the GRPO step has calls to run; the test is about their handling, not about learning
    writeFileSync(join(tmp, 'sft.jsonl'), lines(ps.slice(0, 64).map((p) => ({ messages: toolDemonstration(p) }))));
    writeFileSync(join(tmp, 'rl.jsonl'), lines(ps.slice(64).map((p) => ({ prompt: p.prompt, answer: p.answer }))));
    const sft = await sftRun(
      loadConfig({
        file: join(ROOT, 'examples/calculator/sft.yaml'),
        command: 'sft',
        overrides: [
          `data.train_files=${join(tmp, 'sft.jsonl')}`,
          `trainer.run_dir=${join(tmp, 'sft')}`,
          'pipeline.run_id=calc-sft',
          'sft.epochs=16',
          'actor.global_batch_size=16',
          'actor.micro_batch_size_per_device_for_update=16',
          'trainer.save_freq=64',
        ],
      }),
      silentLogger('calc-sft'),
    );
    assert.equal(sft.status, 'completed', sft.message);
    const runId = 'calc-grpo';
    const dir = join(tmp, 'rl');
    const r = await trainEmbedded(
      loadConfig({
        file: join(ROOT, 'examples/calculator/rl.yaml'),
        overrides: [
          `data.train_files=${join(tmp, 'rl.jsonl')}`,
          'data.val_files=[]',
          `actor.model.path=${join(sft.checkpoint!.path, 'actor')}`,
          `trainer.run_dir=${dir}`,
          `pipeline.run_id=${runId}`,
          'data.rollout_batch_size=4',
          'rollout.n=4',
          'rollout.top_k=1', // greedy: the few-step SFT policy's most likely reply, a call
          'actor.global_batch_size=16',
          'actor.micro_batch_size_per_device_for_update=16',
          'actor.micro_batch_size_per_device_for_experience=16',
          'rollout.multi_turn.max_parallel_calls=2',
          'trainer.max_steps=1',
          'trainer.val_before_train=false',
          'trainer.val_freq=-1',
        ],
      }),
      silentLogger(runId),
    );
    assert.equal(r.status, 'completed', r.message);
    const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
    try {
      const db = store.database.db;
      const eps = (await store.getEpisodes(runId)).filter((e) => e.kind === 'train');
      assert.equal(eps.length, 16);
      const turns = (
        await sql<{
          trajectory_id: string;
          tool_name: string | null;
          error: string | null;
          text: string;
          arguments: string | null;
        }>`
        select trajectory_id, tool_name, error, text, arguments from episode_turns where run_id = ${runId} and role = 'tool'`.execute(
          db,
        )
      ).rows;
      let calls = 0,
        errors = 0;
      for (const e of eps) {
        assert.equal(e.episode.failure, null, 'a tool never fails an episode');
        const mine = turns.filter((t) => t.trajectory_id === e.trajectoryId);
        assert.equal(e.episode.tool_calls, mine.length);
        assert.equal(e.episode.tool_errors, mine.filter((t) => t.error !== null).length);
        calls += e.episode.tool_calls;
        errors += e.episode.tool_errors;
      }
      const ran = turns.filter((t) => t.tool_name === 'calc' && t.error === null);
      assert.ok(ran.length >= 1, `no well-formed calc call ran (tool turns: ${JSON.stringify(turns.slice(0, 3))})`);
      for (const t of turns) {
        if (t.error === null) {
          // a run call: its answer is calc's result for the recorded arguments
          const { calc } = await import('../../examples/calculator/calc.ts');
          assert.equal(t.text, calc(JSON.parse(t.arguments!)));
        } else assert.equal(t.text, `Error: ${t.error}`);
      }
      const usage = (
        await sql<{
          calls: number;
          errors: number;
        }>`select coalesce(sum(calls), 0)::int as calls, coalesce(sum(errors), 0)::int as errors from v_tool_usage_by_step where run_id = ${runId}`.execute(
          db,
        )
      ).rows[0];
      assert.deepEqual([usage.calls, usage.errors], [calls, errors]);
      const m = new Map(
        (await store.getMetrics(runId, ['env/tool_calls_mean', 'env/tool_error_rate'])).map((x) => [x.name, x.value]),
      );
      assert.ok(Math.abs(m.get('env/tool_calls_mean')! - calls / eps.length) < 1e-9);
      assert.ok(Math.abs(m.get('env/tool_error_rate')! - (calls ? errors / calls : 0)) < 1e-9);
    } finally {
      await store.close();
    }
  },
);
