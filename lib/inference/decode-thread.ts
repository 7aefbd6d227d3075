/**
 * Continuous batching on a thread of its own: the HTTP thread's side of decode-worker.ts. The
 * worker holds the ORT sessions and the running batch, so decode steps run back to back while
 * this thread reads requests, encodes responses and writes them (as vLLM's engine core runs
 * apart from its API server). `submit` has GenerationBatcher's contract: the same tokens for the
 * same (seed, sequence id), `onToken` for every token in order, and a sequence ends at the token
 * whose `onToken` returned true (the worker is told to stop it; tokens it decoded meanwhile are
 * dropped here).
 *
 * The worker holds the only copy of the weights: `setPolicy` names a version's directory, the
 * worker reads it and answers, and this thread keeps the directory of the version last loaded. A
 * worker that dies fails the requests and loads it held (non-retriable to the client: a 500) and
 * the next request starts a fresh one, which reads that directory again.
 */
import { Worker } from 'node:worker_threads';
import { ConfigError, RlError } from '../errors.ts';
import type { ModelConfig } from '../model/config.ts';
import type { GenerationRequest, SamplingParamsInput } from '../model/sample.ts';
import type { BatchResult, BatchStats, SampledToken, SequenceResult, SubmitOptions } from './batcher.ts';
import type { DecodeWorkerData, FromWorker, ToWorker } from './decode-worker.ts';
import type { PolicyRef } from './policy-weights.ts';

interface Job {
  opts: SubmitOptions;
  results: SequenceResult[];
  /** The sequence ended here (onToken returned true): later tokens are dropped. */
  ended: boolean[];
  eos: Set<number>;
  resolve: (r: BatchResult) => void;
  reject: (e: unknown) => void;
}

/** The worker's entry; under tsx (this file is .ts) the worker registers tsx first (hooks are per thread). */
function workerSource(): string {
  const self = import.meta.url;
  if (!self.endsWith('.ts')) return `import(${JSON.stringify(new URL('./decode-worker.js', self).href)});`;
  const tsx = import.meta.resolve('tsx/esm/api');
  return `import(${JSON.stringify(tsx)}).then((m) => { m.register(); return import(${JSON.stringify(new URL('./decode-worker.ts', self).href)}); });`;
}

export class ThreadedBatcher {
  private worker: Worker | null = null;
  private jobs = new Map<number, Job>();
  private nextJob = 0;
  /** The version the worker serves (the last load that succeeded). */
  private policy: PolicyRef | null = null;
  private loads = new Map<number, { resolve: () => void; reject: (e: unknown) => void }>();
  private nextLoad = 0;
  private waiting = 0;
  private closed = false;

  constructor(
    private readonly config: ModelConfig,
    private readonly opts: {
      threads?: number;
      windowMs?: number;
      maxBatchSize?: number;
      stepsPerRun?: number;
      stats?: BatchStats;
    } = {},
  ) {}

  /** Sequences waiting to join the batch (as of the worker's last decode run). */
  get pending(): number {
    return this.waiting;
  }

  /** The version requests are served with (null before the first load succeeds). */
  get version(): PolicyRef | null {
    return this.policy;
  }

  /**
   * Has the worker (started if need be) load the weights of `p.dir`; resolves once requests
   * submitted from then on are admitted with them, rejects with the load's error (a missing
   * directory, another model's weights) and the version before keeps serving.
   */
  setPolicy(p: PolicyRef): Promise<void> {
    if (this.closed) return Promise.reject(new RlError('the policy server is closing', { code: 'ERR_CLOSED' }));
    const w = this.start();
    return new Promise((resolve, reject) => {
      const req = this.nextLoad++;
      const ref = { version: p.version, dir: p.dir };
      this.loads.set(req, {
        resolve: () => {
          this.policy = ref;
          resolve();
        },
        reject,
      });
      w.postMessage({ type: 'load', req, version: ref.version, dir: ref.dir } satisfies ToWorker);
    });
  }

