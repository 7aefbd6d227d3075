/**
 * Scoring: per-token log-probs and entropies of given responses (behaviour / old / reference
 * log-probs), and — with a value model — per-token values (value.ts), in length-bucketed batches.
 *
 * Layout: each row is prompt ‖ response, RIGHT-padded to the batch's longest row, positions
 * 0..T−1 and plain causal attention (padding sits after every real token, so no row sees any
 * padding and no mask is needed). Only the hidden states that predict response tokens go through
 * the head: `gather_rows` [M] are flat indices b·T + (P_b − 1 + j) into the [B·T, D] hidden states,
 * so the LM head and softmax run on the M real response tokens, not on prompts or padding.
 *
 * Bucketing: rows are sorted by total length and cut into batches under `maxBatchSize` rows and
 * `maxBatchTokens` = rows × longest row, so short rows are batched with short rows.
 *
 * The LM head runs fused with the log-softmax over vocabulary chunks (nn.ts chunkedLmHeadLogprob).
 * Log-prob of response token j: log softmax(logits / temperature)[token] at the position before
 * it; entropy: −Σ p log p of that same distribution (verl's old/ref log-prob semantics).
 */
import { GraphBuilder } from '../onnx/builder.ts';
import { chunkedLmHeadLogprob } from '../onnx/nn.ts';
import { ort, tensor, type Device } from '../onnx/runtime.ts';
import { ConfigError } from '../errors.ts';
import type { ModelConfig } from './config.ts';
import { declareParams, llamaForward, queryBlocksFor, valueHead } from './llama.ts';
import { HEAD_CHUNK, lmHeadWeight } from './train-graph.ts';
import { logitBiasOf } from './decode-graph.ts';
import { validateWeights, type Weights } from './params.ts';
import { weightTensors } from './feeds.ts';
import { planBatches } from './sample.ts';
import { defaultSessionCache, keyOf, type SessionCache } from './session-cache.ts';
import { hasImages, mropeDeltaInput, placeImageTokens, visionFeeds, type ImagePixels } from './vision.ts';

export const SCORE_IO = {
  inputIds: 'input_ids', // int64 [B, T], right-padded prompt ‖ response
  gatherRows: 'gather_rows', // int64 [M]: flat row b·T + t of each scored position
  targets: 'targets', // int64 [M]: the token each scored position predicts (policy only)
  temperature: 'temperature', // float32 [] (policy only)
  logprobs: 'logprobs', // float32 [M]
  entropy: 'entropy', // float32 [M] (when built with entropy)
  values: 'values', // float32 [M] (value model)
} as const;

/** The scoring model: log-probs (+ entropy) for a policy config, values for a value config. */
export function buildScoreModel(
  c: ModelConfig,
  opts: { entropy: boolean; headChunk?: number; queryBlocks?: number },
): Uint8Array {
  const b = new GraphBuilder({ name: c.head === 'value' ? 'values' : 'score' });
  const p = declareParams(b, c, 'inputs');
  const ids = b.input(SCORE_IO.inputIds, 'int64', ['B', 'T']);
  const rows = b.input(SCORE_IO.gatherRows, 'int64', ['M']);
  // a VLM places its image tokens at the <|image_pad|> positions (vision.ts)
  const mropeDelta = c.vision ? mropeDeltaInput(b, c, ids) : null;
  const { hidden } = llamaForward(b, c, p, {
    ids,
    ...(mropeDelta ? { mropeDelta } : {}),
    ...(c.vision ? { placeImages: (x, N) => placeImageTokens(b, c, p, x, N) } : {}),
    queryBlocks: opts.queryBlocks,
    // no row-concatenated weights: onnxruntime may run every layer's weight Concat first and keep them all (llama.ts)
    fuseProjections: false,
  });
  const h = b.gather(hidden, rows); // [M, D]
  if (c.head === 'value') {
    b.output(valueHead(b, c, p, h), SCORE_IO.values);
  } else {
    const targets = b.input(SCORE_IO.targets, 'int64', ['M']);
    const temperature = b.input(SCORE_IO.temperature, 'float32', []);
    // LM head + log-softmax over vocabulary chunks: the [M, V] logits never exist at once
    const r = chunkedLmHeadLogprob(b, h, lmHeadWeight(c, p), targets, {
      entropy: opts.entropy,
      temperature,
      chunk: opts.headChunk ?? HEAD_CHUNK,
      logitBias: logitBiasOf(c),
    }); // logitBias: the sampler's mask (tok)
    b.output(r.logprob, SCORE_IO.logprobs);
    if (r.entropy) b.output(r.entropy, SCORE_IO.entropy);
  }
  return b.toBytes();
}

export interface ScoreRequest {
  prompt: ArrayLike<number>;
  response: ArrayLike<number>;
  /** A VLM's images for this row, in the order of the prompt's expanded <|image_pad|> runs (vision.ts). */
  images?: readonly ImagePixels[];
}

export interface TokenScores {
  /** log π(response[j] | prompt, response[<j]), one per response token. */
  logprobs: Float32Array;
  /** Entropy of π at each response position (null when not requested). */
  entropy: Float32Array | null;
}

export interface ScorerOptions {
  threads?: number;
  /** ORT execution provider (default cpu). */
  device?: Device;
  /** Rows per session.run (default 64). */
  maxBatchSize?: number;
  /** Cap on rows × longest row per session.run (default 65536). */
  maxBatchTokens?: number;
  cache?: SessionCache;
  /** Vocabulary rows per chunk of the fused LM head (default train-graph.ts HEAD_CHUNK). */
  headChunk?: number;
}

