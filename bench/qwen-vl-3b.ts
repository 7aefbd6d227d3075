/**
 * Qwen2.5-VL at the 3B shape (Qwen2.5-VL-3B-Instruct's config, random weights, stored bf16 in eight
 * shards; the release has two), on the CPU with `--threads` (default 2) onnxruntime threads:
 *   1. a LoRA rank-16 GRPO update step (all-linear decoder adapters, gradient checkpointing in the
 *      tower and the decoder, PPO-clip loss) over `--samples` samples (default 2, micro-batches of
 *      1), each one 448×448 image (1024 patches → 256 image tokens) + 16 text tokens of prompt and
 *      256 response tokens: step seconds and the process's peak RSS (goal ≤ 20 GB), which includes
 *      reading the base model (f32 weights: 15 GB at 3.75 B parameters);
 *   2. sampling: 2 samples × 256 new tokens from that prompt (no stop token), tokens/s of one
 *      call that includes the session build, the tower and the prefill (a second call would double
 *      the phase's minutes at this shape);
 *   3. one image: preprocess (PNG decode, smart_resize, RGB pixels, patches in merge-window order)
 *      and encode (the vision tower alone, to the merged image tokens), median of 3 after a warm-up.
 * Each measurement runs in its own child process, so each peak RSS is its own. `--shape tiny` runs
 * the same code on the tiny test shape (64×64 image, 16 response tokens) in seconds.
 *
 *   node --import tsx bench/qwen-vl-3b.ts --out DIR [--shape 3b|tiny] [--threads 2] [--samples 2]
 *
 * Writes DIR/model (the random directory; kept for reruns), DIR/qwen-vl-3b.json (the rows and the
 * machine) and prints a markdown table.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join, resolve } from 'node:path';
import sharp from 'sharp';
import { writeQwenVlDir } from '../devkit/qwen-vl-dir.ts';
import { decodePixels, prepareImage } from '../lib/data/images.ts';
import { loadCheckpoint } from '../lib/model/checkpoint.ts';
import type { ModelConfig } from '../lib/model/config.ts';
import { loraConfig } from '../lib/model/lora.ts';
import { paramSpecs } from '../lib/model/params.ts';
import { readImageProcessor } from '../lib/model/processor.ts';
import { Sampler } from '../lib/model/sample.ts';
import { createTrainer, type TrainBatch } from '../lib/model/train.ts';
import { expandImagePads, imageTokenCount, visionFeeds, visionTower, type ImagePixels } from '../lib/model/vision.ts';
import { GraphBuilder, type Var } from '../lib/onnx/builder.ts';
import { createSession, tensor, type ort } from '../lib/onnx/runtime.ts';
import { Rng } from '../lib/util/rng.ts';

type Shape = '3b' | 'tiny';
const SIZES: Record<Shape, { side: number; response: number }> = {
  '3b': { side: 448, response: 256 },
  tiny: { side: 64, response: 16 },
};

function args(): { out: string; shape: Shape; threads: number; samples: number; phase: string | null } {
  const a = process.argv.slice(2);
  const flag = (n: string): string | undefined => {
    const i = a.indexOf(`--${n}`);
    return i >= 0 ? a[i + 1] : undefined;
  };
  const out = flag('out');
  const shape = (flag('shape') ?? '3b') as Shape;
  const threads = Number(flag('threads') ?? 2),
    samples = Number(flag('samples') ?? 2);
  if (!out || !(shape in SIZES) || !(threads >= 1) || !(Number.isInteger(samples) && samples >= 1)) {
    process.stderr.write(
      'usage: node --import tsx bench/qwen-vl-3b.ts --out DIR [--shape 3b|tiny] [--threads 2] [--samples 2]\n',
    );
    process.exit(2);
  }
  return { out: resolve(out), shape, threads, samples, phase: flag('phase') ?? null };
}

const gb = (bytes: number) => bytes / 1e9;
const peakRssGb = () => (process.resourceUsage().maxRSS * 1024) / 1e9;

/** A 448×448 (or tiny) photo-like PNG: smooth gradients plus noise, so PNG decoding does real work. */
async function pngImage(side: number): Promise<Buffer> {
  const rng = Rng.fromSeed('qwen-vl-bench:image');
  const px = Buffer.alloc(side * side * 3);
  for (let y = 0; y < side; y++)
    for (let x = 0; x < side; x++)
      for (let c = 0; c < 3; c++)
        px[(y * side + x) * 3 + c] = Math.min(255, Math.floor(((x + y * (c + 1)) % 256) * 0.8 + rng.int(52)));
  return sharp(px, { raw: { width: side, height: side, channels: 3 } })
    .png()
    .toBuffer();
}

/** The processor's path for one image: decode + smart_resize (prepareImage), RGB pixels. */
async function preprocess(dir: string, c: ModelConfig, png: Buffer): Promise<ImagePixels> {
  const p = readImageProcessor(dir, c)!;
  const v = c.vision!;
  const img = await prepareImage(png, {
    factor: v.patchSize * v.spatialMergeSize,
    minPixels: p.minPixels,
    maxPixels: p.maxPixels,
    resample: 'bicubic',
  });
  return decodePixels(img.png);
}

