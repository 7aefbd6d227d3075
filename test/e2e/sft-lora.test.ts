/**
 * `rlstream sft` with actor.model.lora end to end, on a small Hugging Face Qwen3 directory (the
 * real tokenizer and chat template): the base stays frozen and every checkpoint's actor/ is a PEFT
 * adapter (AdamW state for the adapters only); killed after a step, the same command resumes from
 * the newest checkpoint and ends with the uninterrupted run's adapter (same sha256, same losses);
 * `rlstream export --merge` of the final checkpoint is the actor.model.path `rlstream train` runs
 * GRPO from (its policy v0 is the merged model) while the adapter directory itself is refused
 * there with the command to run; and the bad inputs (rank 0, a target matching no module, an
 * adapter of another base) are one line each. About 30 s on 2 cores.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { loadConfig } from '../../lib/config/index.ts';
import { sftRun } from '../../app/sft.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { fromHfConfig } from '../../lib/model/config.ts';
import { initWeights } from '../../lib/model/init.ts';
import { paramSpecs } from '../../lib/model/params.ts';
import { loadAdapter, loadCheckpoint } from '../../lib/model/checkpoint.ts';
import { mergeLoraOnnx } from '../../lib/model/lora-merge.ts';
import { decodeSafetensors } from '../../lib/model/safetensors.ts';
import { openStore } from '../../lib/store/index.ts';
import {
  writeHfModelDir,
  tinyQwen3Config,
  QWEN3_GENERATION_IDS,
  QWEN3_TOKENIZER_DIR,
} from '../support/hf-model-dir.ts';
import { deadline, killHard, selfKilledAt, spawnCli, type CliProc } from '../support/chaos-procs.ts';

const ROOT = join(import.meta.dirname, '../..');
const RUN_ID = 'e2e-sft-lora';
const tmp = join(ROOT, 'test/.tmp', `sft-lora-${process.pid}`);
const procs: CliProc[] = [];
after(async () => {
  for (const p of procs) await killHard(p);
  rmSync(tmp, { recursive: true, force: true });
});

const hf = (hidden: number) =>
  tinyQwen3Config({
    hidden_size: hidden,
    intermediate_size: 2 * hidden,
    head_dim: hidden / 4,
    max_position_embeddings: 128,
  });
const generation = QWEN3_GENERATION_IDS;
const cli = (...args: string[]): string =>
  execFileSync(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), ...args], {
    encoding: 'utf8',
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
/** The one-line message of a failing CLI command (stderr). */
const cliError = (...args: string[]): string => {
  try {
    cli(...args);
  } catch (e) {
    return String((e as { stderr?: string }).stderr ?? e);
  }
  assert.fail(`rlstream ${args.join(' ')} did not fail`);
};

function modelDir(dir: string, hidden: number, seed: number): string {
  const config = hf(hidden),
    c = fromHfConfig(config);
  writeHfModelDir(dir, {
    config,
    generation,
    tensors: paramSpecs(c).map((s) => [s.name, s.shape]),
    weights: initWeights(c, seed, { std: 0.1 }),
    dtype: 'float32',
    tokenizerFrom: QWEN3_TOKENIZER_DIR,
  });
  return dir;
}

