/**
 * Sampling an image policy's model directory (checkpoint.ts) to PNG: Euler ODE over `steps`
 * uniform steps from noise drawn from `seed` (the same seed gives the same bytes), with the EMA or
 * final weights the directory holds.
 */
import { ConfigError } from '../errors.ts';
import { Rng } from '../util/rng.ts';
import { loadDit } from './checkpoint.ts';
import { imageToPng } from './png.ts';
import { sampleImages } from './sde.ts';
import { ImageTrainer } from './trainer.ts';

export async function generateImage(
  dir: string,
  prompt: string,
  opts: { steps: number; seed: number },
): Promise<Uint8Array> {
  const m = loadDit(dir);
  const cls = m.classNames.indexOf(prompt);
  if (cls < 0)
    throw new ConfigError(`--prompt "${prompt}" is not one of this image model's prompts: ${m.classNames.join(', ')}`);
  const tr = new ImageTrainer(
    m.config,
    m.weights,
    { betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0, maxGradNorm: null, lr: 0 },
    { threads: 2 },
  );
  const S = m.config.imageSize,
    C = m.config.channels;
  const { x0 } = await sampleImages((x, t, c) => tr.velocity(x, t, c), {
    cls: [cls],
    pixels: C * S * S,
    steps: opts.steps,
    rng: Rng.fromSeed(opts.seed),
  });
  return imageToPng(x0, C, S);
}
