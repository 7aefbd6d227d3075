/**
 * The word-problems example, short (examples/word-problems/README.md): its generator, its two
 * configs and the gsm8k reward at CI size — SFT (192 steps) of a small model from scratch on 512 worked
 * solutions, then GRPO from the SFT checkpoint with validation on held-out problems (greedy)
 * before and after. Asserts that the SFT model answers held-out problems in the `#### n` format
 * and that RL does not lower held-out accuracy.
 *
 * Unlike the full example it uses the byte tokenizer (259 ids) on a smaller model, so that it
 * runs in about a minute: the full example's 32 000-id LM head dominates its steps. The chat-template rendering of SFT rows is
 * covered by test/unit/sft/data.test.ts.
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
import { generateProblems } from '../../examples/word-problems/problems.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const EX = join(ROOT, 'examples/word-problems');
const tmp = join(ROOT, 'test/.tmp', `word-problems-${process.pid}`);
/** A fresh byte-level model (actor.model keys instead of the example's Qwen3 model directory). */
const MODEL = [
  'actor.model.path=null',
  'actor.model.tokenizer=byte',
  'actor.model.d_model=64',
  'actor.model.n_layers=2',
  'actor.model.n_heads=4',
  'actor.model.n_kv_heads=2',
  'actor.model.ffn=256',
  'actor.model.max_seq_len=192',
];
after(() => rmSync(tmp, { recursive: true, force: true }));

test(
  'word problems (short): the SFT model answers held-out problems in the #### n format; GRPO from it does not lower held-out accuracy',
  { timeout: 900_000 },
  async () => {
    mkdirSync(tmp, { recursive: true });
    const jsonl = (f: string, rows: object[]) => {
      writeFileSync(join(tmp, f), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
      return join(tmp, f);
    };
    const sftRows = jsonl(
      'sft.jsonl',
      generateProblems('train', 512, 1).map((p) => ({ prompt: p.prompt, response: p.solution, answer: p.answer })),
    );
    const rlRows = jsonl(
      'rl.jsonl',
      generateProblems('train', 64, 2).map((p) => ({ prompt: p.prompt, answer: p.answer })),
    );
    const heldout = jsonl(
      'heldout.jsonl',
      generateProblems('heldout', 32, 1).map((p) => ({ prompt: p.prompt, answer: p.answer })),
    );
    const sft = await sftRun(
      loadConfig({
        file: join(EX, 'sft.yaml'),
        command: 'sft',
        env: {},
        overrides: [
          `data.train_files=${sftRows}`,
          ...MODEL,
          'actor.global_batch_size=16',
          'actor.micro_batch_size_per_device_for_update=16',
          'actor.optim.lr=3e-3',
          'sft.epochs=6',
          'sft.max_length=192',
          'trainer.save_freq=-1',
          'trainer.logger=[console]',
          `trainer.run_dir=${join(tmp, 'sft')}`,
        ],
      }),
      silentLogger('wp-sft'),
    );
    assert.equal(sft.status, 'completed');
    const actor = join(sft.checkpoint!.path, 'actor');

    const rlDir = join(tmp, 'grpo');
    const rl = await trainEmbedded(
      loadConfig({
        file: join(EX, 'rl.yaml'),
        env: {},
        overrides: [
          `data.train_files=${rlRows}`,
          `data.val_files=${heldout}`,
          `actor.model.path=${actor}`,
          'data.max_prompt_length=128',
          'data.rollout_batch_size=4',
          'rollout.n=4',
          'actor.global_batch_size=16',
          'actor.micro_batch_size_per_device_for_update=16',
          'actor.micro_batch_size_per_device_for_experience=16',
          'rollout.val_override.temperature=0',
          'trainer.max_steps=4',
          'trainer.val_freq=4',
          'trainer.logger=[console]',
          `trainer.run_dir=${rlDir}`,
          'pipeline.run_id=wp-grpo',
        ],
      }),
      silentLogger('wp-grpo'),
    );
    assert.equal(rl.status, 'completed', rl.message);
    const store = await openStore({ kind: 'pglite', dir: join(rlDir, 'db') });
    try {
      const rows = (
        await sql<{ step: number; n: number; format: number; accuracy: number }>`
      select step, count(*)::int as n, avg((reward_details->>'format')::float8) as format, avg((reward_details->>'accuracy')::float8) as accuracy
      from trajectories where run_id = 'wp-grpo' and kind = 'val' group by step order by step`.execute(
          store.database.db,
        )
      ).rows;
      console.log(
        `  held-out (32 problems, greedy): ${rows.map((r) => `step ${r.step}: format ${r.format.toFixed(3)}, accuracy ${r.accuracy.toFixed(3)}`).join('; ')}`,
      );
      assert.deepEqual(
        rows.map((r) => [r.step, r.n]),
        [
          [0, 32],
          [4, 32],
        ],
      );
      assert.ok(rows[0].format >= 0.75, `the SFT model answers in the #### n format (${rows[0].format})`);
      assert.ok(
        rows[1].accuracy >= rows[0].accuracy,
        `RL does not lower held-out accuracy (${rows[0].accuracy} → ${rows[1].accuracy})`,
      );
    } finally {
      await store.close();
    }
  },
);
