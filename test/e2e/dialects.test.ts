/**
 * A config in EasyR1's dialect (worker: sections, global_batch_size in prompts, a reward module
 * named file:function) trains two steps with exactly the trajectories and final checkpoint of its
 * native twin: the translation gives the run the same meaning, not just the same keys.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const FIXTURES = join(ROOT, 'test/e2e/fixtures/dialects');
const RUN_ID = 'dialects';
const tmp = join(ROOT, 'test/.tmp', `dialects-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

interface Row {
  step: number;
  prompt_index: number;
  sample_index: number;
  response_tokens: number[];
  behaviour_logprobs: number[];
  reward: number;
  advantages: number[];
}

async function run(file: string, name: string): Promise<{ rows: Row[]; sha: string }> {
  const notApplicable: string[] = [];
  const cfg = loadConfig({
    file,
    overrides: [`trainer.run_dir=${join(tmp, name)}`, `pipeline.run_id=${RUN_ID}`],
    env: {},
    onTranslation: (t) => notApplicable.push(...t.notApplicable),
  });
  if (name === 'easyr1')
    assert.deepEqual(notApplicable, [
      'worker.actor.padding_free',
      'worker.actor.model.trust_remote_code',
      'worker.actor.fsdp.enable_full_shard',
      'worker.rollout.gpu_memory_utilization',
      'worker.rollout.tensor_parallel_size',
      'trainer.n_gpus_per_node',
    ]);
  const out = await trainEmbedded(cfg, silentLogger(RUN_ID));
  assert.equal(out.status, 'completed', out.message);
  const store = await openStore({ kind: 'pglite', dir: join(tmp, name, 'db') });
  try {
    const rows = (
      await sql<Row>`select step, prompt_index, sample_index, response_tokens, behaviour_logprobs, reward, advantages
        from trajectories where run_id = ${RUN_ID} order by step, prompt_index, sample_index`.execute(store.database.db)
    ).rows;
    const ck = await store.latestCheckpoint(RUN_ID);
    assert.equal(ck?.step, 2);
    return { rows, sha: ck!.sha256 };
  } finally {
    await store.close();
  }
}

test(
  'an EasyR1 config trains two steps with the trajectories and checkpoint of its native twin',
  { timeout: 120_000 },
  async () => {
    const native = await run(join(FIXTURES, 'native.yaml'), 'native');
    const easyr1 = await run(join(FIXTURES, 'easyr1.yaml'), 'easyr1');
    assert.equal(native.rows.length, 2 * 4 * 4, 'two steps of 4 prompts × 4 samples');
    assert.ok(
      native.rows.some((r) => r.reward > 0),
      'the JS reward module scored some responses',
    );
    assert.deepEqual(easyr1.rows, native.rows);
    assert.equal(easyr1.sha, native.sha);
  },
);