  private start(): Worker {
    if (this.worker) return this.worker;
    const data: DecodeWorkerData = {
      config: this.config,
      threads: this.opts.threads,
      windowMs: this.opts.windowMs,
      maxBatchSize: this.opts.maxBatchSize,
      stepsPerRun: this.opts.stepsPerRun,
    };
    const w = new Worker(workerSource(), { eval: true, workerData: data });
    this.worker = w;
    w.on('message', (m: FromWorker) => this.receive(m));
    const lost = (why: string) => {
      if (this.worker !== w) return;
      this.worker = null;
      this.waiting = 0;
      const err = new RlError(`the decode thread ${why}`, { code: 'ERR_DECODE_THREAD', retriable: true });
      for (const j of this.jobs.values()) j.reject(err);
      this.jobs.clear();
      for (const l of this.loads.values()) l.reject(err);
      this.loads.clear();
    };
    w.on('error', (e) => lost(`crashed: ${e.message}`));
    w.on('exit', (code) => lost(`exited (code ${code})`));
    // a restart reads the served version again (its answer has no waiter)
    const p = this.policy;
    if (p) w.postMessage({ type: 'load', req: -1, version: p.version, dir: p.dir } satisfies ToWorker);
    return w;
  }

  private receive(m: FromWorker): void {
    if (m.type === 'loaded' || m.type === 'load-error') {
      const l = this.loads.get(m.req);
      if (!l) return;
      this.loads.delete(m.req);
      if (m.type === 'loaded') l.resolve();
      else
        l.reject(
          m.config ? new ConfigError(m.message) : new RlError(m.message, { code: m.code, retriable: m.retriable }),
        );
      return;
    }
    if (m.type === 'tokens') {
      this.waiting = m.pending;
      for (const n of m.prefills) this.opts.stats?.onPrefill?.(n);
      if (m.rows) this.opts.stats?.onBatch?.(m.rows, 0);
      for (let i = 0; i < m.job.length; i++) {
        const j = this.jobs.get(m.job[i]);
        const s = m.seq[i];
        if (!j || j.ended[s]) continue;
        const t: SampledToken = { token: m.token[i], logprob: m.logprob[i], top: m.top?.[i] ?? [] };
        const out = j.results[s];
        out.tokens.push(t.token);
        out.logprobs.push(t.logprob);
        if (j.opts.topLogprobs) out.top.push(t.top);
        if (j.opts.onToken?.(s, t, m.version) === true) {
          j.ended[s] = true;
          out.finishReason = j.eos.has(t.token) ? 'eos' : 'stopped';
          this.worker?.postMessage({ type: 'stop', job: m.job[i], seq: s } satisfies ToWorker);
        }
      }
      return;
    }
    const j = this.jobs.get(m.job);
    if (!j) return;
    this.jobs.delete(m.job);
    if (m.type === 'error') {
      j.reject(m.config ? new ConfigError(m.message) : new RlError(m.message, { code: 'ERR_DECODE' }));
      return;
    }
    j.results.forEach((r, s) => {
      if (!j.ended[s]) r.finishReason = m.finish[s] as SequenceResult['finishReason'];
    });
    j.resolve({ version: m.version, generations: j.results });
  }

  /** Generates every sequence of `seqs`; rejects with a ConfigError for bad params or prompts. */
  submit(seqs: GenerationRequest[], params: SamplingParamsInput, opts: SubmitOptions = {}): Promise<BatchResult> {
    if (this.closed) return Promise.reject(new RlError('the policy server is closing', { code: 'ERR_CLOSED' }));
    const w = this.start();
    return new Promise((resolve, reject) => {
      const job = this.nextJob++;
      this.jobs.set(job, {
        opts,
        results: seqs.map((s) => ({ id: s.id, tokens: [], logprobs: [], top: [], finishReason: 'length' })),
        ended: seqs.map(() => false),
        eos: new Set(params.eosTokenIds ?? [this.config.eosTokenId]),
        resolve,
        reject,
      });
      w.postMessage({
        type: 'submit',
        job,
        seqs: seqs.map((s) => ({ id: s.id, prompt: Array.from(s.prompt) })),
        params,
        top: opts.topLogprobs ?? 0,
      } satisfies ToWorker);
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    const w = this.worker;
    this.worker = null;
    const err = new RlError('the policy server is closing', { code: 'ERR_CLOSED' });
    for (const j of this.jobs.values()) j.reject(err);
    this.jobs.clear();
    for (const l of this.loads.values()) l.reject(err);
    this.loads.clear();
    if (w) await w.terminate();
  }
}
