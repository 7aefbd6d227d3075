/**
 * A Qwen2.5-VL directory end to end (test/support/qwen-vl-dir.ts: Hugging Face layout, bf16
 * shards, preprocessor_config.json, chat_template.json, the real Qwen tokenizer; random weights):
 * `rlstream generate --chat` with two `--image`s answers greedily exactly as the independent
 * PyTorch model (test/torch/qwen_vl_ref.py) continues the same prompt ids and pixels; GRPO with
 * VPPO (patch blackening on the processor's patch grid), LoRA on the decoder and the tower, gradient
 * checkpointing plays the vision number game for 2 steps, and the same command SIGKILLed after
 * step 2's advantage stage and run again ends with the uninterrupted run's checkpoint sha256;
 * `rlstream export --merge` writes the source's tensor names, dtypes (bf16) and shapes
 * with the processor and template files.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import sharp from 'sharp';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { decodeSafetensors } from '../../lib/model/safetensors.ts';
import { openStore } from '../../lib/store/index.ts';
import { Rng } from '../../lib/util/rng.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { i64, f32, readTensors, runTorch, torchPython, writeTensors } from '../../devkit/torch-ref.ts';
import { killHard, resumeLines, selfKilledAt, spawnCli, type CliProc } from '../support/chaos-procs.ts';
import { QWEN_VL_TOKENS, writeQwenVlDir } from '../../devkit/qwen-vl-dir.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'qwen-vl-e2e';
const tmp = join(ROOT, 'test/.tmp', `qwen-vl-${process.pid}`);
const procs: CliProc[] = [];
after(async () => {
  for (const p of procs) await killHard(p);
  rmSync(tmp, { recursive: true, force: true });
});
const torch = torchPython();
const cli = (...args: string[]) =>
  execFileSync(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), ...args], { encoding: 'utf8', cwd: ROOT });

const overrides = (src: string, dir: string) => [
  `trainer.run_dir=${dir}`,
  `pipeline.run_id=${RUN_ID}`,
  'trainer.max_steps=2',
  'trainer.save_freq=1',
  'data.task=number_game_vision',
  'reward.reward_fn=number_game_vision',
  'data.task_size.train=8',
  'data.task_size.val=0',
  'data.rollout_batch_size=2',
  'rollout.n=2',
  'actor.global_batch_size=4',
  'actor.micro_batch_size_per_device_for_update=4',
  'actor.micro_batch_size_per_device_for_experience=4',
  // the 84×28 game images on this model's 8-px grid (patch 4 × merge 2): 80×32, 40 image tokens
  'data.min_pixels=256',
  'data.max_pixels=4096',
  'data.image_factor=8',
  'data.max_prompt_length=96',
  'data.max_response_length=4',
  `actor.model.path=${src}`,
  'actor.model.max_seq_len=112',
  'actor.model.lora.rank=8',
  'actor.model.lora.vision_target_modules=all-linear',
  'actor.model.enable_gradient_checkpointing=true',
  'algorithm.vppo.enable=true',
  'algorithm.vppo.patch_size=4',
];

function pixels(w: number, h: number, seed: number): Uint8Array {
  const rng = Rng.fromSeed(`qvl-e2e:${seed}`);
  return Uint8Array.from({ length: w * h * 3 }, () => Math.floor(rng.next() * 256));
}

test(
  'Qwen2.5-VL directory: generate with images as torch does, VPPO GRPO with LoRA resumes after SIGKILL to the same sha256, export --merge',
  { timeout: 300_000 },
  async () => {
    const src = join(tmp, 'Qwen2.5-VL-tiny');
    mkdirSync(tmp, { recursive: true });
    writeQwenVlDir(src, { seed: 2 });

    // ── generate: two images on the processor's grid (kept as they are), greedy, vs torch
    const imgs = [pixels(16, 24, 1), pixels(24, 16, 2)];
    const sizes: [number, number][] = [
      [16, 24],
      [24, 16],
    ];
    const files = await Promise.all(
      imgs.map(async (px, i) => {
        const f = join(tmp, `img${i}.png`);
        await sharp(Buffer.from(px), { raw: { width: sizes[i][0], height: sizes[i][1], channels: 3 } })
          .png()
          .toFile(f);
        return f;
      }),
    );
    const out = JSON.parse(
      cli(
        'generate',
        src,
        '--chat',
        '--image',
        files[0],
        '--image',
        files[1],
        '--prompt',
        'Which is brighter, <image> or <image>?',
        '--temperature',
        '0',
        '--max-new-tokens',
        '6',
        '--json',
      )
        .trim()
        .split('\n')
        .at(-1)!,
    ) as { prompt_ids: number[]; response_ids: number[] };
    const { imagePad, visionStart, visionEnd } = QWEN_VL_TOKENS;
    assert.equal(out.prompt_ids.filter((t) => t === visionStart).length, 2);
    assert.equal(out.prompt_ids.filter((t) => t === imagePad).length, 12, '2 images × 6 merged patches');
    assert.equal(out.prompt_ids.at(-1), 198, 'ends with the generation prompt "<|im_start|>assistant\\n"');
    if (torch.python) {
      const inp = join(tmp, 'g-in.safetensors'),
        res = join(tmp, 'g-out.safetensors');
      const P = out.prompt_ids.length;
      writeTensors(inp, {
        input_ids: i64(out.prompt_ids, [1, P]),
        attention_mask: i64(new Array(P).fill(1), [1, P]),
        loss_mask: f32(new Array(P - 1).fill(1), [1, P - 1]),
        'image.0': { dtype: 'U8', shape: [24, 16, 3], data: imgs[0] },
        'image.1': { dtype: 'U8', shape: [16, 24, 3], data: imgs[1] },
        greedy_prompt: i64(out.prompt_ids, [1, P]),
        greedy_images: i64([0, 1], [2]),
      });
      await runTorch('qwen_vl.py', [
        '--model',
        src,
        '--inputs',
        inp,
        '--out',
        res,
        '--suppress',
        [imagePad, visionStart, visionEnd].join(','),
        '--greedy',
        String(out.response_ids.length),
      ]);
      const want = Array.from(readTensors(res).get('greedy')!.data as BigInt64Array, Number);
      assert.deepEqual(out.response_ids, want, 'greedy response equals the torch reference');
    }

    // ── VPPO GRPO with LoRA: uninterrupted, then SIGKILLed and run again
    const refDir = join(tmp, 'reference');
    const run = await trainEmbedded(
      loadConfig({ file: CONFIG, overrides: overrides(src, refDir) }),
      silentLogger(RUN_ID),
    );
    assert.equal(run.status, 'completed', run.message);
    const st = await openStore({ kind: 'pglite', dir: join(refDir, 'db') });
    const [refCk, rows] = await Promise.all([
      st.latestCheckpoint(RUN_ID),
      st.getTrajectories(RUN_ID, { kind: 'train' }),
    ]).finally(() => st.close());
    assert.equal(refCk?.step, 2);
    const trained = rows.filter((r) => !r.filtered);
    assert.ok(trained.length > 0);
    for (const r of trained) {
      assert.equal(r.imageHashes.length, 1, `${r.id}: one prompt image`);
      assert.ok(r.vppoPerturbedLogprobs && r.vppoTokenMask, `${r.id}: VPPO's perturbed pass and mask stored`);
      assert.ok(
        r.vppoPerturbedLogprobs.some((x, t) => Math.abs(x - r.oldLogprobs![t]) > 1e-6),
        `${r.id}: blackened patches change the log-probs`,
      );
    }
    const dir = join(tmp, 'crashed');
    const args = ['train', CONFIG, ...overrides(src, dir)];
    const killed = spawnCli(args, { RLSTREAM_CRASH_AT: 'advantage:computed@2' });
    procs.push(killed);
    assert.equal((await killed.exit).signal, 'SIGKILL', killed.output().slice(-2000));
    assert.equal(selfKilledAt(killed.output()), 'advantage:computed@2');
    const again = spawnCli(args);
    procs.push(again);
    assert.equal((await again.exit).code, 0, again.output().slice(-2000));
    assert.equal(resumeLines(again.output()).length, 1, 'the rerun resumed from a checkpoint');
    const s2 = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
    const latest = await s2.latestCheckpoint(RUN_ID).finally(() => s2.close());
    assert.deepEqual([latest?.step, latest?.sha256], [2, refCk!.sha256], 'same final checkpoint');

    // ── export --merge: the source's names, dtypes and shapes; processor and template files copied
    const ckptActor = join(refDir, 'checkpoints', 'global_step_2', 'actor');
    const merged = join(tmp, 'merged');
    // the adapter holds the tower's blocks too, with PEFT's names; export keeps the source's bf16 by default
    const adapterNames = [
      ...decodeSafetensors(readFileSync(join(ckptActor, 'adapter_model.safetensors')), 'adapter').tensors.keys(),
    ];
    assert.ok(adapterNames.includes('base_model.model.visual.blocks.0.attn.qkv.lora_A.weight'));
    assert.ok(adapterNames.includes('base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight'));
    assert.match(cli('export', ckptActor, '--merge', '--base', src, '--out', merged), /, bf16\)/);
    for (const f of ['preprocessor_config.json', 'chat_template.json', 'tokenizer.json', 'config.json'])
      assert.ok(existsSync(join(merged, f)), `export has ${f}`);
    const header = (d: string) => {
      const m = new Map<string, string>();
      for (const f of readdirSync(d).filter((x) => x.endsWith('.safetensors')))
        for (const [k, t] of decodeSafetensors(readFileSync(join(d, f)), f).tensors)
          m.set(k, `${t.dtype}[${t.shape.join(',')}]`);
      return [...m].sort(([a], [b]) => a.localeCompare(b));
    };
    assert.deepEqual(header(merged), header(src));
    const cfgOut = JSON.parse(readFileSync(join(merged, 'config.json'), 'utf8'));
    const cfgSrc = JSON.parse(readFileSync(join(src, 'config.json'), 'utf8'));
    assert.deepEqual(cfgOut.architectures, ['Qwen2_5_VLForConditionalGeneration']);
    assert.deepEqual(cfgOut.vision_config, cfgSrc.vision_config);
    assert.deepEqual(cfgOut.rope_scaling, cfgSrc.rope_scaling);
  },
);
