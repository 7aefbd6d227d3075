/**
 * Continuous batching for the policy server: one running batch of sequences decodes step by step
 * (lib/model/stepwise.ts), and a request that arrives joins it at the next run: its prompts are
 * prefilled (the `n` choices of a prompt share one prefill) and its rows appended to the running
 * state. A finished sequence leaves the batch after the run that finished it, and each sampled
 * token is handed to the request's `onToken` as soon as its run returns (streaming).
 *
 * Rows of different sampling settings share the batch (temperature, top-p and top-k are per row).
 * A sequence's tokens are those `Sampler.generate` draws for the same (seed, id): its randomness is
 * its own uniforms stream, consumed one per token whatever else decodes beside it. The running
 * batch keeps the weights it started with; requests that find a newer policy version wait until
 * it drains, then start the next batch with the new weights.
 *
 * The running batch's KV caches live in buffers the step graph reads in place; a step adds one
 * column, a joining request's rows are copied in once, a finished row's slot is refilled by moving
 * one row (stepwise.ts), so a decode step costs one graph run over the batch and no cache copy.
 */
import { ConfigError } from '../errors.ts';
import {
  samplingParams,
  sequenceUniforms,
  type FinishReason,
  type GenerationRequest,
  type SamplingParamsInput,
} from '../model/sample.ts';
import { appendRows, emptyState, keepRows, type DecodeState, type StepDecoder } from '../model/stepwise.ts';
import type { PolicyWeights } from './policy-weights.ts';

/** One sampled token as it is handed to `onToken`. */
export interface SampledToken {
  token: number;
  logprob: number;
  /** The most likely tokens of this step's distribution, best first (`topLogprobs` of them). */
  top: { token: number; logprob: number }[];
}

export interface SequenceResult {
  id: string;
  tokens: number[];
  logprobs: number[];
  top: SampledToken['top'][];
  /** 'stopped': the request's onToken ended it. */
  finishReason: FinishReason | 'stopped';
}

export interface BatchResult {
  version: number;
  generations: SequenceResult[];
}

export interface SubmitOptions {
  /** Most likely tokens to report per step (0..20). */
  topLogprobs?: number;
  /**
   * Called for every sampled token of sequence `seq` (index into the submitted list), in order;
   * returning true ends that sequence there (a stop string, a client gone).
   */
  onToken?(seq: number, t: SampledToken, version: number): boolean | void;
}

export interface BatchStats {
  /** Rows in one decode run. */
  onBatch?(sequences: number, ms: number): void;
  /** Sequences prefilled together as they join. */
  onPrefill?(sequences: number): void;
}

interface Job {
  seqs: GenerationRequest[];
  params: ReturnType<typeof samplingParams>;
  opts: SubmitOptions;
  left: number;
  results: SequenceResult[];
  resolve: (r: BatchResult) => void;
  reject: (e: unknown) => void;
}

interface Row {
  job: Job;
  seq: number;
  uniforms: Float32Array;
  eos: Set<number>;
  out: SequenceResult;
}

