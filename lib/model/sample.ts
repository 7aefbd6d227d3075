/**
 * Batched generation with temperature, top-k, top-p, EOS stop and a response-length cap.
 *
 * A batch of short rows is one `session.run` of the generation graph (decode-graph.ts: prefill +
 * in-graph KV-cached decode loop), so the KV cache never crosses into JS; the loop appends to the
 * caches by Concat, a copy of the whole cache per token. A batch of long rows (`decode` option)
 * runs the prefill graph and then the step graph once per token (stepwise.ts) over caches
 * allocated once at their final size, which the graph reads in place and JS extends by one column
 * per token (their column capacity grows inside those buffers, so the graph attends over the
 * columns in use plus at most an eighth). Weights are graph inputs, so one session serves every
 * policy version (inputs built from Float32Arrays are not copied).
 *
 * Determinism: the randomness of a sequence is a stream of uniforms drawn in JS from a PRNG keyed by
 * (seed, sequence id) and consumed one per generated token by inverse-CDF sampling inside the
 * graph. Prompts are left-padded with per-row positions, so a sequence's tokens do not depend on
 * which other prompts share its batch, on the padding, or on the worker that runs it (up to float
 * rounding of the masked-out padding work, which can only flip a draw that lands within ~1e-7 of a
 * CDF boundary).
 *
 * Behaviour log-probs: `logprobs[t]` is log softmax((logits + mask) / temperature)[token], the
 * masked, temperature-scaled distribution BEFORE top-k/top-p truncation (for temperature 0,
 * greedy, the untempered masked log-softmax). mask is −1e9 at `config.suppressTokenIds` (ids
 * sampling must never emit: decode-graph.ts logitBiasOf), 0 elsewhere; the scorer and trainer
 * add the same mask. This matches what a trainer that divides logits by the same temperature
 * recomputes as old log-probs; with truncation the true sampling probability is higher (the
 * kept mass is renormalised), which verl-style pipelines ignore by recomputing old log-probs.
 */
import { z } from 'zod';
import { ConfigError, RlError } from '../errors.ts';
import { Rng } from '../util/rng.ts';
import { ort, tensor, type Device } from '../onnx/runtime.ts';
import type { ModelConfig } from './config.ts';
import { buildGenerateModel, GEN_IO } from './decode-graph.ts';
import { appendRows, reservedState, StepDecoder } from './stepwise.ts';
import { promptFeeds, weightTensors } from './feeds.ts';
import { validateWeights, type Weights } from './params.ts';
import { defaultSessionCache, keyOf, type SessionCache } from './session-cache.ts';
import { hasImages, type ImagePixels } from './vision.ts';

export const samplingParamsSchema = z
  .object({
    temperature: z.number().min(0).default(1).describe('logits are divided by this; 0 = greedy (argmax)'),
    topP: z
      .number()
      .gt(0)
      .max(1)
      .default(1)
      .describe('nucleus sampling: keep the smallest top set with mass ≥ topP (1 = off)'),
    topK: z
      .number()
      .int()
      .min(0)
      .default(0)
      .describe('keep the topK most likely tokens (0 = off); applied before topP'),
    maxNewTokens: z.number().int().positive().describe('response length cap (max_response_length)'),
    eosTokenIds: z
      .array(z.number().int().nonnegative())
      .optional()
      .describe('stop tokens (default: the model config eosTokenId; [] = never stop early)'),
    seed: z
      .union([z.number().int(), z.string()])
      .default(0)
      .describe('run-level seed; each sequence draws from PRNG(seed, sequence id)'),
  })
  .strict();

export type SamplingParamsInput = z.input<typeof samplingParamsSchema>;
export type SamplingParams = z.output<typeof samplingParamsSchema>;

export interface GenerationRequest {
  /** Deterministic sequence id: the sequence's randomness is keyed by it. */
  id: string;
  /** Prompt token ids. */
  prompt: ArrayLike<number>;
  /** A VLM's images for this prompt, in the order of its expanded <|image_pad|> runs (vision.ts). */
  images?: readonly ImagePixels[];
}

