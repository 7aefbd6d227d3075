/**
 * The shipped dialect examples start and train as their users would run them: `rlstream train
 * examples/dialects/verl-gsm8k.yaml` with Hydra-style overrides in verl's own key names pointing
 * at a tiny GSM8K-format parquet (chat-message prompt, reward_model.ground_truth, data_source
 * openai/gsm8k) and a tiny random-weight Qwen3 model directory; `rlstream train
 * examples/dialects/mtrl-vppo-vision.yaml` with MTRL's key names pointing at a tiny JSONL of the
 * vision number game (prompt, answer, images as PNG paths). Each exits 0, lists the not-applicable
 * keys once ("not applicable here: …"), prints no other warning, and stores two trained steps of
 * trajectories (with their images for MTRL).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { parquetWriteFile } from 'hyparquet-writer';
import sharp from 'sharp';
import { fromHfConfig } from '../../lib/model/config.ts';
import { initWeights } from '../../lib/model/init.ts';
import { paramSpecs } from '../../lib/model/params.ts';
import { openStore } from '../../lib/store/index.ts';
import { numberGameVision } from '../../lib/tasks/index.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { writeHfModelDir, tinyQwen3Config, QWEN3_TOKENIZER_DIR } from '../support/hf-model-dir.ts';

const tmp = join(ROOT, 'test/.tmp', `dialect-examples-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

/** `rlstream train <args>` as a process; its exit code and everything it printed. */
function train(args: string[]): { status: number | null; output: string } {
  const r = spawnSync(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), 'train', ...args], {
    cwd: ROOT,
    encoding: 'utf8',
    env: { ...process.env, RLSTREAM_LOG_LEVEL: 'info' },
    timeout: 120_000,
  });
  return { status: r.status, output: `${r.stdout}\n${r.stderr}` };
}

/** Exit 0, the not-applicable list exactly once, no other warning (no `warning:` line, no pino warn/error). */
function assertCleanStart(run: { status: number | null; output: string }, dialect: string): void {
  assert.equal(run.status, 0, run.output);
  const lines = run.output.split('\n');
  const na = lines.filter((l) => l.includes('not applicable here'));
  assert.equal(na.length, 1, run.output);
  assert.match(na[0], new RegExp(`^${dialect} config: not applicable here \\(.*\\): \\S`));
  assert.deepEqual(
    lines.filter((l) => /^warning:|unknown key|not recognised|not recognized/i.test(l)),
    [],
    'no warning besides the not-applicable list',
  );
  const loud = lines.filter((l) => l.startsWith('{') && (JSON.parse(l) as { level: number }).level >= 40);
  assert.deepEqual(loud, [], 'no warn or error log line');
}

/** Train-kind trajectory rows per step in the run's embedded database, and how many carry one image. */
async function trainedSteps(runDir: string): Promise<Array<{ step: number; n: number; imaged: number }>> {
  const store = await openStore({ kind: 'pglite', dir: join(runDir, 'db') });
  try {
    return (
      await sql<{ step: number; n: number; imaged: number }>`select step, count(*)::int as n,
        (count(*) filter (where cardinality(image_hashes) = 1))::int as imaged
        from trajectories where kind = 'train' group by step order by step`.execute(store.database.db)
    ).rows;
  } finally {
    await store.close();
  }
}

const qwen3 = tinyQwen3Config();

