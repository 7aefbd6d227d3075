/**
 * `rlstream sft` of an image policy: a fresh DiT learns rendered glyphs (JSONL rows naming PNG
 * files relative to the data file, one base64 row, parquet rows of PNG bytes) by flow matching.
 * The loss falls; each checkpoint has a sample grid; a run stopped after its checkpoint resumes to
 * the uninterrupted run's sha256; condition dropout (sft.cfg_dropout) trains the null prompt (with
 * 0 its class row never moves, and its flow-matching loss stays above the dropout run's), so
 * `generate --cfg-scale` guides with it. The final actor/ trains one DiffusionNFT step under `rlstream train` with algorithm.ema on,
 * and the rollout's validation samples are drawn with the EMA weights, guided by cfg_scale.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import sharp from 'sharp';
import { parquetWriteFile } from 'hyparquet-writer';
import { loadConfig, type Config } from '../../lib/config/index.ts';
import { sftRun } from '../../app/sft.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { loadDit } from '../../lib/image/checkpoint.ts';
import { generateImage } from '../../lib/image/generate.ts';
import { ImageTrainer } from '../../lib/image/trainer.ts';
import { gaussian, guidedVelocity } from '../../lib/image/sde.ts';
import { sampleRequests } from '../../lib/image/trajectory.ts';
import { decodeImage } from '../../lib/image/png.ts';
import { FilesystemPolicyStore } from '../../lib/policy-store/filesystem-store.ts';
import { ImageSampler } from '../../lib/pipeline/image-policy.ts';
import { Rng } from '../../lib/util/rng.ts';
import type { ProgressBar } from '../../lib/console/progress.ts';
import { renderGlyph, TRAIN_FONTS } from '../../examples/glyphs/glyphs.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/image-sft.yaml');
const tmp = join(ROOT, 'test/.tmp', `image-sft-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

const CHARS = ['A', 'O', 'T'];
const S = 16;

/** 24 rows (8 renders of each of 3 glyphs): 17 JSONL rows naming PNG files, one base64, 6 parquet rows of bytes. */
async function writeData(): Promise<string[]> {
  const data = join(tmp, 'data');
  mkdirSync(join(data, 'img'), { recursive: true });
  const rng = Rng.fromSeed('image-sft-data');
  const jsonl: string[] = [];
  const pq: { prompt: string[]; image: Uint8Array[] } = { prompt: [], image: [] };
  for (let k = 0; k < 8; k++)
    for (const ch of CHARS) {
      const x = await renderGlyph(ch, TRAIN_FONTS[k % TRAIN_FONTS.length], 2 * S, {
        dx: (rng.next() - 0.5) * 2,
        dy: (rng.next() - 0.5) * 2,
        scale: 0.9 + 0.2 * rng.next(),
      });
      // rendered at 32×32: the reader scales to the model's 16×16
      const png = await sharp(Buffer.from(Uint8Array.from(x, (v) => Math.round((v + 1) * 127.5))), {
        raw: { width: 2 * S, height: 2 * S, channels: 1 },
      })
        .png()
        .toBuffer();
      if (k >= 6) {
        pq.prompt.push(ch);
        pq.image.push(new Uint8Array(png));
      } else if (k === 5 && ch === 'T') jsonl.push(JSON.stringify({ prompt: ch, image: png.toString('base64') }));
      else {
        writeFileSync(join(data, 'img', `${ch}${k}.png`), png);
        jsonl.push(JSON.stringify({ prompt: [{ role: 'user', content: ch }], image: [`img/${ch}${k}.png`] }));
      }
    }
  writeFileSync(join(data, 'rows.jsonl'), jsonl.join('\n') + '\n');
  parquetWriteFile({
    filename: join(data, 'rows.parquet'),
    columnData: [
      { name: 'prompt', data: pq.prompt },
      { name: 'image', data: pq.image, type: 'BYTE_ARRAY' },
    ],
  });
  return [join(data, 'rows.jsonl'), join(data, 'rows.parquet')];
}

const cfgOf = (files: string[], dir: string, extra: string[] = []): Config =>
  loadConfig({
    file: CONFIG,
    command: 'sft',
    overrides: [`data.train_files=[${files.join(',')}]`, `trainer.run_dir=${dir}`, 'pipeline.run_id=img', ...extra],
  });