export type FinishReason = 'eos' | 'length';

export interface Generation {
  id: string;
  /** Response tokens, including the EOS token when finishReason is 'eos'. */
  tokens: Int32Array;
  /** Behaviour log-probs of `tokens` (see the file comment for the distribution). */
  logprobs: Float32Array;
  finishReason: FinishReason;
}

export interface SamplerOptions {
  /** ORT intra-op threads. */
  threads?: number;
  /** ORT execution provider (default cpu). */
  device?: Device;
  /** Rows per session.run (default 64). */
  maxBatchSize?: number;
  /** Cap on rows × (prompt + new tokens) per session.run (default 262144). */
  maxBatchTokens?: number;
  cache?: SessionCache;
  /**
   * How a batch decodes: 'loop' (the generation graph, one run with the decode loop inside:
   * no per-token call, but each step appends to the caches by Concat, copying them), 'step' (the
   * prefill graph, then one step-graph run per token over caches allocated once at their final
   * size, whose capacity grows inside them, written in place) or 'auto' (the default: on the
   * CPU, 'step' once a batch's rows reach STEP_DECODE_MIN_COLUMNS prompt + new tokens, where the
   * copies outweigh the calls; on another device always 'loop', whose caches stay on the device
   * within the one run, where the step graph's would be copied to it at every token).
   */
  decode?: 'loop' | 'step' | 'auto';
}

/** Prompt + new tokens from which `decode: 'auto'` runs the step graph (bench/stepwise-vs-loop.ts). */
export const STEP_DECODE_MIN_COLUMNS = 256;

/** The uniforms in (0, 1) a sequence consumes, one per generated token (float32-exact). */
export function sequenceUniforms(seed: number | string, id: string, n: number): Float32Array {
  const rng = Rng.fromSeed(`sample:${seed}:${id}`);
  const out = new Float32Array(n);
  // 24-bit grid, offset by half a step: exactly representable and never 0 or 1
  for (let i = 0; i < n; i++) out[i] = (Math.floor(rng.next() * 16777216) + 0.5) / 16777216;
  return out;
}

/** The uniforms of a batch's rows, [B, N] row-major (row b: `sequenceUniforms(seed, id_b, N)`). */
function batchUniforms(reqs: readonly GenerationRequest[], seed: number | string, N: number): Float32Array {
  const u = new Float32Array(reqs.length * N);
  reqs.forEach((r, b) => u.set(sequenceUniforms(seed, r.id, N), b * N));
  return u;
}

export function samplingParams(input: SamplingParamsInput): SamplingParams {
  const r = samplingParamsSchema.safeParse(input);
  if (!r.success)
    throw new ConfigError(
      `sampling params: ${r.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ')}`,
    );
  return r.data;
}

/** Split row indices (already ordered) into batches of at most maxRows and maxTokens (rows × width). */
export function planBatches(
  widths: readonly number[],
  order: readonly number[],
  maxRows: number,
  maxTokens: number,
): number[][] {
  const batches: number[][] = [];
  let cur: number[] = [];
  let curMax = 0;
  for (const i of order) {
    const w = Math.max(curMax, widths[i]);
    if (cur.length > 0 && (cur.length + 1 > maxRows || (cur.length + 1) * w > maxTokens)) {
      batches.push(cur);
      cur = [];
      curMax = 0;
    }
    cur.push(i);
    curMax = Math.max(curMax, widths[i]);
  }
  if (cur.length) batches.push(cur);
  return batches;
}

export class Sampler {
  private readonly cache: SessionCache;
  private readonly maxBatchSize: number;
  private readonly maxBatchTokens: number;
  private readonly stepper: StepDecoder;