test('the verl GSM8K example trains two steps with verl-named overrides', { timeout: 150_000 }, async () => {
  const dir = join(tmp, 'verl');
  mkdirSync(dir, { recursive: true });
  const model = join(dir, 'Qwen3-tiny');
  const c = fromHfConfig(qwen3);
  writeHfModelDir(model, {
    config: qwen3,
    tensors: paramSpecs(c).map((s) => [s.name, s.shape]),
    weights: initWeights(c, 5, { std: 0.1 }),
    tokenizerFrom: QWEN3_TOKENIZER_DIR,
  });
  // verl's examples/data_preprocess/gsm8k.py row layout
  const qa = [
    ['Tom has 2 apples and gets 3 more. How many apples does he have?', '5'],
    ['A box holds 4 pens. One more is added. How many pens are there?', '5'],
    ['Sara had 7 cards and gave away 2. How many are left?', '5'],
    ['There is 1 cat and 1 dog. How many animals are there?', '2'],
  ];
  const data = join(dir, 'train.parquet');
  parquetWriteFile({
    filename: data,
    columnData: [
      { name: 'data_source', data: qa.map(() => 'openai/gsm8k') },
      {
        name: 'prompt',
        data: qa.map(([q]) => [
          { role: 'user', content: `${q} Let's think step by step and output the final answer after "####".` },
        ]),
      },
      { name: 'ability', data: qa.map(() => 'math') },
      { name: 'reward_model', data: qa.map(([, a]) => ({ ground_truth: a, style: 'rule' })) },
      { name: 'extra_info', data: qa.map(([q, a], i) => ({ split: 'train', index: i, answer: a, question: q })) },
    ],
  });
  const runDir = join(dir, 'run');
  const run = train([
    join(ROOT, 'examples/dialects/verl-gsm8k.yaml'),
    `data.train_files=${data}`,
    `data.val_files=${data}`,
    'data.train_batch_size=2',
    'data.max_prompt_length=48',
    'data.max_response_length=4',
    `actor_rollout_ref.model.path=${model}`,
    'actor_rollout_ref.rollout.n=2',
    'actor_rollout_ref.actor.ppo_mini_batch_size=2',
    'critic.ppo_mini_batch_size=2',
    'actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2',
    'actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4',
    'actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4',
    'trainer.total_training_steps=2',
    'trainer.total_epochs=1',
    'trainer.test_freq=-1',
    'trainer.save_freq=2',
    'trainer.logger=[console]',
    `trainer.default_local_dir=${runDir}`,
  ]);
  assertCleanStart(run, 'verl');
  assert.match(run.output, /actor_rollout_ref\.rollout\.gpu_memory_utilization/);
  assert.match(run.output, /global_step_2 \(step 2,/);
  assert.deepEqual(await trainedSteps(runDir), [
    { step: 1, n: 4, imaged: 0 },
    { step: 2, n: 4, imaged: 0 },
  ]);
});

test('the MTRL VPPO vision example trains two steps with MTRL-named overrides', { timeout: 150_000 }, async () => {
  const dir = join(tmp, 'mtrl');
  mkdirSync(dir, { recursive: true });
  // the vision number game's rows as a user's data file: images as PNG paths next to the JSONL
  const lines: string[] = [];
  for (const [i, r] of numberGameVision.generate(4, 3).entries()) {
    const { width, height, data } = r.image!;
    await sharp(Buffer.from(data), { raw: { width, height, channels: 3 } })
      .png()
      .toFile(join(dir, `game-${i}.png`));
    lines.push(JSON.stringify({ prompt: r.prompt, answer: r.answer, images: [`game-${i}.png`] }));
  }
  const data = join(dir, 'train.jsonl');
  writeFileSync(data, lines.join('\n') + '\n');
  const runDir = join(dir, 'run');
  const run = train([
    join(ROOT, 'examples/dialects/mtrl-vppo-vision.yaml'),
    'dataset.task=null',
    `dataset.train_files=${data}`,
    `dataset.val_files=${data}`,
    // the fresh policy's character tokenizer needs the prompts' alphabet (data.task gave it)
    `worker.actor.model.alphabet=${JSON.stringify(numberGameVision.alphabet)}`,
    'dataset.rollout_batch_size=2',
    'worker.rollout.n=2',
    'worker.actor.global_batch_size=2',
    'worker.actor.micro_batch_size_per_device_for_update=4',
    'worker.actor.micro_batch_size_per_device_for_experience=4',
    'worker.actor.ppo_epochs=1',
    'worker.actor.model.vision.depth=1',
    'training.max_steps=2',
    'training.save_freq=2',
    'training.val_before_train=false',
    'training.val_freq=-1',
    'training.logger=[console]',
    `training.save_checkpoint_path=${runDir}`,
  ]);
  assertCleanStart(run, 'MTRL');
  assert.match(run.output, /worker\.actor\.fsdp\.sharding_strategy/);
  assert.match(run.output, /global_step_2 \(step 2,/);
  assert.deepEqual(await trainedSteps(runDir), [
    { step: 1, n: 4, imaged: 4 },
    { step: 2, n: 4, imaged: 4 },
  ]);
});