async function losses(dir: string): Promise<number[]> {
  const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
  try {
    const ms = await store.getMetrics('img', ['sft/loss']);
    return ms.sort((a, b) => a.step - b.step).map((m) => m.value);
  } finally {
    await store.close();
  }
}

/** The flow-matching loss of the null prompt on fixed (x₀, ε, t) of the training glyphs. */
async function nullLoss(dir: string, images: Float32Array): Promise<number> {
  const m = loadDit(dir);
  const tr = new ImageTrainer(
    m.config,
    m.weights,
    { betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0, maxGradNorm: null, lr: 0 },
    { threads: 1 },
  );
  const px = S * S,
    B = images.length / px;
  const rng = Rng.fromSeed('null-loss');
  const eps = gaussian(rng, images.length);
  const t = Array.from({ length: B }, (_, i) => (i + 0.5) / B);
  const xt = new Float32Array(images.length);
  for (let i = 0; i < xt.length; i++) {
    const tb = t[Math.floor(i / px)];
    xt[i] = (1 - tb) * images[i] + tb * eps[i];
  }
  const v = await tr.velocity(xt, t, Array(B).fill(m.config.numClasses));
  let acc = 0;
  for (let i = 0; i < v.length; i++) acc += (v[i] - (eps[i] - images[i])) ** 2;
  return acc / v.length;
}