test(
  'rlstream sft with actor.model.lora: PEFT checkpoints of a frozen base, resume after a kill to the same sha256, export --merge → train',
  { timeout: 300_000 },
  async () => {
    mkdirSync(tmp, { recursive: true });
    const base = modelDir(join(tmp, 'Qwen3-tiny'), 32, 5);
    const baseBytes = readFileSync(join(base, 'model.safetensors'));
    const rows = join(tmp, 'rows.jsonl');
    // 20 rows: 5 steps of 4 per epoch
    writeFileSync(
      rows,
      Array.from({ length: 20 }, (_, i) =>
        JSON.stringify({ prompt: `What is ${i % 7} + ${i % 5}?`, response: `${(i % 7) + (i % 5)}` }),
      ).join('\n') + '\n',
    );
    const LORA = 'actor.model.lora={rank: 4, alpha: 8, target_modules: [q_proj, v_proj, down_proj]}';
    const overrides = (dir: string) => [
      `data.train_files=${rows}`,
      `actor.model.path=${base}`,
      LORA,
      'data.chat_template_kwargs={enable_thinking: false}',
      'actor.optim.lr=2e-2',
      'actor.global_batch_size=4',
      'actor.micro_batch_size_per_device_for_update=2',
      'sft.epochs=1',
      'sft.max_length=64',
      'trainer.save_freq=2',
      'trainer.logger=[console]',
      `trainer.run_dir=${dir}`,
      `pipeline.run_id=${RUN_ID}`,
    ];
    const CONFIG = join(ROOT, 'test/e2e/fixtures/sft-tiny.yaml');

    // ── uninterrupted
    const refDir = join(tmp, 'reference');
    const ref = await sftRun(
      loadConfig({ file: CONFIG, command: 'sft', overrides: overrides(refDir) }),
      silentLogger(RUN_ID),
    );
    assert.equal(ref.status, 'completed');
    assert.equal(ref.checkpoint?.step, 5);
    assert.match(ref.summary, /LoRA adapter .*--merge/);
    const actor = join(ref.checkpoint!.path, 'actor');
    for (const f of ['adapter_config.json', 'adapter_model.safetensors', 'optimizer.safetensors', 'tokenizer.json'])
      assert.ok(existsSync(join(actor, f)), `actor/${f}`);
    assert.ok(
      !existsSync(join(actor, 'model.safetensors')) && !existsSync(join(actor, 'config.json')),
      'the checkpoint carries no base weights',
    );
    const pc = JSON.parse(readFileSync(join(actor, 'adapter_config.json'), 'utf8'));
    assert.deepEqual(
      [pc.peft_type, pc.r, pc.lora_alpha, pc.target_modules, pc.base_model_name_or_path],
      ['LORA', 4, 8, ['q_proj', 'v_proj', 'down_proj'], base],
    );
    const names = [...decodeSafetensors(readFileSync(join(actor, 'adapter_model.safetensors'))).tensors.keys()].sort();
    assert.equal(names.length, 2 * 3 * 2);
    assert.ok(
      names.includes('base_model.model.model.layers.1.mlp.down_proj.lora_B.weight') &&
        names.includes('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight'),
      names.join(),
    );
    const baseCk = await loadCheckpoint(base, { optimizer: false });
    const ad = await loadAdapter(actor, baseCk.config, { optimizer: true });
    assert.ok(
      [...ad.adapter].some(([k, w]) => k.endsWith('lora_B.weight') && w.some((x) => x !== 0)),
      'the adapters were trained',
    );
    assert.equal(ad.optimizer?.step, 5);
    assert.equal(ad.optimizer?.expAvg.size, 12, 'AdamW state for the adapters only');
    assert.ok(readFileSync(join(base, 'model.safetensors')).equals(baseBytes), 'the base model directory is untouched');
    const v0 = await loadAdapter(join(ref.checkpoint!.path, 'reference'), baseCk.config);
    assert.ok(
      [...v0.adapter].every(([k, w]) => !k.endsWith('lora_B.weight') || w.every((x) => x === 0)),
      'the reference is the base: B = 0',
    );
    assert.ok(statSync(join(actor, 'adapter_model.safetensors')).size < 0.01 * baseBytes.length);
    const lossesOf = async (dir: string) => {
      const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
      try {
        const losses = (
          await sql<{
            step: number;
            value: number;
          }>`select step, value from step_metrics where run_id = ${RUN_ID} and name = 'sft/loss' order by step`.execute(
            store.database.db,
          )
        ).rows;
        return { losses, checkpoints: (await store.listCheckpoints(RUN_ID)).map((c) => [c.step, c.sha256]) };
      } finally {
        await store.close();
      }
    };
    const want = await lossesOf(refDir);
    assert.deepEqual(
      want.checkpoints.map((c) => c[0]),
      [2, 4, 5],
    );
    assert.ok(
      want.losses[4].value < want.losses[0].value,
      `the loss falls (${want.losses[0].value} → ${want.losses[4].value})`,
    );

    // ── killed after step 3 (its newest checkpoint is step 2's), then the same command again
    const dir = join(tmp, 'crashed');
    const args = ['sft', CONFIG, ...overrides(dir)];
    const killed = spawnCli(args, { RLSTREAM_CRASH_AT: 'sft:trained@3' });
    procs.push(killed);
    const ex = await Promise.race([killed.exit, deadline(120_000)]);
    assert.equal(ex?.signal, 'SIGKILL', killed.output().slice(-3000));
    assert.equal(selfKilledAt(killed.output()), 'sft:trained@3');
    const resumed = spawnCli(args);
    procs.push(resumed);
    const done = await Promise.race([resumed.exit, deadline(120_000)]);
    assert.equal(done?.code, 0, resumed.output().slice(-3000));
    assert.match(resumed.output(), /resumed at step 2 /);
    const got = await lossesOf(dir);
    assert.deepEqual(got.checkpoints, want.checkpoints, 'the same adapter checkpoints, byte for byte');
    assert.deepEqual(got.losses, want.losses, 'the same per-step losses');

    // ── continuing with RL: export --merge, then train from the merged model
    const merged = join(tmp, 'merged');
    assert.match(cli('export', ref.checkpoint!.path, '--merge', '--out', merged), /merged .*LoRA rank 4/);
    const m = await loadCheckpoint(merged, { optimizer: false });
    const expect = await mergeLoraOnnx(baseCk.config, ad.lora, baseCk.weights, ad.adapter);
    const bytes = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
    for (const [k, w] of expect)
      assert.ok(bytes(w).equals(bytes(m.weights.get(k)!)), `merged = base + (alpha/r)·B·A (${k})`);
    const rlRows = join(tmp, 'rl.jsonl');
    writeFileSync(
      rlRows,
      ['1 + 2', '3 + 1', '2 + 2', '4 + 1']
        .map((q, i) => JSON.stringify({ prompt: `What is ${q}?`, answer: String([3, 4, 4, 5][i]) }))
        .join('\n') + '\n',
    );
    const rlDir = join(tmp, 'grpo');
    const rlOverrides = (path: string) => [
      `data.train_files=${rlRows}`,
      'data.max_prompt_length=48',
      'data.max_response_length=4',
      'data.rollout_batch_size=4',
      'data.chat_template_kwargs={enable_thinking: false}',
      'algorithm.adv_estimator=grpo',
      'rollout.n=2',
      `actor.model.path=${path}`,
      'actor.model.max_seq_len=64',
      'actor.global_batch_size=8',
      'actor.micro_batch_size_per_device_for_update=8',
      'actor.micro_batch_size_per_device_for_experience=8',
      'reward.reward_fn=exact_match',
      `trainer.run_dir=${rlDir}`,
      'pipeline.run_id=e2e-sft-lora-grpo',
      'trainer.max_steps=1',
      'trainer.val_before_train=false',
      'trainer.val_freq=-1',
    ];
    const rl = await trainEmbedded(loadConfig({ overrides: rlOverrides(merged) }), silentLogger('e2e-sft-lora-grpo'));
    assert.equal(rl.status, 'completed', rl.message);
    const p0 = await loadCheckpoint(join(rlDir, 'policy', 'v000000'), { optimizer: false });
    for (const [k, w] of m.weights)
      assert.ok(bytes(w).equals(bytes(p0.weights.get(k)!)), `the GRPO run starts from the merged SFT model (${k})`);

    // ── bad input, one line each
    assert.match(
      cliError(
        'train',
        ...rlOverrides(actor)
          .map((o) => o.replace('e2e-sft-lora-grpo', 'e2e-bad'))
          .concat([`trainer.run_dir=${join(tmp, 'bad')}`]),
      ),
      /is a LoRA adapter .*rlstream export .* --merge --out DIR/,
    );
    assert.match(
      cliError(
        'sft',
        CONFIG,
        ...overrides(join(tmp, 'bad-rank')).map((o) => (o === LORA ? 'actor.model.lora={rank: 0}' : o)),
      ),
      /actor\.model\.lora\.rank must be an integer ≥ 1/,
    );
    assert.match(
      cliError(
        'sft',
        CONFIG,
        ...overrides(join(tmp, 'bad-target')).map((o) =>
          o === LORA ? 'actor.model.lora={rank: 4, target_modules: [qkv]}' : o,
        ),
      ),
      /"qkv" matches no module of the model; valid module names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj/,
    );
    // the base directory replaced by another model (wider): the run's adapter checkpoint no longer fits it
    rmSync(base, { recursive: true });
    modelDir(base, 64, 6);
    const wrongBase =
      /adapter_model\.safetensors: tensor base_model\.model\.model\.layers\.0\.self_attn\.q_proj\.lora_A\.weight has shape \[4,32\], the base model \(qwen3, 2 layers, hidden 64, ffn 128\) needs \[4,64\]; the adapter was trained on another base model/;
    assert.match(cliError('sft', CONFIG, ...overrides(dir), 'trainer.resume_with_changed_config=true'), wrongBase); // (this process's pipeline.* env differs from spawnCli's)
    assert.match(cliError('export', ref.checkpoint!.path, '--merge', '--out', join(tmp, 'bad-merge')), wrongBase);
  },
);
