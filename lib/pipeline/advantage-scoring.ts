/**
 * What the advantage stage scores a settled step's kept samples with, its I/O: the reference
 * log-probs under the frozen initial policy (v0: the KL reference), the critic's values under the
 * version that generated the samples, and VPPO's passes with real and perturbed prompt images
 * (lib/pipeline/vppo.ts). A vision policy (and critic) score each response with its prompt's images.
 */
import { isImagePolicy } from './image-policy.ts';
import type { Config } from '../config/index.ts';
import type { ScoredGroup } from '../contracts/index.ts';
import { PixelCache } from '../data/pixel-cache.ts';
import { ConfigError, TransientError } from '../errors.ts';
import { loadCheckpoint } from '../model/index.ts';
import { Scorer } from '../model/score.ts';
import { ValueScorer } from '../model/value.ts';
import { PolicyImages } from './images.ts';
import {
  criticModelConfig,
  experienceScorerOptions,
  PolicyCache,
  policyLora,
  policyModelConfig,
  tokenizerFor,
} from './policy.ts';
import type { PolicyStore } from '../policy-store/index.ts';
import type { Executor } from './stage-state.ts';
import { perturbationKey, vppoScores, vppoSettings, type VppoScores, type VppoSettings } from './vppo.ts';

/** The samples of `kept`, each with its group. */
function samplesOf(kept: readonly ScoredGroup[]) {
  return kept.flatMap((g) => g.samples.map((x) => ({ id: x.id, prompt: g.prompt_ids, response: x.response_ids, g })));
}

export class AdvantageScorers {
  /** Reference log-probs are needed (algorithm.use_kl_loss or use_kl_in_reward). */
  readonly needRef: boolean;
  /** algorithm.vppo.enable: VPPO's settings (null: off). */
  readonly vppo: VppoSettings | null;
  private readonly scorer: Scorer;
  private readonly valueScorer: ValueScorer | null;
  private readonly reference: PolicyCache;
  private readonly current: PolicyCache | null;
  private readonly pixels: PixelCache;
  private readonly images: PolicyImages;
  private readonly criticImages: PolicyImages | null;

  constructor(
    private readonly cfg: Config,
    private readonly policies: PolicyStore,
    private readonly runId: string,
  ) {
    const tok = tokenizerFor(cfg);
    const model = policyModelConfig(cfg, tok);
    this.needRef = cfg.algorithm.use_kl_loss || cfg.algorithm.use_kl_in_reward;
    this.scorer = new Scorer(model, experienceScorerOptions(cfg));
    this.valueScorer =
      cfg.critic.enable === true ? new ValueScorer(criticModelConfig(cfg, tok), experienceScorerOptions(cfg)) : null;
    // with LoRA, version 0's adapter is zero: the reference is the base model, adapters off
    this.reference = new PolicyCache(policies, model, undefined, policyLora(cfg));
    this.pixels = new PixelCache();
    this.images = new PolicyImages(model, this.pixels);
    this.criticImages = this.valueScorer ? new PolicyImages(this.valueScorer.config, this.pixels) : null;
    this.vppo = cfg.algorithm.vppo.enable ? vppoSettings(cfg) : null;
    // the config check reads the model directory; this is the model as loaded
    if (this.vppo && !(model as { vision?: unknown }).vision) {
      throw new ConfigError(
        'algorithm.vppo.enable = true needs a vision-language actor, and the actor model as loaded has no vision tower (its config has no vision config), so log-probs under a perturbed image cannot be computed; set algorithm.vppo.enable=false or use a vision-language actor model',
      );
    }
    this.current = this.vppo ? new PolicyCache(policies, model, undefined, policyLora(cfg)) : null;
  }

  /** Scoring waits for the announcement of the version that generated a step (VPPO, the critic). */
  get needsVersion(): boolean {
    return this.vppo !== null || this.valueScorer !== null;
  }

  /** Reference log-probs by sample id under version 0 (null: no KL term needs them). */
  async referenceLogprobs(kept: readonly ScoredGroup[], db: Executor): Promise<Map<string, Float32Array> | null> {
    if (!this.needRef) return null;
    const w0 = await this.reference.get(0, db);
    const samples = samplesOf(kept);
    const px = await this.images.byGroup(kept);
    // at the rollout temperature, as the actor's log-probs in the KL term (verl: ref log_prob with rollout.temperature)
    const scores = await this.scorer.score(
      w0,
      samples.map((s) => ({ prompt: s.prompt, response: s.response, images: px.get(s.g) })),
      { temperature: this.cfg.rollout.temperature, entropy: false },
    );
    return new Map(samples.map((s, i) => [s.id, scores[i].logprobs]));
  }

  /** The critic's values by sample id (null: no critic). */
  async values(kept: readonly ScoredGroup[], db: Executor): Promise<Map<string, Float32Array> | null> {
    if (!this.valueScorer) return null;
    // the critic of the version the samples were generated with (on-policy: the current one)
    const version = Math.max(...kept.map((g) => g.policy_version));
    const cdir = await this.policies.get('critic', version, db);
    if (!cdir) throw new TransientError(`critic version ${version} is not in the policy store (yet); retrying`);
    const critic = await loadCheckpoint(cdir, { optimizer: false });
    const samples = samplesOf(kept);
    const px = await this.criticImages!.byGroup(kept);
    const vs = await this.valueScorer.values(
      critic.weights,
      samples.map((s) => ({ prompt: s.prompt, response: s.response, images: px.get(s.g) })),
    );
    return new Map(samples.map((s, i) => [s.id, vs[i]]));
  }

  /** VPPO's passes over the kept samples with real and perturbed images (null: VPPO off). */
  async vppoPasses(kept: readonly ScoredGroup[], db: Executor): Promise<VppoScores | null> {
    if (!this.vppo) return null;
    // the weights that generated the samples (on-policy: the current version), real and perturbed images
    const version = Math.max(...kept.map((g) => g.policy_version));
    const samples = kept.flatMap((g) =>
      g.samples.map((x) => ({
        id: x.id,
        seedKey: perturbationKey(this.runId, x.id),
        prompt: g.prompt_ids,
        response: x.response_ids,
        images: g.images,
      })),
    );
    try {
      return await vppoScores(
        this.scorer,
        await this.current!.get(version, db),
        samples,
        this.pixels,
        this.vppo,
        this.cfg.rollout.temperature,
      );
    } finally {
      this.current!.release(); // a version handed over in memory is not held past its step
    }
  }
}

/** What the advantage stage scores with (AdvantageScorers' public part). */
export type AdvantageScoring = Pick<
  AdvantageScorers,
  'needsVersion' | 'vppo' | 'referenceLogprobs' | 'values' | 'vppoPasses'
>;

/**
 * The advantage stage's scorers: a language policy's (AdvantageScorers); an image policy's score
 * nothing (no token log-probs; Flow-GRPO's KL to v0 is the update's, lib/pipeline/image-policy.ts).
 */
export function advantageScorers(cfg: Config, policies: PolicyStore, runId: string): AdvantageScoring {
  if (!isImagePolicy(cfg)) return new AdvantageScorers(cfg, policies, runId);
  return {
    needsVersion: false,
    vppo: null,
    referenceLogprobs: () => Promise.resolve(null),
    values: () => Promise.resolve(null),
    vppoPasses: () => Promise.resolve(null),
  };
}
