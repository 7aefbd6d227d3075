/**
 * LoRA on an image policy (actor.model.lora; lib/image/lora.ts) end to end, at a tiny shape:
 * `rlstream sft` with LoRA and EMA trains only the adapters (the base tensors of actor/ stay the
 * base's bytes, AdamW state of the adapters only), resumes after a stop to the same bytes of every
 * actor file (merged weights, adapter, AdamW state, EMA), draws its sample grid with the EMA, and
 * its actor/ is a directory `generate` draws from; `rlstream train` runs DiffusionNFT and Flow-GRPO
 * with LoRA on the base, whose versions move only the adapted weights, and a DiffusionNFT run stopped
 * after its first checkpoint resumes to the uninterrupted run's bytes.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig, type Config } from '../../lib/config/index.ts';
import { sftRun } from '../../app/sft.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { ditConfig, initDitWeights } from '../../lib/image/dit.ts';
import { loadDit, saveDit } from '../../lib/image/checkpoint.ts';
import { generateImage } from '../../lib/image/generate.ts';
import { imageToPng, gridPng } from '../../lib/image/png.ts';
import { gaussian, guidedVelocity, sampleImages } from '../../lib/image/sde.ts';
import { ImageTrainer } from '../../lib/image/trainer.ts';
import { decodeSafetensors, toFloat32 } from '../../lib/model/safetensors.ts';
import { FilesystemPolicyStore } from '../../lib/policy-store/filesystem-store.ts';
import { Rng } from '../../lib/util/rng.ts';
import type { ProgressBar } from '../../lib/console/progress.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/image-sft.yaml');
const tmp = join(ROOT, 'test/.tmp', `image-lora-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

const CHARS = ['A', 'O', 'T'];
const S = 16;
const shape = ditConfig({
  numClasses: 3,
  imageSize: S,
  patchSize: 4,
  hidden: 32,
  depth: 1,
  heads: 2,
  timeFreqs: 8,
});
const ADAPTED = ['blocks.0.qkv.weight', 'blocks.0.fc1.weight'];

const bytesOf = (dir: string) =>
  Object.fromEntries(
    readdirSync(dir)
      .sort()
      .map((f) => [f, readFileSync(join(dir, f)).toString('base64')]),
  );

test(
  'image policy LoRA: sft (EMA, resume to the same bytes, grid, generate), a DiffusionNFT and a Flow-GRPO step',
  { timeout: 300_000 },
  async () => {
    mkdirSync(tmp, { recursive: true });
    // the base: a DiT with every weight random (adaLN-Zero off, so the adapted layers matter)
    const base = join(tmp, 'base');
    const baseW = initDitWeights(shape, 7, { zeroInit: false });
    saveDit(base, { config: shape, classNames: CHARS, weights: baseW });
    const rng = Rng.fromSeed('image-lora-data');
    const rows: string[] = [];
    for (let k = 0; k < 2; k++)
      for (const ch of CHARS) {
        const png = await imageToPng(
          Float32Array.from(gaussian(rng, S * S), (x) => Math.tanh(x)),
          1,
          S,
        );
        rows.push(JSON.stringify({ prompt: ch, image: Buffer.from(png).toString('base64') }));
      }
    const data = join(tmp, 'rows.jsonl');
    writeFileSync(data, rows.join('\n') + '\n');

    // 6 images, 3 a step, 3 epochs: 6 steps, checkpoints at 2, 4, 6
    const cfgOf = (dir: string): Config =>
      loadConfig({
        file: CONFIG,
        command: 'sft',
        overrides: [
          `data.train_files=[${data}]`,
          `actor.model.path=${base}`,
          'actor.model.lora.rank=2',
          'actor.model.lora.alpha=4',
          'actor.model.lora.target_modules=[qkv,fc1]',
          'actor.model.enable_gradient_checkpointing=true',
          'actor.global_batch_size=3',
          'actor.optim.lr=0.01',
          'algorithm.ema.enable=true',
          'algorithm.ema.decay=0.5',
          'algorithm.image.eval_steps=2',
          'sft.epochs=3',
          'trainer.save_freq=2',
          `trainer.run_dir=${dir}`,
          'pipeline.run_id=img-lora',
        ],
      });
    const ref = await sftRun(cfgOf(join(tmp, 'ref')), silentLogger('img-lora'));
    assert.equal(ref.status, 'completed', ref.message);
    assert.equal(ref.checkpoint?.step, 6);
    const actor = join(ref.checkpoint!.path, 'actor');
    const trained = loadDit(actor).weights;
    for (const [k, w] of baseW) {
      if (ADAPTED.includes(k)) assert.notDeepEqual(trained.get(k), w, `${k} moved (merged adapter)`);
      else assert.deepEqual(trained.get(k), w, `${k} is the base's`);
    }
    const opt = decodeSafetensors(readFileSync(join(actor, 'optimizer.safetensors')), 'optimizer').tensors;
    assert.deepEqual(
      [...opt.keys()].map((k) => k.replace(/\.exp_avg(_sq)?$/, '')).filter((k, i, a) => a.indexOf(k) === i),
      [
        'blocks.0.qkv.lora_A.weight',
        'blocks.0.qkv.lora_B.weight',
        'blocks.0.fc1.lora_A.weight',
        'blocks.0.fc1.lora_B.weight',
      ],
      'AdamW state of the adapters only',
    );
    const files = bytesOf(actor);
    assert.ok(files['adapter.safetensors'] && files['ema.safetensors'], Object.keys(files).join(', '));

    // stopped after step 3 (checkpoint 2): the same command resumes to the same bytes of every actor file
    const ac = new AbortController();
    const bar = { update: (s: { step: number }) => s.step === 3 && ac.abort() } as unknown as ProgressBar;
    const cut = await sftRun(cfgOf(join(tmp, 'cut')), silentLogger('img-lora'), { bar, signal: ac.signal });
    assert.equal(cut.checkpoint?.step, 2);
    const again = await sftRun(cfgOf(join(tmp, 'cut')), silentLogger('img-lora'));
    assert.equal(again.checkpoint?.sha256, ref.checkpoint!.sha256);
    assert.deepEqual(
      bytesOf(join(again.checkpoint!.path, 'actor')),
      files,
      'weights, adapter, AdamW and EMA resume bit-exact',
    );

    // the sample grid is drawn with the EMA weights
    const emaT = decodeSafetensors(readFileSync(join(actor, 'ema.safetensors')), 'ema').tensors;
    const ema = new Map([...emaT].map(([k, t]) => [k, toFloat32(t, k, 'ema')]));
    assert.notDeepEqual(ema.get(ADAPTED[0]), trained.get(ADAPTED[0]), 'the EMA lags the weights');
    const tr = new ImageTrainer(
      shape,
      ema,
      { betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0, maxGradNorm: null, lr: 0 },
      { threads: 1 },
    );
    const cfg = cfgOf(join(tmp, 'ref'));
    const cls = [0, 1, 2];
    const { x0 } = await sampleImages(
      guidedVelocity((x, t, c) => tr.velocity(x, t, c), cfg.algorithm.image.cfg_scale, 3),
      {
        cls,
        pixels: S * S,
        steps: 2,
        rng: cls.map((k) => Rng.fromSeed(`${cfg.data.seed}/sft-grid/${k}`)),
      },
    );
    assert.deepEqual(
      readFileSync(join(tmp, 'ref', 'samples', 'global_step_6.png')),
      Buffer.from(await gridPng(x0, 1, S, 3)),
      'grid = the EMA weights’ samples',
    );

    // generate --image-out reads the LoRA run's actor/ (its merged weights)
    const png = await generateImage(actor, 'O', { steps: 2, seed: 1 });
    assert.equal(png[1], 0x50, 'a PNG');

    // rlstream train with LoRA on the base: one step each of DiffusionNFT and Flow-GRPO
    const prompts = join(tmp, 'prompts.jsonl');
    writeFileSync(prompts, CHARS.map((c) => JSON.stringify({ prompt: c, answer: c })).join('\n') + '\n');
    const trainCfg = (loss: string, dir: string, steps: number) =>
      loadConfig({
        overrides: [
          `actor.model.path=${base}`,
          'actor.model.lora.rank=2',
          'actor.model.lora.target_modules=[qkv,fc1]',
          `data.train_files=${prompts}`,
          'data.apply_chat_template=false',
          'data.rollout_batch_size=2',
          'data.max_prompt_length=8',
          'rollout.n=2',
          'actor.global_batch_size=4',
          'actor.micro_batch_size_per_device_for_update=4',
          'actor.micro_batch_size_per_device_for_experience=4',
          'actor.threads=1',
          'actor.optim.lr=0.01',
          `algorithm.policy_loss=${loss}`,
          'algorithm.image.steps=3',
          `algorithm.image.noise_level=${loss === 'flow_grpo' ? 0.7 : 0}`,
          `reward.reward_fn_path=${join(ROOT, 'test/e2e/fixtures/reward-brightness.mjs')}`,
          'trainer.total_epochs=2',
          `trainer.max_steps=${steps}`,
          'trainer.save_freq=1',
          'trainer.val_before_train=false',
          `trainer.run_dir=${dir}`,
          `pipeline.run_id=img-lora-${loss}`,
        ],
      });
    const ckActor = (dir: string, step: number) => join(dir, 'checkpoints', `global_step_${step}`, 'actor');
    for (const [loss, steps] of [
      ['diffusion_nft', 2],
      ['flow_grpo', 1],
    ] as const) {
      const dir = join(tmp, `train-${loss}`);
      const out = await trainEmbedded(trainCfg(loss, dir, steps), silentLogger('img-lora-train'));
      assert.equal(out.status, 'completed', out.message);
      const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
      try {
        const policies = new FilesystemPolicyStore(dir, `img-lora-${loss}`, store.database.db);
        const v1 = loadDit((await policies.get('policy', 1))!).weights;
        for (const [k, w] of baseW) {
          if (ADAPTED.includes(k)) assert.notDeepEqual(v1.get(k), w, `${loss}: ${k} moved`);
          else assert.deepEqual(v1.get(k), w, `${loss}: ${k} is the base's`);
        }
      } finally {
        await store.close();
      }
      assert.ok(readdirSync(ckActor(dir, steps)).includes('adapter.safetensors'), `${loss}: adapter checkpointed`);
    }
    // DiffusionNFT stopped once checkpoint 1 is written: the same command resumes to step 2's bytes
    const cutDir = join(tmp, 'train-cut');
    const stop = new AbortController();
    const poll = setInterval(() => existsSync(ckActor(cutDir, 1)) && stop.abort(), 20);
    try {
      const cut = await trainEmbedded(trainCfg('diffusion_nft', cutDir, 2), silentLogger('img-lora-train'), {
        signal: stop.signal,
      });
      assert.equal(cut.status, 'stopped', 'stopped before step 2');
    } finally {
      clearInterval(poll);
    }
    const resumed = await trainEmbedded(trainCfg('diffusion_nft', cutDir, 2), silentLogger('img-lora-train'));
    assert.equal(resumed.status, 'completed', resumed.message);
    assert.deepEqual(
      bytesOf(ckActor(cutDir, 2)),
      bytesOf(ckActor(join(tmp, 'train-diffusion_nft'), 2)),
      'RL with LoRA resumes to the same bytes',
    );
  },
);
