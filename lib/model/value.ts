/**
 * Per-token values from a value model (same trunk as the policy + `score.weight [1, D]` head on
 * the final-norm hidden states). The value of response token j is read at the position that
 * predicts it (prompt length − 1 + j), i.e. V(prompt, response[<j]) — verl's
 * `values[:, -response_length - 1:-1]`. Batching, layout and bucketing as score.ts.
 */
import { ConfigError } from '../errors.ts';
import type { ModelConfig } from './config.ts';
import { validateWeights, type Weights } from './params.ts';
import { weightTensors } from './feeds.ts';
import { buildScoreModel, forEachBucket, SCORE_IO, type ScoreRequest, type ScorerOptions } from './score.ts';
import { defaultSessionCache, keyOf, type SessionCache } from './session-cache.ts';

export class ValueScorer {
  private readonly cache: SessionCache;

  constructor(
    readonly config: ModelConfig,
    private readonly opts: ScorerOptions = {},
  ) {
    if (config.head !== 'value')
      throw new ConfigError('ValueScorer: needs a value model (head "value"); use Scorer for a policy');
    this.cache = opts.cache ?? defaultSessionCache;
  }

  /** One value per response token, in request order. */
  async values(weights: Weights, reqs: readonly ScoreRequest[]): Promise<Float32Array[]> {
    validateWeights(this.config, weights, 'ValueScorer weights');
    const out = reqs.map((r) => new Float32Array(r.response.length));
    if (reqs.length === 0) return out;
    const wf = weightTensors(this.config, weights);
    await forEachBucket(this.config, reqs, this.opts, async (batch, f) => {
      const session = await this.cache.get(
        `values|${keyOf(this.config)}|qb=${f.queryBlocks}`,
        () => buildScoreModel(this.config, { entropy: false, queryBlocks: f.queryBlocks }),
        { threads: this.opts.threads, device: this.opts.device },
      );
      const res = await session.run({ ...wf, ...f.vision, [SCORE_IO.inputIds]: f.ids, [SCORE_IO.gatherRows]: f.rows });
      const v = res[SCORE_IO.values].data as Float32Array;
      let m = 0;
      for (const i of batch) {
        const n = reqs[i].response.length;
        out[i].set(v.subarray(m, m + n));
        m += n;
      }
    });
    return out;
  }
}