  constructor(
    readonly config: ModelConfig,
    private readonly opts: SamplerOptions = {},
  ) {
    if (config.head !== 'lm') throw new ConfigError('Sampler: needs a policy model (head "lm"), got a value model');
    this.cache = opts.cache ?? defaultSessionCache;
    this.maxBatchSize = opts.maxBatchSize ?? 64;
    this.maxBatchTokens = opts.maxBatchTokens ?? 262144;
    if (!(this.maxBatchSize >= 1) || !(this.maxBatchTokens >= 1))
      throw new ConfigError('Sampler: maxBatchSize and maxBatchTokens must be ≥ 1');
    this.stepper = new StepDecoder(config, { threads: opts.threads, device: opts.device, cache: this.cache });
  }

  private session(truncation: boolean): Promise<ort.InferenceSession> {
    const key = `generate|${keyOf(this.config)}|trunc=${truncation}`;
    return this.cache.get(key, () => buildGenerateModel(this.config, { truncation }), {
      threads: this.opts.threads,
      device: this.opts.device,
    });
  }

  /** Generate one response per request (results in request order). */
  async generate(
    weights: Weights,
    requests: readonly GenerationRequest[],
    paramsIn: SamplingParamsInput,
  ): Promise<Generation[]> {
    const params = samplingParams(paramsIn);
    const c = this.config;
    const N = params.maxNewTokens;
    const eos = params.eosTokenIds ?? [c.eosTokenId];
    for (const e of eos)
      if (e >= c.vocabSize)
        throw new ConfigError(`sampling params: eos token ${e} is outside the vocabulary (vocabSize ${c.vocabSize})`);
    validateWeights(c, weights, 'Sampler weights');
    const seen = new Set<string>();
    requests.forEach((r, i) => {
      if (r.prompt.length === 0) throw new ConfigError(`generation request ${i} (${r.id}): empty prompt`);
      if (r.prompt.length + N > c.maxPositionEmbeddings)
        throw new ConfigError(
          `generation request ${i} (${r.id}): prompt length ${r.prompt.length} + maxNewTokens ${N} exceeds maxPositionEmbeddings ${c.maxPositionEmbeddings}`,
        );
      for (let t = 0; t < r.prompt.length; t++) {
        const v = r.prompt[t];
        if (!Number.isInteger(v) || v < 0 || v >= c.vocabSize)
          throw new ConfigError(
            `generation request ${i} (${r.id}): token ${v} at ${t} is outside the vocabulary (vocabSize ${c.vocabSize})`,
          );
      }
      if (seen.has(r.id))
        throw new ConfigError(
          `generation request ${i}: duplicate sequence id ${r.id} (ids key the randomness; give each sequence its own)`,
        );
      seen.add(r.id);
    });
    if (requests.length === 0) return [];
    if (!c.vision && hasImages(requests.map((r) => r.images)))
      throw new ConfigError('generation requests carry images but the model is text-only (no vision config)');
    const truncation = params.topK > 0 || params.topP < 1;
    const weightFeeds = weightTensors(c, weights);
    const order = requests
      .map((_, i) => i)
      .sort((a, b) => requests[b].prompt.length - requests[a].prompt.length || a - b);
    const widths = requests.map((r) => r.prompt.length + N);
    const out = new Array<Generation>(requests.length);
    const onCpu = (this.opts.device ?? 'cpu') === 'cpu';
    const mode = this.opts.decode ?? 'auto';
    for (const batch of planBatches(widths, order, this.maxBatchSize, this.maxBatchTokens)) {
      const reqs = batch.map((i) => requests[i]);
      const cols = Math.max(...batch.map((i) => widths[i]));
      const res =
        mode === 'step' || (mode === 'auto' && onCpu && cols >= STEP_DECODE_MIN_COLUMNS)
          ? await this.runBatchStepwise(weights, reqs, params, eos, cols)
          : await this.runBatch(await this.session(truncation), weightFeeds, reqs, params, eos, truncation);
      batch.forEach((i, k) => {
        out[i] = res[k];
      });
    }
    return out;
  }

