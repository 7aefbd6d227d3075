/**
 * VPPO's extra scoring pass (arXiv 2510.09285) for the advantage stage: every trained sample's
 * response is scored twice with the weights of the policy that generated it — once with its real
 * prompt images (log π_old, and the token entropies when entropy filtering is on) and once with
 * each image perturbed (algorithm.vppo.perturbation, lib/data/perturb.ts, seeded by the sample id
 * relative to the run, so a replay — whose ids name another run — sees the same perturbation). The two passes use the same weights and graph, so
 * d = log π_aug − log π_old measures the image alone. The result feeds attachVppo
 * (services/advantage/logic.ts).
 *
 * The scorer is any object with the vision-language Scorer's `score` shape: requests carrying
 * decoded images (8-bit RGB) next to the prompt and response ids.
 */
import type { Config } from '../config/index.ts';
import { ConfigError } from '../errors.ts';
import { perturbImage, type PerturbOptions, type Pixels } from '../data/perturb.ts';
import { imageHashOf } from '../data/image-hash.ts';
import type { PixelCache } from '../data/pixel-cache.ts';
import type { VppoStageConfig } from '../rl/vppo-stage.ts';

export interface ImageScoreRequest {
  prompt: Int32Array;
  response: Int32Array;
  images: readonly Pixels[];
}
export interface ImageTokenScores {
  logprobs: Float32Array;
  entropy: Float32Array | null;
}
export interface ImageScorer<W> {
  score(
    weights: W,
    reqs: readonly ImageScoreRequest[],
    o: { temperature: number; entropy: boolean },
  ): Promise<ImageTokenScores[]>;
}

/**
 * One sample to score: its id, the key seeding its perturbation (perturbationKey: the id without
 * the run id), prompt and response ids, and its prompt's PNGs.
 */
export interface VppoSample {
  id: string;
  seedKey: string;
  prompt: Int32Array;
  response: Int32Array;
  images: readonly Uint8Array[];
}

/**
 * The perturbation seed of a sample: its id relative to the run (`train/s3/p1/n2`). A replay
 * rewrites the run id in every sample id and keeps the rest, so it perturbs each recorded sample
 * exactly as the source run did.
 */
export function perturbationKey(runId: string, sampleId: string): string {
  return sampleId.startsWith(`${runId}/`) ? sampleId.slice(runId.length + 1) : sampleId;
}

export interface VppoScores {
  /** log π_old with the real images. */
  old: Map<string, Float32Array>;
  /** log-probs with the perturbed images, and the real-image entropies when asked for. */
  perturbed: Map<string, { logprobs: Float32Array; entropies: Float32Array | null }>;
}

export interface VppoSettings {
  stage: VppoStageConfig;
  perturbation: string;
  perturb: PerturbOptions;
}

export function vppoSettings(cfg: Config): VppoSettings {
  const v = cfg.algorithm.vppo;
  return {
    stage: {
      top_p_perception_tokens: v.top_p_perception_tokens,
      enable_entropy_filtering: v.enable_entropy_filtering,
      top_p_entropy_tokens: v.top_p_entropy_tokens,
      advantage_scaling_min: v.advantage_scaling_min,
    },
    perturbation: v.perturbation,
    perturb: { patch_size: v.patch_size, mask_prob: v.mask_prob, noise_std: v.noise_std },
  };
}

/**
 * Scores `samples` with their real and their perturbed images (two scorer calls, in the same
 * order). A sample without an image is refused: VPPO has no visual dependency to measure there.
 */
export async function vppoScores<W>(
  scorer: ImageScorer<W>,
  weights: W,
  samples: readonly VppoSample[],
  pixels: PixelCache,
  s: VppoSettings,
  temperature: number,
): Promise<VppoScores> {
  const noImage = samples.find((x) => x.images.length === 0);
  if (noImage)
    throw new ConfigError(
      `algorithm.vppo.enable: sample ${noImage.id} has no prompt image, so it has no visual dependency to measure; VPPO needs every training prompt to carry an image (data.image_key)`,
    );
  const real = await Promise.all(
    samples.map((x) => Promise.all(x.images.map((png) => pixels.get(imageHashOf(png), png)))),
  );
  const perturbed = samples.map((x, i) =>
    real[i]!.map((px, k) => perturbImage(s.perturbation, px, x.seedKey, k, s.perturb)),
  );
  const base = await scorer.score(
    weights,
    samples.map((x, i) => ({ prompt: x.prompt, response: x.response, images: real[i]! })),
    { temperature, entropy: s.stage.enable_entropy_filtering },
  );
  const aug = await scorer.score(
    weights,
    samples.map((x, i) => ({ prompt: x.prompt, response: x.response, images: perturbed[i]! })),
    { temperature, entropy: false },
  );
  const out: VppoScores = { old: new Map(), perturbed: new Map() };
  samples.forEach((x, i) => {
    out.old.set(x.id, base[i]!.logprobs);
    out.perturbed.set(x.id, { logprobs: aug[i]!.logprobs, entropies: base[i]!.entropy });
  });
  return out;
}
