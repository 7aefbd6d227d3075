/**
 * Function rewards (built-in `reward.reward_fn` or a user module, `reward.reward_fn_path`) run in
 * a worker thread, one sample at a time, each with `reward.timeout_s`: a function that never
 * returns — a busy loop included, which would block the stage's own thread — becomes a recorded
 * failure of that sample; the worker is stopped and a fresh one serves the next sample.
 */
import { Worker } from 'node:worker_threads';
import { ConfigError, errorMessage } from '../errors.ts';
import type { RewardInput, RewardOutcome } from './index.ts';

export interface FunctionRewardSpec {
  path: string | null;
  name: string | null;
}

type Reply = { ready: true } | { loadError: string } | { seq: number; outcome: RewardOutcome };

/**
 * The worker's entry: under tsx (this file is .ts) the worker registers tsx first, as
 * bin/rlstream.mjs does for the main thread (loader hooks are not inherited by workers).
 */
function workerSource(): string {
  const self = import.meta.url;
  if (!self.endsWith('.ts')) return `import(${JSON.stringify(new URL('./worker.js', self).href)});`;
  const tsx = import.meta.resolve('tsx/esm/api');
  return `import(${JSON.stringify(tsx)}).then((m) => { m.register(); return import(${JSON.stringify(new URL('./worker.ts', self).href)}); });`;
}

export class FunctionRewardWorker {
  private worker: Worker | null = null;
  private started: Promise<void> | null = null;
  private seq = 0;
  private waiting = new Map<number, (r: RewardOutcome) => void>();
  private failure: ((e: Error) => void) | null = null;

  constructor(
    private readonly spec: FunctionRewardSpec,
    private readonly timeoutMs: number,
  ) {}

  private what(): string {
    return this.spec.path ?? this.spec.name ?? 'reward function';
  }

  /** Starts the worker (loads the function); rejects with a ConfigError when the module cannot be loaded. */
  start(): Promise<void> {
    if (this.started) return this.started;
    const w = new Worker(workerSource(), { eval: true, workerData: this.spec });
    this.worker = w;
    this.started = new Promise<void>((resolve, reject) => {
      w.on('message', (m: Reply) => {
        if ('ready' in m) resolve();
        else if ('loadError' in m) reject(new ConfigError(m.loadError));
        else {
          const r = this.waiting.get(m.seq);
          this.waiting.delete(m.seq);
          r?.(m.outcome);
        }
      });
      const lost = (e: Error) => {
        reject(e);
        if (this.worker === w) {
          this.worker = null;
          this.started = null;
        }
        this.failure?.(e);
      };
      w.on('error', (e) => lost(new Error(`reward function ${this.what()} crashed its worker: ${errorMessage(e)}`)));
      w.on('exit', (code) => lost(new Error(`reward function ${this.what()}: its worker exited (code ${code})`)));
    });
    this.started.catch(() => undefined);
    return this.started;
  }

  /** The outcome of one sample; a timeout or a crashed worker is a failed outcome, never a throw. */
  async score(input: RewardInput): Promise<RewardOutcome> {
    await this.start();
    const w = this.worker!;
    const seq = ++this.seq;
    return new Promise<RewardOutcome>((resolve) => {
      const done = (o: RewardOutcome) => {
        clearTimeout(timer);
        this.waiting.delete(seq);
        this.failure = null;
        resolve(o);
      };
      const timer = setTimeout(() => {
        done({
          ok: false,
          reason: `reward function did not return within reward.timeout_s = ${this.timeoutMs / 1000} s (a busy loop, or a wait that never ends); its worker was stopped`,
        });
        this.stop();
      }, this.timeoutMs);
      this.waiting.set(seq, done);
      this.failure = (e) => done({ ok: false, reason: errorMessage(e) });
      w.postMessage({ seq, input });
    });
  }

  private stop(): void {
    const w = this.worker;
    this.worker = null;
    this.started = null;
    if (w) {
      w.removeAllListeners('exit');
      w.removeAllListeners('error');
      w.on('error', () => undefined);
      void w.terminate();
    }
  }

  async close(): Promise<void> {
    this.stop();
  }
}
