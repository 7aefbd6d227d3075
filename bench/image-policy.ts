/**
 * Image policies (lib/image/): images per second sampled with the Euler ODE (10 steps, as
 * evaluation and `rlstream generate`) and trained (one flow-matching AdamW step over the batch:
 * forward, backward and AdamW in one session.run), at 32×32 and 64×64, with the glyphs example's
 * DiT (hidden 64, depth 2, 4 heads, patch 4), batch 16, RLSTREAM_BENCH_THREADS intra-op threads
 * (default 2). Median of 5 timed runs after one warm-up; the process CPU time is in the row's name
 * (the steadier number on a shared machine). No goal.
 *
 * `run()` returns the rows for bench/run.ts; `node --import tsx bench/image-policy.ts` prints them.
 */
import { cpus, loadavg } from 'node:os';
import { pathToFileURL } from 'node:url';
import { ditConfig, initDitWeights } from '../lib/image/dit.ts';
import { gaussian, sampleImages } from '../lib/image/sde.ts';
import { ImageTrainer } from '../lib/image/trainer.ts';
import { Rng } from '../lib/util/rng.ts';

export interface Row {
  name: string;
  value: number;
  unit: string;
}

const B = 16;
const threads = Number(process.env.RLSTREAM_BENCH_THREADS ?? 2);

async function timed(f: () => Promise<unknown>): Promise<{ wall: number; cpu: number }> {
  await f();
  const walls: number[] = [],
    cpusMs: number[] = [];
  for (let i = 0; i < 5; i++) {
    const c0 = process.cpuUsage(),
      t0 = performance.now();
    await f();
    walls.push(performance.now() - t0);
    const c = process.cpuUsage(c0);
    cpusMs.push((c.user + c.system) / 1000);
  }
  const med = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
  return { wall: med(walls), cpu: med(cpusMs) };
}

export async function run(): Promise<Row[]> {
  const rows: Row[] = [];
  for (const S of [32, 64]) {
    const cfg = ditConfig({ numClasses: 36, imageSize: S, patchSize: 4, hidden: 64, depth: 2, heads: 4 });
    const tr = new ImageTrainer(
      cfg,
      initDitWeights(cfg, 'bench'),
      { betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0, maxGradNorm: 1, lr: 1e-3 },
      { threads },
    );
    const cls = Array.from({ length: B }, (_, i) => i % 36);
    const px = S * S;
    const rng = Rng.fromSeed('bench');
    const sample = await timed(() =>
      sampleImages((x, t, c) => tr.velocity(x, t, c), { cls, pixels: px, steps: 10, rng }),
    );
    const x0 = gaussian(rng, B * px);
    const train = await timed(() =>
      tr.step(
        { name: 'flow_matching' },
        { floats: { x0, noise: gaussian(rng, B * px), t: Array.from({ length: B }, () => rng.next()) }, cls },
      ),
    );
    const load = loadavg()[0].toFixed(1);
    rows.push({
      name: `image-policy ${S}×${S}: sampled, ODE 10 steps, B${B} (cpu ${(sample.cpu / B).toFixed(0)} ms/image, load ${load})`,
      value: Number(((B * 1000) / sample.wall).toFixed(1)),
      unit: 'images/s',
    });
    rows.push({
      name: `image-policy ${S}×${S}: trained, flow matching step, B${B} (cpu ${(train.cpu / B).toFixed(1)} ms/image, load ${load})`,
      value: Number(((B * 1000) / train.wall).toFixed(1)),
      unit: 'images/s',
    });
  }
  return rows;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  console.log(`threads ${threads} of ${cpus().length} cores`);
  for (const r of await run()) console.log(`${r.name.padEnd(100)} ${String(r.value).padStart(10)} ${r.unit}`);
}
