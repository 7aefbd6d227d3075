/**
 * The decode thread's entry (a worker thread started by decode-thread.ts): it holds the ORT
 * sessions, the only copy of the served weights and the running batch (batcher.ts), so decode
 * steps follow each other without waiting for the HTTP thread's event loop. Messages, in order on
 * one port:
 *
 *   in:  load {req, version, dir}         read a policy version's weights from its directory
 *                                         (policy-weights.ts loadPolicyWeights); admissions after
 *                                         it succeeds use them, a failure keeps the old ones
 *        submit {job, seqs, params, top}  one request's sequences (batcher.submit)
 *        stop {job, seq}                  end that sequence (a stop string matched, a client gone)
 *   out: tokens {version, job[], seq[], token[], logprob[], top, rows, prefills[], pending}
 *                                         every token of one decode run, with the run's row count,
 *                                         the prefills before it and the sequences still waiting
 *                                         (the server's metrics)
 *        done {job, version, finish[]}    error {job, message, config}
 *        loaded {req, version}            load-error {req, message, code, retriable, config}
 *
 * Loads run one at a time, in the order asked. A submit that arrives before any load has
 * succeeded waits for the loads asked so far (and fails if none gave weights).
 *
 * A decode run's tokens and counts go out as one message (a message costs more than a token);
 * a stop arrives a run or more after the token that asked for it, so the worker may decode a few
 * tokens that the HTTP thread drops.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { ConfigError, errorMessage, RlError } from '../errors.ts';
import type { ModelConfig } from '../model/config.ts';
import type { GenerationRequest, SamplingParamsInput } from '../model/sample.ts';
import { StepDecoder } from '../model/stepwise.ts';
import { GenerationBatcher, type SampledToken } from './batcher.ts';
import { loadPolicyWeights, type PolicyWeights } from './policy-weights.ts';

export interface DecodeWorkerData {
  config: ModelConfig;
  threads?: number;
  windowMs?: number;
  maxBatchSize?: number;
  stepsPerRun?: number;
}

export type ToWorker =
  | { type: 'load'; req: number; version: number; dir: string }
  | { type: 'submit'; job: number; seqs: GenerationRequest[]; params: SamplingParamsInput; top: number }
  | { type: 'stop'; job: number; seq: number };

export type FromWorker =
  | {
      type: 'tokens';
      version: number;
      job: Int32Array;
      seq: Int32Array;
      token: Int32Array;
      logprob: Float32Array;
      /** Per token, its top log-probs (null when no token has any). */
      top: SampledToken['top'][] | null;
      /** Rows of the decode run (0: no run, only prefills that failed). */
      rows: number;
      /** Sequences of each prefill since the last message. */
      prefills: number[];
      pending: number;
    }
  | { type: 'done'; job: number; version: number; finish: string[] }
  | { type: 'error'; job: number; message: string; config: boolean }
  | { type: 'loaded'; req: number; version: number }
  | { type: 'load-error'; req: number; message: string; code: string; retriable: boolean; config: boolean };

const port = parentPort!;
const data = workerData as DecodeWorkerData;
const post = (m: FromWorker) => port.postMessage(m);

let current: PolicyWeights | null = null;
// the loads asked so far, one after another
let loads: Promise<void> = Promise.resolve();
let loadFailure = '';
const stops = new Set<string>();
const batcher = new GenerationBatcher(new StepDecoder(data.config, { threads: data.threads }), () => current!, {
  windowMs: data.windowMs,
  maxBatchSize: data.maxBatchSize,
  stepsPerRun: data.stepsPerRun,
  stats: {
    onBatch: (rows) => {
      run().rows = rows;
    },
    onPrefill: (rows) => {
      run().prefills.push(rows);
    },
  },
});

interface Run {
  version: number;
  job: number[];
  seq: number[];
  token: number[];
  logprob: number[];
  top: SampledToken['top'][];
  anyTop: boolean;
  rows: number;
  prefills: number[];
}
// what one decode run handed out, sent as one message once the run's hand-out is over
let out: Run | null = null;
function run(): Run {
  if (!out) {
    out = { version: 0, job: [], seq: [], token: [], logprob: [], top: [], anyTop: false, rows: 0, prefills: [] };
    queueMicrotask(flush);
  }
  return out;
}
function flush(): void {
  if (!out) return;
  const o = out;
  out = null;
  post({
    type: 'tokens',
    version: o.version,
    job: Int32Array.from(o.job),
    seq: Int32Array.from(o.seq),
    token: Int32Array.from(o.token),
    logprob: Float32Array.from(o.logprob),
    top: o.anyTop ? o.top : null,
    rows: o.rows,
    prefills: o.prefills,
    pending: batcher.pending,
  });
}

port.on('message', (m: ToWorker) => {
  if (m.type === 'load') {
    loads = loads.then(() =>
      loadPolicyWeights(m.dir, data.config, m.version).then(
        (w) => {
          current = w;
          post({ type: 'loaded', req: m.req, version: w.version });
        },
        (e: unknown) => {
          loadFailure = errorMessage(e);
          post({
            type: 'load-error',
            req: m.req,
            message: errorMessage(e),
            code: e instanceof RlError ? e.code : 'ERR_LOAD',
            retriable: e instanceof RlError ? e.retriable : false,
            config: e instanceof ConfigError,
          });
        },
      ),
    );
    return;
  }
  if (m.type === 'stop') {
    stops.add(`${m.job}:${m.seq}`);
    return;
  }
  if (current) submit(m);
  else void loads.then(() => submit(m));
});

function submit(m: Extract<ToWorker, { type: 'submit' }>): void {
  const job = m.job;
  if (!current) {
    post({ type: 'error', job, message: `no policy weights are loaded: ${loadFailure}`, config: false });
    return;
  }
  batcher
    .submit(m.seqs, m.params, {
      topLogprobs: m.top,
      onToken: (seq, t, version) => {
        const o = run();
        o.version = version;
        o.job.push(job);
        o.seq.push(seq);
        o.token.push(t.token);
        o.logprob.push(t.logprob);
        o.top.push(t.top);
        if (t.top.length) o.anyTop = true;
        return stops.has(`${job}:${seq}`);
      },
    })
    .then(
      (res) => {
        flush();
        for (let i = 0; i < m.seqs.length; i++) stops.delete(`${job}:${i}`);
        post({ type: 'done', job, version: res.version, finish: res.generations.map((g) => g.finishReason) });
      },
      (e: unknown) => {
        flush();
        for (let i = 0; i < m.seqs.length; i++) stops.delete(`${job}:${i}`);
        post({ type: 'error', job, message: errorMessage(e), config: e instanceof ConfigError });
      },
    );
}