test(
  'rlstream sft learns an image policy by flow matching; resumes to the same sha256; cfg_dropout trains the null prompt; the result trains under rlstream train with EMA validation',
  { timeout: 300_000 },
  async () => {
    const files = await writeData();
    // reference: 40 steps (24 images, 12 per step, 20 epochs), checkpoints at 20 and 40
    const ref = await sftRun(cfgOf(files, join(tmp, 'ref')), silentLogger('img-sft'));
    assert.equal(ref.status, 'completed', ref.message);
    assert.equal(ref.checkpoint?.step, 40);
    const l = await losses(join(tmp, 'ref'));
    assert.equal(l.length, 40);
    const mean = (a: number[]) => a.reduce((x, y) => x + y, 0) / a.length;
    assert.ok(
      mean(l.slice(-5)) < 0.6 * mean(l.slice(0, 5)),
      `flow-matching loss falls: ${l.map((x) => x.toFixed(3)).join(' ')}`,
    );
    // a sample grid per checkpoint: one image of each of the 3 prompts, 16×16 with 1-pixel gutters
    for (const n of [20, 40]) {
      const grid = await sharp(join(tmp, 'ref', 'samples', `global_step_${n}.png`)).metadata();
      assert.deepEqual([grid.width, grid.height], [3 * 17 + 1, 18]);
    }
    const actor = join(ref.checkpoint!.path, 'actor');
    const model = loadDit(actor);
    assert.deepEqual(model.classNames, CHARS, "the prompts are the data's, sorted");

    // stopped after step 25 (checkpoint 20 written): the same command re-trains 21–40 to the same sha256
    const ac = new AbortController();
    const bar = { update: (s: { step: number }) => s.step === 25 && ac.abort() } as unknown as ProgressBar;
    const cut = await sftRun(cfgOf(files, join(tmp, 'cut')), silentLogger('img-sft'), { bar, signal: ac.signal });
    assert.equal(cut.status, 'stopped');
    assert.equal(cut.checkpoint?.step, 20);
    const again = await sftRun(cfgOf(files, join(tmp, 'cut')), silentLogger('img-sft'));
    assert.equal(again.checkpoint?.sha256, ref.checkpoint!.sha256, 'the resumed run ends on the reference sha256');

    // without condition dropout the null prompt's class row is never trained
    const plain = await sftRun(cfgOf(files, join(tmp, 'plain'), ['sft.cfg_dropout=0']), silentLogger('img-sft'));
    const K = CHARS.length,
      D = 32;
    const row = (dir: string) =>
      loadDit(dir)
        .weights.get('class_embed.weight')!
        .slice(K * D, (K + 1) * D);
    const v0 = row(join(ref.checkpoint!.path, 'reference'));
    assert.deepEqual(row(join(plain.checkpoint!.path, 'actor')), v0, 'cfg_dropout = 0: the null row stays at its init');
    assert.notDeepEqual(row(actor), v0, 'cfg_dropout > 0: the null row is trained');
    const imgs = new Float32Array(K * S * S);
    for (let c = 0; c < K; c++)
      imgs.set(await decodeImage(readFileSync(join(tmp, 'data', 'img', `${CHARS[c]}0.png`)), 1, S), c * S * S);
    const [withDrop, without] = [
      await nullLoss(actor, imgs),
      await nullLoss(join(plain.checkpoint!.path, 'actor'), imgs),
    ];
    assert.ok(withDrop < without, `null-prompt loss with dropout ${withDrop} < without ${without}`);

    // generate with guidance: another image than unguided, same bytes for the same seed
    const g1 = await generateImage(actor, 'A', { steps: 4, seed: 1 });
    const g3 = await generateImage(actor, 'A', { steps: 4, seed: 1, cfgScale: 3 });
    assert.notDeepEqual(g3, g1);
    assert.deepEqual(await generateImage(actor, 'A', { steps: 4, seed: 1, cfgScale: 3 }), g3);
    assert.equal((await sharp(g3).metadata()).width, S);

    // the SFT output is actor.model.path for rlstream train: one DiffusionNFT step, EMA on
    const rows = join(tmp, 'prompts.jsonl');
    writeFileSync(rows, CHARS.map((c) => JSON.stringify({ prompt: c, answer: c })).join('\n') + '\n');
    const trainDir = join(tmp, 'train');
    const tcfg = loadConfig({
      overrides: [
        `actor.model.path=${actor}`,
        `data.train_files=${rows}`,
        `data.val_files=${rows}`,
        'data.apply_chat_template=false',
        'data.rollout_batch_size=2',
        'data.max_prompt_length=8',
        'rollout.n=2',
        'actor.global_batch_size=4',
        'actor.micro_batch_size_per_device_for_update=4',
        'actor.micro_batch_size_per_device_for_experience=4',
        'actor.threads=1',
        'actor.optim.lr=0.003',
        'algorithm.policy_loss=diffusion_nft',
        'algorithm.image.steps=2',
        'algorithm.image.eval_steps=3',
        'algorithm.image.noise_level=0',
        'algorithm.image.cfg_scale=2',
        'algorithm.ema.enable=true',
        'algorithm.ema.decay=0.5',
        `reward.reward_fn_path=${join(ROOT, 'test/e2e/fixtures/reward-brightness.mjs')}`,
        'trainer.max_steps=1',
        'trainer.val_freq=1',
        `trainer.run_dir=${trainDir}`,
        'pipeline.run_id=img-train',
      ],
    });
    const out = await trainEmbedded(tcfg, silentLogger('img-train'));
    assert.equal(out.status, 'completed', out.message);

    // validation of version 1 samples with its EMA weights (guided): what ImageSampler draws is the EMA's image
    const store = await openStore({ kind: 'pglite', dir: join(trainDir, 'db') });
    try {
      const policies = new FilesystemPolicyStore(trainDir, 'img-train', store.database.db);
      const ema = loadDit((await policies.get('ema', 1))!).weights;
      const pol = loadDit((await policies.get('policy', 1))!).weights;
      assert.notDeepEqual(ema.get('final.linear.weight'), pol.get('final.linear.weight'), 'the EMA lags the policy');
      const requests = CHARS.map((c, i) => ({ id: `val-${i}`, prompt: c, val: true }));
      const drawn = await new ImageSampler(tcfg, policies).generate(1, store.database.db, requests);
      const tr = new ImageTrainer(
        model.config,
        ema,
        { betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0, maxGradNorm: null, lr: 0 },
        { threads: 1 },
      );
      const byHand = (w: typeof ema) =>
        sampleRequests(
          guidedVelocity((x, t, c) => tr.velocity(x, t, c, w), 2, K),
          requests.map((r, i) => ({ id: r.id, cls: i })),
          { channels: 1, size: S, steps: 3, noiseLevel: 0, seed: tcfg.data.seed },
        );
      const [fromEma, fromPolicy] = [await byHand(ema), await byHand(pol)];
      assert.deepEqual(
        drawn.map((d) => d.generated.hash),
        fromEma.map((d) => d.generated.hash),
        'validation draws with the EMA weights',
      );
      assert.notDeepEqual(
        fromPolicy.map((d) => d.generated.hash),
        fromEma.map((d) => d.generated.hash),
      );
    } finally {
      await store.close();
    }
  },
);