export class GenerationBatcher {
  private queue: Job[] = [];
  private rows: Row[] = [];
  private state: DecodeState | null = null;
  private policy: PolicyWeights | null = null;
  private running = false;
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly decoder: StepDecoder,
    private readonly current: () => PolicyWeights,
    private readonly opts: {
      /** How long an idle batcher waits for more requests before its first prefill (ms). */
      windowMs?: number;
      /** Rows decoding together at most (more wait for a free row). */
      maxBatchSize?: number;
      /** Decode steps between admissions (1 = every step; joins and streamed tokens wait up to N − 1 steps). */
      stepsPerRun?: number;
      stats?: BatchStats;
    } = {},
  ) {}

  /** Sequences waiting to join the batch. */
  get pending(): number {
    return this.queue.reduce((n, j) => n + j.seqs.length, 0);
  }

  /** Sequences decoding now. */
  get active(): number {
    return this.rows.length;
  }

  /** Generates every sequence of `seqs`; rejects with a ConfigError for bad params or prompts. */
  submit(seqs: GenerationRequest[], paramsIn: SamplingParamsInput, opts: SubmitOptions = {}): Promise<BatchResult> {
    return new Promise((resolve, reject) => {
      const c = this.decoder.config;
      const params = samplingParams(paramsIn);
      const top = opts.topLogprobs ?? 0;
      if (!Number.isInteger(top) || top < 0 || top > this.decoder.topWidth)
        throw new ConfigError(`top_logprobs must be an integer in 0..${this.decoder.topWidth}, got ${top}`);
      for (const e of params.eosTokenIds ?? [])
        if (e >= c.vocabSize) throw new ConfigError(`stop token ${e} is outside the vocabulary (${c.vocabSize} ids)`);
      seqs.forEach((r, i) => {
        if (r.prompt.length === 0) throw new ConfigError(`sequence ${i} (${r.id}): empty prompt`);
        if (r.prompt.length + params.maxNewTokens > c.maxPositionEmbeddings)
          throw new ConfigError(
            `sequence ${i} (${r.id}): prompt length ${r.prompt.length} + ${params.maxNewTokens} new tokens exceeds the context (${c.maxPositionEmbeddings})`,
          );
        for (let t = 0; t < r.prompt.length; t++) {
          const v = r.prompt[t];
          if (!Number.isInteger(v) || v < 0 || v >= c.vocabSize)
            throw new ConfigError(`sequence ${i} (${r.id}): token ${v} is outside the vocabulary (${c.vocabSize} ids)`);
        }
      });
      if (seqs.length === 0) return resolve({ version: this.current().version, generations: [] });
      this.queue.push({ seqs, params, opts, left: seqs.length, results: [], resolve, reject });
      this.kick();
    });
  }

  private kick(): void {
    if (this.running || this.timer) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.drain();
    }, this.opts.windowMs ?? 5);
  }

  private async drain(): Promise<void> {
    this.running = true;
    try {
      while (this.queue.length || this.rows.length) {
        if (this.queue.length) await this.admit();
        if (this.rows.length) await this.decode();
        // let the server read new requests and flush streamed tokens between runs; while requests
        // keep arriving, read on (up to 8 turns), so requests sent together join together
        await new Promise((r) => setImmediate(r));
        for (let k = 0, n = this.pending; k < 8 && n > 0; k++) {
          await new Promise((r) => setImmediate(r));
          if (this.pending === n) break;
          n = this.pending;
        }
      }
    } finally {
      this.running = false;
      this.state = null;
      this.policy = null;
    }
  }

  /** Prefills the waiting requests that fit and appends their rows to the running batch. */
  private async admit(): Promise<void> {
    const latest = this.current();
    if (this.rows.length && this.policy && latest.version !== this.policy.version) return; // drain first
    if (!this.rows.length) this.policy = latest;
    const max = this.opts.maxBatchSize ?? 64;
    const take: Job[] = [];
    let n = this.rows.length;
    while (this.queue.length && (n === 0 || n + this.queue[0].seqs.length <= max)) {
      const j = this.queue.shift()!;
      take.push(j);
      n += j.seqs.length;
    }
    if (!take.length) return;
    const seqs = take.flatMap((j) => j.seqs);
    this.opts.stats?.onPrefill?.(seqs.length);
    let pre;
    try {
      pre = await this.decoder.prefill(this.policy!.weights, seqs);
    } catch (e) {
      for (const j of take) j.reject(e);
      return;
    }
    for (const j of take)
      j.seqs.forEach((s, i) => {
        const out: SequenceResult = { id: s.id, tokens: [], logprobs: [], top: [], finishReason: 'length' };
        j.results.push(out);
        this.rows.push({
          job: j,
          seq: i,
          uniforms: sequenceUniforms(j.params.seed, s.id, j.params.maxNewTokens),
          eos: new Set(j.params.eosTokenIds ?? [this.decoder.config.eosTokenId]),
          out,
        });
      });
    this.state = appendRows(this.decoder.config, this.state ?? emptyState(this.decoder.config), pre);
  }

  /** One decode run of the running batch; hands out its tokens and retires finished rows. */
  private async decode(): Promise<void> {
    const rows = this.rows,
      st = this.state!,
      policy = this.policy!;
    const c = this.decoder.config;
    let N = Math.max(1, this.opts.stepsPerRun ?? 1);
    for (let b = 0; b < rows.length; b++) N = Math.min(N, c.maxPositionEmbeddings - Number(st.pos[b]));
    N = Math.max(1, N);
    const B = rows.length;
    const u = new Float32Array(B * N).fill(0.5);
    rows.forEach((r, b) => {
      const at = r.out.tokens.length;
      u.set(r.uniforms.subarray(at, Math.min(at + N, r.uniforms.length)), b * N);
    });
    const eos = [...new Set(rows.flatMap((r) => [...r.eos]))];
    const t0 = performance.now();
    let res;
    try {
      res = await this.decoder.step(
        policy.weights,
        st,
        u,
        N,
        rows.map((r) => ({ temperature: r.job.params.temperature, topP: r.job.params.topP, topK: r.job.params.topK })),
        eos,
        rows.some((r) => (r.job.opts.topLogprobs ?? 0) > 0),
      );
    } catch (e) {
      for (const j of new Set(rows.map((r) => r.job))) j.reject(e);
      this.rows = [];
      this.state = null;
      return;
    }
    this.opts.stats?.onBatch?.(B, performance.now() - t0);
    const K = this.decoder.topWidth;
    const keep: number[] = [];
    rows.forEach((r, b) => {
      const want = r.job.opts.topLogprobs ?? 0;
      let finished = false;
      for (let t = 0; t < res.steps && !finished; t++) {
        const token = Number(res.tokens[t * B + b]);
        const logprob = res.logprobs[t * B + b];
        const top: SampledToken['top'] = [];
        for (let k = 0; k < want; k++)
          top.push({ token: Number(res.topIds[(t * B + b) * K + k]), logprob: res.topLogprobs[(t * B + b) * K + k] });
        r.out.tokens.push(token);
        r.out.logprobs.push(logprob);
        if (want) r.out.top.push(top);
        if (Number.isNaN(logprob)) {
          r.job.reject(
            new ConfigError(`generation for ${r.out.id}: the model's logits are not finite (diverged weights?)`),
          );
          finished = true;
          break;
        }
        if (r.job.opts.onToken?.(r.seq, { token, logprob, top }, policy.version) === true) {
          r.out.finishReason = r.eos.has(token) ? 'eos' : 'stopped';
          finished = true;
        } else if (r.eos.has(token)) {
          r.out.finishReason = 'eos';
          finished = true;
        } else if (r.out.tokens.length >= r.job.params.maxNewTokens) finished = true;
      }
      if (!finished) keep.push(b);
      else if (--r.job.left === 0) r.job.resolve({ version: policy.version, generations: r.job.results });
    });
    this.rows = keep.length === B ? rows : keepRows(c, st, keep).map((b) => rows[b]);
  }
}