  private async runBatch(
    session: ort.InferenceSession,
    weightFeeds: Record<string, ort.Tensor>,
    reqs: GenerationRequest[],
    params: SamplingParams,
    eos: number[],
    truncation: boolean,
  ): Promise<Generation[]> {
    const B = reqs.length,
      N = params.maxNewTokens;
    const u = batchUniforms(reqs, params.seed, N);
    const feeds: Record<string, ort.Tensor> = {
      ...weightFeeds,
      ...promptFeeds(this.config, reqs, 'generation batch'),
      [GEN_IO.uniforms]: tensor('float32', u, [B, N]),
      [GEN_IO.temperature]: tensor('float32', new Float32Array(B).fill(params.temperature), [B]),
      [GEN_IO.eosIds]: tensor('int64', eos.length ? eos : [-1], [Math.max(1, eos.length)]),
    };
    if (truncation) {
      feeds[GEN_IO.topP] = tensor('float32', new Float32Array(B).fill(params.topP), [B]);
      feeds[GEN_IO.topK] = tensor('int64', new BigInt64Array(B).fill(BigInt(params.topK)), [B]);
    }
    const res = await session.run(feeds);
    const steps = res[GEN_IO.tokens].dims[0];
    return collect(
      reqs,
      res[GEN_IO.tokens].data as BigInt64Array,
      res[GEN_IO.logprobs].data as Float32Array,
      steps,
      N,
      eos,
    );
  }

  /**
   * One batch through the step graph: the distinct prompts prefilled once, their caches expanded
   * into buffers of `cols` columns allocated once, then one step-graph run per token (stopping
   * when every row has emitted an EOS id). Same uniforms, so the same tokens as `runBatch` up to
   * float rounding (the attention sums over another number of columns).
   */
  private async runBatchStepwise(
    weights: Weights,
    reqs: GenerationRequest[],
    params: SamplingParams,
    eos: number[],
    cols: number,
  ): Promise<Generation[]> {
    const c = this.config,
      B = reqs.length,
      N = params.maxNewTokens;
    const u = batchUniforms(reqs, params.seed, N);
    let state = reservedState(c, B, cols);
    state = appendRows(c, state, await this.stepper.prefill(weights, reqs));
    const rowParams = reqs.map(() => ({ temperature: params.temperature, topP: params.topP, topK: params.topK }));
    const res = await this.stepper.step(weights, state, u, N, rowParams, eos, false);
    return collect(reqs, res.tokens, res.logprobs, res.steps, N, eos);
  }
}

/** Each row's tokens and log-probs ([steps, B] step-major) up to its first EOS id. */
function collect(
  reqs: readonly GenerationRequest[],
  toks: BigInt64Array,
  lps: Float32Array,
  steps: number,
  N: number,
  eos: readonly number[],
): Generation[] {
  const B = reqs.length;
  const eosSet = new Set(eos);
  return reqs.map((r, b) => {
    let len = steps;
    let reason: FinishReason = 'length';
    for (let t = 0; t < steps; t++) {
      if (eosSet.has(Number(toks[t * B + b]))) {
        len = t + 1;
        reason = 'eos';
        break;
      }
    }
    if (reason === 'length' && steps !== N)
      throw new Error(`internal: generation stopped after ${steps} of ${N} steps but ${r.id} has no EOS`);
    const tokens = new Int32Array(len);
    const logprobs = new Float32Array(len);
    for (let t = 0; t < len; t++) {
      tokens[t] = Number(toks[t * B + b]);
      logprobs[t] = lps[t * B + b];
    }
    const bad = logprobs.findIndex((v) => Number.isNaN(v));
    if (bad >= 0)
      throw new RlError(
        `generation for ${r.id}: the model's logits are not finite at response token ${bad} (diverged weights?)`,
        { retriable: false, code: 'ERR_NONFINITE_LOGITS' },
      );
    return { id: r.id, tokens, logprobs, finishReason: reason };
  });
}