/** A chat prompt with the image block (<|vision_start|> pads <|vision_end|>) and 16 text tokens. */
function prompt(c: ModelConfig, img: ImagePixels): number[] {
  const v = c.vision!;
  const text = Array.from({ length: 12 }, (_, i) => 1000 + 37 * i);
  return expandImagePads(
    c,
    [151644, 872, 198, v.visionStartTokenId, v.imageTokenId, v.visionEndTokenId, ...text, 151645, 198],
    [img],
  );
}

async function phaseUpdate(dir: string, threads: number, samples: number, response: number, side: number) {
  const t0 = performance.now();
  const ck = await loadCheckpoint(dir, { optimizer: false });
  const loadS = (performance.now() - t0) / 1000;
  const c = ck.config;
  const img = await preprocess(dir, c, await pngImage(side));
  const p = prompt(c, img);
  const T = p.length + response,
    n = samples * T;
  const rng = Rng.fromSeed('qwen-vl-bench:batch');
  const tokens = new Int32Array(n),
    mask = new Float32Array(n);
  for (let s = 0; s < samples; s++) {
    tokens.set(p, s * T);
    for (let t = p.length; t < T; t++) {
      tokens[s * T + t] = 200 + rng.int(30000);
      mask[s * T + t] = 1;
    }
  }
  const batch: TrainBatch = {
    batchSize: samples,
    seqLen: T,
    tokens,
    responseMask: mask,
    advantages: Float32Array.from({ length: n }, (_, i) => (Math.floor(i / T) % 2 ? -1 : 1)),
    oldLogprobs: Float32Array.from({ length: n }, () => -10 - rng.next()),
    images: Array.from({ length: samples }, () => [img]),
  };
  const rssLoaded = process.memoryUsage().rss;
  const trainer = createTrainer({
    model: c,
    loss: { type: 'policy' },
    weights: ck.weights,
    lora: loraConfig({ rank: 16, alpha: 32, targetModules: 'all-linear' }),
    gradientCheckpointing: true,
    microBatchSize: 1,
    threads,
    seed: 1,
  });
  const t1 = performance.now();
  const m = await trainer.step(batch, 1e-5);
  const stepS = (performance.now() - t1) / 1000;
  return {
    load_s: loadS,
    step_s: stepS,
    samples,
    seq_len: T,
    image_tokens: imageTokenCount(c.vision!, img),
    rss_after_load_gb: gb(rssLoaded),
    peak_rss_gb: peakRssGb(),
    loss_finite: Object.values(m.metrics).every((x) => Number.isFinite(x)),
  };
}

async function phaseSample(dir: string, threads: number, response: number, side: number) {
  const ck = await loadCheckpoint(dir, { optimizer: false });
  const c = ck.config;
  const img = await preprocess(dir, c, await pngImage(side));
  const p = prompt(c, img);
  const rssLoaded = process.memoryUsage().rss;
  const sampler = new Sampler(c, { threads });
  const reqs = [0, 1].map((i) => ({ id: `s${i}`, prompt: p, images: [img] }));
  const t0 = performance.now();
  // one call: the session build, the tower, the prefill and every decoding step
  const gens = await sampler.generate(ck.weights, reqs, { maxNewTokens: response, eosTokenIds: [], temperature: 1 });
  const s = (performance.now() - t0) / 1000;
  const tokens = gens.reduce((a, g) => a + g.tokens.length, 0);
  return {
    s,
    tokens,
    tokens_per_s: tokens / s,
    prompt_len: p.length,
    rss_after_load_gb: gb(rssLoaded),
    peak_rss_gb: peakRssGb(),
  };
}

/** The tower alone as a session: the visual.* weights and the image inputs in, the merged image tokens out. */
async function towerSession(c: ModelConfig, threads: number): Promise<ort.InferenceSession> {
  const b = new GraphBuilder({ name: 'vision_tower', float: 'float32' });
  const p = new Map<string, Var>();
  for (const s of paramSpecs(c)) if (s.name.startsWith('visual.')) p.set(s.name, b.input(s.name, 'float32', s.shape));
  b.output(visionTower(b, c, p), 'image_tokens');
  return createSession(b.toBytes(), { threads });
}

async function phaseImage(dir: string, threads: number, side: number) {
  const ck = await loadCheckpoint(dir, { optimizer: false });
  const c = ck.config;
  const png = await pngImage(side);
  const sess = await towerSession(c, threads);
  const weightFeeds: Record<string, ort.Tensor> = {};
  for (const s of paramSpecs(c))
    if (s.name.startsWith('visual.')) weightFeeds[s.name] = tensor('float32', ck.weights.get(s.name)!, s.shape);
  const once = async () => {
    const t0 = performance.now();
    const img = await preprocess(dir, c, png);
    const ids = prompt(c, img);
    const all = visionFeeds(c, ids, 1, ids.length, [[img]]);
    const feeds: Record<string, ort.Tensor> = { ...weightFeeds };
    for (const k of sess.inputNames) if (all[k]) feeds[k] = all[k];
    const t1 = performance.now();
    const out = await sess.run(feeds);
    const t2 = performance.now();
    return { pre: t1 - t0, enc: t2 - t1, tokens: out.image_tokens.dims[0] };
  };
  await once();
  const runs = [await once(), await once(), await once()];
  const med = (xs: number[]) => xs.sort((a, b) => a - b)[1];
  return {
    preprocess_ms: med(runs.map((r) => r.pre)),
    encode_ms: med(runs.map((r) => r.enc)),
    image_tokens: runs[0].tokens,
    peak_rss_gb: peakRssGb(),
  };
}

