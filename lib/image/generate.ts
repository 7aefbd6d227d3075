/**
 * Sampling an image policy's model directory (checkpoint.ts) to PNG: Euler ODE over `steps`
 * uniform steps from noise drawn from `seed` (the same seed gives the same bytes), with the weights
 * the directory holds (a policy version, a checkpoint's actor/, or an EMA version
 * <run_dir>/ema/vNNNNNN), guided by classifier-free guidance at `cfgScale` (1 = none; sde.ts
 * guidedVelocity, with the model's null prompt).
 */
import { ConfigError } from '../errors.ts';
import { Rng } from '../util/rng.ts';
import { loadDit } from './checkpoint.ts';
import { imageToPng } from './png.ts';
import { guidedVelocity, sampleImages } from './sde.ts';
import { ImageTrainer } from './trainer.ts';

export async function generateImage(
  dir: string,
  prompt: string,
  opts: { steps: number; seed: number; cfgScale?: number },
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
  const velocity = guidedVelocity((x, t, c) => tr.velocity(x, t, c), opts.cfgScale ?? 1, m.config.numClasses);
  const { x0 } = await sampleImages(velocity, {
    cls: [cls],
    pixels: C * S * S,
    steps: opts.steps,
    rng: Rng.fromSeed(opts.seed),
  });
  return imageToPng(x0, C, S);
}
