/**
 * Batches the sequences of concurrent requests into shared Sampler calls.
 *
 * The Sampler runs a whole generation (prefill + decode loop) as one `session.run`, so a request
 * cannot join a batch that is already decoding. Instead, requests that arrive while a batch runs
 * (or within `windowMs` of an idle server) wait and go together into the next batch: one
 * `Sampler.generate` per distinct sampling setting, whose prompts are prefilled once per distinct
 * prompt (the `n` choices of a request share their prefill). A request's sequences always run
 * together, with the weights current when their batch starts.
 */
import type { Generation, GenerationRequest, Sampler, SamplingParamsInput } from '../model/sample.ts';
import type { PolicyWeights } from './served-policy.ts';

export interface BatchResult {
  version: number;
  generations: Generation[];
}

interface Job {
  seqs: GenerationRequest[];
  params: SamplingParamsInput;
  key: string;
  resolve: (r: BatchResult) => void;
  reject: (e: unknown) => void;
}

export interface BatchStats {
  /** Sequences in one Sampler call. */
  onBatch?(sequences: number, ms: number): void;
}

export class GenerationBatcher {
  private queue: Job[] = [];
  private running = false;
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly sampler: Sampler,
    private readonly current: () => PolicyWeights,
    private readonly opts: { windowMs?: number; stats?: BatchStats } = {},
  ) {}

  /** Sequences waiting for a batch. */
  get pending(): number {
    return this.queue.reduce((n, j) => n + j.seqs.length, 0);
  }

  submit(seqs: GenerationRequest[], params: SamplingParamsInput): Promise<BatchResult> {
    return new Promise((resolve, reject) => {
      const key = JSON.stringify([
        params.temperature,
        params.topP,
        params.topK,
        params.maxNewTokens,
        params.seed,
        params.eosTokenIds,
      ]);
      this.queue.push({ seqs, params, key, resolve, reject });
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
      while (this.queue.length) {
        const jobs = this.queue;
        this.queue = [];
        const policy = this.current();
        // one call per setting; a sequence id may appear once per call (it keys the randomness)
        const calls: Job[][] = [];
        const callIds: Set<string>[] = [];
        const byKey = new Map<string, number[]>();
        for (const j of jobs) {
          const candidates = byKey.get(j.key) ?? [];
          let at = candidates.find((c) => j.seqs.every((s) => !callIds[c].has(s.id)));
          if (at === undefined) {
            at = calls.length;
            calls.push([]);
            callIds.push(new Set());
            candidates.push(at);
            byKey.set(j.key, candidates);
          }
          calls[at].push(j);
          for (const s of j.seqs) callIds[at].add(s.id);
        }
        for (const call of calls) {
          const seqs = call.flatMap((j) => j.seqs);
          const t0 = performance.now();
          try {
            const gens = await this.sampler.generate(policy.weights, seqs, call[0].params);
            this.opts.stats?.onBatch?.(seqs.length, performance.now() - t0);
            let k = 0;
            for (const j of call) {
              j.resolve({ version: policy.version, generations: gens.slice(k, k + j.seqs.length) });
              k += j.seqs.length;
            }
          } catch (e) {
            for (const j of call) j.reject(e);
          }
        }
      }
    } finally {
      this.running = false;
    }
  }
}