async function main(): Promise<void> {
  const a = args();
  const { side, response } = SIZES[a.shape];
  const dir = join(a.out, 'model');
  if (a.phase) {
    const r =
      a.phase === 'update'
        ? await phaseUpdate(dir, a.threads, a.samples, response, side)
        : a.phase === 'sample'
          ? await phaseSample(dir, a.threads, response, side)
          : a.phase === 'image'
            ? await phaseImage(dir, a.threads, side)
            : null;
    if (!r) throw new Error(`unknown --phase ${a.phase}`);
    process.stdout.write(`RESULT ${JSON.stringify(r)}\n`);
    return;
  }
  mkdirSync(a.out, { recursive: true });
  const child = (extra: string[]) =>
    execFileSync(
      process.execPath,
      [
        '--import',
        'tsx',
        import.meta.filename,
        '--out',
        a.out,
        '--shape',
        a.shape,
        '--threads',
        String(a.threads),
        '--samples',
        String(a.samples),
        ...extra,
      ],
      {
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'inherit'],
        maxBuffer: 64 << 20,
      },
    );
  const t0 = performance.now();
  if (!existsSync(join(dir, 'model.safetensors.index.json'))) {
    process.stderr.write(`writing the random ${a.shape} directory to ${dir}\n`);
    if (a.shape === '3b') child(['--phase', 'write']);
    else writeQwenVlDir(dir, { shape: 'tiny', seed: 1 });
  }
  const writeS = (performance.now() - t0) / 1000;
  const result = (phase: string) => {
    process.stderr.write(`measuring ${phase}\n`);
    const line = child(['--phase', phase])
      .split('\n')
      .find((l) => l.startsWith('RESULT '));
    if (!line) throw new Error(`phase ${phase} printed no RESULT line`);
    return JSON.parse(line.slice(7)) as Record<string, number>;
  };
  const image = result('image'),
    sample = result('sample'),
    update = result('update');
  const tag = `Qwen2.5-VL ${a.shape === '3b' ? '3B' : 'tiny'} shape, ${a.threads} threads`;
  const rows = [
    {
      name: `${tag}: LoRA r16 GRPO update step, gradient checkpointing (${a.samples} × (1 image ${side}², ${update.seq_len} tokens))`,
      value: update.step_s,
      unit: 's',
    },
    {
      name: `${tag}: update step peak RSS (base weights read included)`,
      value: update.peak_rss_gb,
      unit: 'GB',
      goal: '≤ 20',
    },
    {
      name: `${tag}: update process RSS with the base loaded, before the step`,
      value: update.rss_after_load_gb,
      unit: 'GB',
    },
    {
      name: `${tag}: sampling, 2 × ${response} tokens after one ${side}² image (session build, tower and prefill included)`,
      value: sample.tokens_per_s,
      unit: 'tokens/s',
    },
    { name: `${tag}: sampling peak RSS`, value: sample.peak_rss_gb, unit: 'GB' },
    {
      name: `${tag}: preprocess one ${side}² PNG (decode, smart_resize, pixels)`,
      value: image.preprocess_ms,
      unit: 'ms',
    },
    {
      name: `${tag}: encode one ${side}² image (vision tower, ${image.image_tokens} tokens)`,
      value: image.encode_ms,
      unit: 'ms',
    },
  ];
  const fmt = (v: number) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));
  const table = [
    '| row | value | unit | goal |',
    '|---|---:|---|---|',
    ...rows.map((r) => `| ${r.name} | ${fmt(r.value)} | ${r.unit} | ${r.goal ?? ''} |`),
  ].join('\n');
  const machine = {
    cpus: os.cpus().length,
    cpu: os.cpus()[0]?.model,
    mem_gb: gb(os.totalmem()),
    loadavg: os.loadavg(),
    node: process.version,
  };
  writeFileSync(
    join(a.out, 'qwen-vl-3b.json'),
    JSON.stringify(
      { shape: a.shape, threads: a.threads, machine, write_dir_s: writeS, update, sample, image, rows },
      null,
      2,
    ) + '\n',
  );
  process.stdout.write(
    `${table}\n\nmachine: ${machine.cpu} (${machine.cpus} CPUs, ${machine.mem_gb.toFixed(0)} GB), load ${machine.loadavg.map((x) => x.toFixed(1)).join(' ')}\n`,
  );
}

if (process.argv.includes('--phase') && process.argv[process.argv.indexOf('--phase') + 1] === 'write') {
  const a = args();
  writeQwenVlDir(join(a.out, 'model'), { shape: a.shape, seed: 1 });
} else await main();