/** Validates requests and runs `fn` on length-bucketed batches; shared by Scorer and ValueScorer. */
export async function forEachBucket(
  c: ModelConfig,
  reqs: readonly ScoreRequest[],
  opts: ScorerOptions,
  fn: (
    batch: number[],
    feeds: {
      ids: ort.Tensor;
      rows: ort.Tensor;
      targets: ort.Tensor;
      M: number;
      T: number;
      queryBlocks: number;
      vision: Record<string, ort.Tensor>;
    },
  ) => Promise<void>,
): Promise<void> {
  if (!c.vision && hasImages(reqs.map((r) => r.images)))
    throw new ConfigError('score requests carry images but the model is text-only (no vision config)');
  reqs.forEach((r, i) => {
    const T = r.prompt.length + r.response.length;
    if (r.prompt.length === 0)
      throw new ConfigError(`score request ${i}: empty prompt (the first response token needs a preceding position)`);
    if (T > c.maxPositionEmbeddings)
      throw new ConfigError(
        `score request ${i}: prompt + response length ${T} exceeds maxPositionEmbeddings ${c.maxPositionEmbeddings}`,
      );
    for (const [what, a] of [
      ['prompt', r.prompt],
      ['response', r.response],
    ] as const) {
      for (let t = 0; t < a.length; t++) {
        const v = a[t];
        if (!Number.isInteger(v) || v < 0 || v >= c.vocabSize)
          throw new ConfigError(
            `score request ${i}: ${what} token ${v} at ${t} is outside the vocabulary (vocabSize ${c.vocabSize})`,
          );
      }
    }
  });
  const widths = reqs.map((r) => r.prompt.length + r.response.length);
  const order = reqs
    .map((_, i) => i)
    .filter((i) => reqs[i].response.length > 0)
    .sort((a, b) => widths[b] - widths[a] || a - b);
  for (const batch of planBatches(widths, order, opts.maxBatchSize ?? 64, opts.maxBatchTokens ?? 65536)) {
    const B = batch.length;
    const T = Math.max(...batch.map((i) => widths[i]));
    const M = batch.reduce((s, i) => s + reqs[i].response.length, 0);
    const ids = new BigInt64Array(B * T).fill(BigInt(c.padTokenId));
    const rows = new BigInt64Array(M);
    const targets = new BigInt64Array(M);
    let m = 0;
    batch.forEach((i, k) => {
      const { prompt, response } = reqs[i];
      const P = prompt.length;
      for (let t = 0; t < P; t++) ids[k * T + t] = BigInt(prompt[t]);
      for (let j = 0; j < response.length; j++) {
        ids[k * T + P + j] = BigInt(response[j]);
        rows[m] = BigInt(k * T + P - 1 + j);
        targets[m++] = BigInt(response[j]);
      }
    });
    const vision = c.vision
      ? visionFeeds(
          c,
          ids,
          B,
          T,
          batch.map((i) => reqs[i].images),
          'score batch',
        )
      : {};
    // the bucket's causal query blocks (llama.ts queryBlocksFor): one scoring graph per block count
    await fn(batch, {
      ids: tensor('int64', ids, [B, T]),
      rows: tensor('int64', rows, [M]),
      targets: tensor('int64', targets, [M]),
      M,
      T,
      queryBlocks: queryBlocksFor(T),
      vision,
    });
  }
}

export class Scorer {
  private readonly cache: SessionCache;

  constructor(
    readonly config: ModelConfig,
    private readonly opts: ScorerOptions = {},
  ) {
    if (config.head !== 'lm')
      throw new ConfigError('Scorer: needs a policy model (head "lm"); use ValueScorer for a value model');
    this.cache = opts.cache ?? defaultSessionCache;
  }

  /** Per-token log-probs (and entropies unless `entropy: false`) of each response, in request order. */
  async score(
    weights: Weights,
    reqs: readonly ScoreRequest[],
    o: { temperature?: number; entropy?: boolean } = {},
  ): Promise<TokenScores[]> {
    const temperature = o.temperature ?? 1;
    const wantEnt = o.entropy ?? true;
    if (!(temperature > 0)) throw new ConfigError(`Scorer: temperature must be > 0, got ${temperature}`);
    validateWeights(this.config, weights, 'Scorer weights');
    const out: TokenScores[] = reqs.map((r) => ({
      logprobs: new Float32Array(r.response.length),
      entropy: wantEnt ? new Float32Array(r.response.length) : null,
    }));
    if (reqs.length === 0) return out;
    const wf = weightTensors(this.config, weights);
    await forEachBucket(this.config, reqs, this.opts, async (batch, f) => {
      const session = await this.cache.get(
        `score|${keyOf(this.config)}|ent=${wantEnt}|chunk=${this.opts.headChunk ?? HEAD_CHUNK}|qb=${f.queryBlocks}`,
        () =>
          buildScoreModel(this.config, {
            entropy: wantEnt,
            headChunk: this.opts.headChunk,
            queryBlocks: f.queryBlocks,
          }),
        { threads: this.opts.threads, device: this.opts.device },
      );
      const res = await session.run({
        ...wf,
        ...f.vision,
        [SCORE_IO.inputIds]: f.ids,
        [SCORE_IO.gatherRows]: f.rows,
        [SCORE_IO.targets]: f.targets,
        [SCORE_IO.temperature]: tensor('float32', [temperature], []),
      });
      const lp = res[SCORE_IO.logprobs].data as Float32Array;
      const ent = wantEnt ? (res[SCORE_IO.entropy].data as Float32Array) : null;
      let m = 0;
      for (const i of batch) {
        const n = reqs[i].response.length;
        out[i].logprobs.set(lp.subarray(m, m + n));
        if (ent) out[i].entropy!.set(ent.subarray(m, m + n));
        m += n;
      }
    });
    return out;
  }
}
