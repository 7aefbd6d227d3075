/**
 * Python reward functions (`reward.reward_fn_path: score.py`): a pool of long-lived Python worker
 * processes (`python_worker.py`, standard library only) run by `reward.python` (default `python3`
 * on PATH). Each worker imports the module once; the pool sends it many items per message (one JSON
 * line each way), so the pipe costs little per sample. The function is called in one of the
 * shapes people have (`reward.reward_fn_form`): verl's per-sample `compute_score`, EasyR1's batch
 * and sequential forms, or MTRL's `data_dict` → `(reward, metrics)`. Images reach it as PNG file
 * paths (written once per image, named by hash).
 *
 * Each call has `reward.timeout_s` (an alarm inside the worker: the call fails, the worker lives
 * on); a message that does not come back within its budget, or a worker that dies, fails its
 * items and the worker is replaced. An exception's message and the traceback's last frame are the
 * stored failure's reason and are printed once per distinct message. A missing interpreter, module
 * or function fails `start()` with one line.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { ConfigError } from '../errors.ts';
import { imageHashOf } from '../data/image-hash.ts';
import { isRemoteRewardEnabled, type RewardOutcome as ItemOutcome } from '../reward/types.ts';
import { parseExtraInfo } from './index.ts';

export const PYTHON_REWARD_FORMS = ['verl', 'easyr1_batch', 'easyr1_sequential', 'mtrl'] as const;
export type PythonRewardForm = (typeof PYTHON_REWARD_FORMS)[number];

/** A `.py` reward_fn_path runs in Python. */
export function isPythonRewardPath(path: string | null | undefined): boolean {
  return typeof path === 'string' && path.toLowerCase().endsWith('.py');
}

/** The worker script: beside this module (sources), or in the source tree from a `dist/` build (tsc copies no .py). */
const besideThis = fileURLToPath(new URL('./python_worker.py', import.meta.url));
export const PYTHON_WORKER_SCRIPT = existsSync(besideThis)
  ? besideThis
  : fileURLToPath(new URL('../../../lib/reward-fns/python_worker.py', import.meta.url));

export interface PythonPoolOptions {
  path: string;
  /** Function name in the module (default compute_score). */
  name?: string | null;
  form?: PythonRewardForm;
  /** Interpreter (default python3 on PATH). */
  python?: string | null;
  /** Worker processes (default min(4, cores)). */
  workers?: number | null;
  /** Time limit of one call, seconds. */
  timeoutS: number;
  kwargs?: Record<string, unknown>;
  /** Most items per message (default 256). */
  maxItemsPerMessage?: number;
  /** Where warnings (first occurrence of each exception, replaced workers) go; default stderr. */
  warn?: (msg: string) => void;
  /** Where the workers' own stderr lines (the function's print()) go; default process.stderr. */
  stderr?: (line: string) => void;
}

/** One reward input, as rlstream has it. */
export interface PythonRewardItem {
  prompt: string;
  response: string;
  ground_truth: string;
  data_source?: string;
  extra_info?: Record<string, unknown>;
  /** Response length in tokens (EasyR1's response_length). */
  response_length?: number;
  /** The prompt's images as PNG bytes: written to files, their paths reach the function. */
  images?: Uint8Array[];
}

export type PythonOutcome =
  { ok: true; reward: number; metrics: Record<string, number | string> } | { ok: false; reason: string };

type WireError = { error: string; where: string; timeout?: boolean };
/** A worker's answer: columns, one entry per item; errors by item index. */
interface WireReply {
  rewards: Array<number | null>;
  metrics?: Array<Record<string, number | boolean | string> | null>;
  errors: Record<string, WireError>;
}

interface Job {
  /** The items as columns (what the worker reads), n of them. */
  cols: Record<string, unknown[]>;
  n: number;
  calls: number;
  resolve: (r: PythonOutcome[]) => void;
}

interface Proc {
  child: ChildProcess;
  busy: Job | null;
  timer: NodeJS.Timeout | null;
  dead: boolean;
}

const START_TIMEOUT_MS = 120_000;
/** Slack on top of timeout_s × calls before a message counts as lost (pipe, JSON, scheduling). */
const MESSAGE_SLACK_MS = 5_000;

export class PythonRewardPool {
  readonly what: string;
  private readonly abs: string;
  private readonly name: string;
  private readonly form: PythonRewardForm;
  private readonly python: string;
  private readonly size: number;
  private readonly maxItems: number;
  private procs: Proc[] = [];
  private idle: Proc[] = [];
  private queue: Job[] = [];
  private seq = 0;
  private closed = false;
  private readonly seen = new Set<string>();
  private imageDir: string | null = null;
  /** The interpreter's version, once started. */
  pythonVersion = '';

  constructor(private readonly opts: PythonPoolOptions) {
    this.abs = resolve(opts.path);
    this.name = opts.name ?? 'compute_score';
    this.form = opts.form ?? 'verl';
    this.python = opts.python ?? 'python3';
    this.size = Math.max(1, opts.workers ?? Math.min(4, availableParallelism()));
    this.maxItems = Math.max(1, opts.maxItemsPerMessage ?? 256);
    this.what = `${basename(this.abs)}:${this.name}`;
  }

  private warn(msg: string): void {
    (this.opts.warn ?? ((m: string) => process.stderr.write(`warning: ${m}\n`)))(msg);
  }

  /** Starts every worker; rejects with one line (a ConfigError) when the interpreter, module or function is missing. */
  async start(): Promise<void> {
    if (!existsSync(this.abs)) throw new ConfigError(`reward.reward_fn_path: file not found: ${this.abs}`);
    if (!(PYTHON_REWARD_FORMS as readonly string[]).includes(this.form))
      throw new ConfigError(
        `reward.reward_fn_form: unknown form "${this.form}" (valid: ${PYTHON_REWARD_FORMS.join(', ')})`,
      );
    const started = await Promise.allSettled(Array.from({ length: this.size }, () => this.spawnOne()));
    const failed = started.find((s) => s.status === 'rejected');
    if (failed) {
      for (const s of started) if (s.status === 'fulfilled') this.kill(s.value);
      throw failed.reason;
    }
    for (const s of started)
      if (s.status === 'fulfilled') {
        this.procs.push(s.value);
        this.idle.push(s.value);
      }
  }

  private spawnOne(): Promise<Proc> {
    const child = spawn(this.python, [PYTHON_WORKER_SCRIPT, this.abs, this.name, this.form], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, PYTHONUNBUFFERED: '1', PYTHONIOENCODING: 'utf-8', PYTHONDONTWRITEBYTECODE: '1' },
    });
    const proc: Proc = { child, busy: null, timer: null, dead: false };
    const errLines: string[] = [];
    let ready = false;
    return new Promise<Proc>((resolveStart, rejectStart) => {
      const fail = (msg: string) => {
        if (ready) return;
        ready = true;
        clearTimeout(startTimer);
        this.kill(proc);
        rejectStart(new ConfigError(msg));
      };
      const startTimer = setTimeout(
        () =>
          fail(
            `reward.reward_fn_path: ${this.abs} did not finish importing within ${START_TIMEOUT_MS / 1000} s under ${this.python}`,
          ),
        START_TIMEOUT_MS,
      );
      child.on('error', (e: NodeJS.ErrnoException) =>
        fail(
          e.code === 'ENOENT'
            ? `reward.python: interpreter "${this.python}" not found (needed by reward.reward_fn_path = ${this.abs}); install Python 3 or set reward.python to one`
            : `reward.python: cannot start "${this.python}": ${e.message}`,
        ),
      );
      createInterface({ input: child.stderr! }).on('line', (line) => {
        if (!ready) {
          errLines.push(line);
          if (errLines.length > 20) errLines.shift();
        }
        (this.opts.stderr ?? ((l: string) => process.stderr.write(`${l}\n`)))(
          `[${this.what} pid ${child.pid}] ${line}`,
        );
      });
      createInterface({ input: child.stdout! }).on('line', (line) => {
        let m: Partial<WireReply> & { ready?: boolean; python?: string; loadError?: string; id?: number };
        try {
          m = JSON.parse(line);
        } catch {
          this.lost(proc, `sent a line that is not the pool's protocol: ${line.slice(0, 120)}`);
          return;
        }
        if (m.loadError !== undefined)
          return fail(`reward.reward_fn_path: ${m.loadError} (interpreter ${this.python})`);
        if (m.ready) {
          ready = true;
          clearTimeout(startTimer);
          this.pythonVersion = m.python ?? '';
          resolveStart(proc);
          return;
        }
        this.finish(proc, m as WireReply);
      });
      child.on('exit', (code, signal) => {
        const how = signal ? `signal ${signal}` : `code ${code}`;
        if (!ready) {
          const last = errLines.filter((l) => l.trim()).at(-1);
          fail(
            `reward.reward_fn_path: the Python worker for ${this.abs} exited at start (${how}) under ${this.python}${last ? `: ${last.trim()}` : ''}`,
          );
          return;
        }
        this.lost(proc, `exited (${how})`);
      });
      child.stdin!.on('error', () => undefined);
    });
  }

  private kill(proc: Proc): void {
    proc.dead = true;
    if (proc.timer) clearTimeout(proc.timer);
    proc.child.removeAllListeners('exit');
    if (proc.child.exitCode === null && proc.child.signalCode === null) proc.child.kill('SIGKILL');
  }

  /** A worker died or stopped answering: its items fail, and a fresh worker takes its place. */
  private lost(proc: Proc, why: string): void {
    if (proc.dead) return;
    this.kill(proc);
    this.procs = this.procs.filter((p) => p !== proc);
    this.idle = this.idle.filter((p) => p !== proc);
    const job = proc.busy;
    proc.busy = null;
    const reason = `python reward worker for ${this.what} ${why} while scoring; it was replaced`;
    if (job) job.resolve(Array.from({ length: job.n }, () => ({ ok: false, reason })));
    if (this.closed) return;
    this.warn(reason);
    this.spawnOne().then(
      (p) => {
        if (this.closed) return this.kill(p);
        this.procs.push(p);
        this.release(p);
      },
      (e: Error) => {
        this.warn(`could not replace the python reward worker: ${e.message}`);
        // nothing left to serve the queue: fail it rather than wait forever
        if (this.procs.length === 0)
          for (const j of this.queue.splice(0))
            j.resolve(Array.from({ length: j.n }, () => ({ ok: false, reason: e.message })));
      },
    );
  }

  private finish(proc: Proc, reply: WireReply): void {
    const job = proc.busy;
    if (!job) return;
    if (proc.timer) clearTimeout(proc.timer);
    proc.timer = null;
    proc.busy = null;
    job.resolve(Array.from({ length: job.n }, (_, i) => this.outcome(reply, i)));
    this.release(proc);
  }

  private outcome(reply: WireReply, i: number): PythonOutcome {
    const r = reply.errors?.[i];
    if (r) {
      const reason = r.timeout
        ? `python reward function ${this.what} ${r.error}${r.where ? ` (stopped at ${r.where})` : ''}`
        : `python reward function ${this.what} raised ${r.error}${r.where ? ` (at ${r.where})` : ''}`;
      if (!this.seen.has(reason) && this.seen.size < 50) {
        this.seen.add(reason);
        this.warn(reason);
      }
      return { ok: false, reason };
    }
    const reward = reply.rewards?.[i];
    if (typeof reward !== 'number' || !Number.isFinite(reward))
      return {
        ok: false,
        reason: `python reward function ${this.what}: no reward came back for this item (${reward})`,
      };
    const metrics: Record<string, number | string> = {};
    for (const [k, v] of Object.entries(reply.metrics?.[i] ?? {}))
      metrics[k] = typeof v === 'boolean' ? (v ? 1 : 0) : v;
    if (metrics.overall === undefined) metrics.overall = reward;
    return { ok: true, reward, metrics };
  }

  private release(proc: Proc): void {
    const job = this.queue.shift();
    if (!job) {
      this.idle.push(proc);
      return;
    }
    this.send(proc, job);
  }

  private send(proc: Proc, job: Job): void {
    proc.busy = job;
    const id = ++this.seq;
    const budget = this.opts.timeoutS * 1000 * job.calls + MESSAGE_SLACK_MS;
    proc.timer = setTimeout(
      () => this.lost(proc, `did not answer within ${(budget / 1000).toFixed(0)} s (stuck outside Python code?)`),
      budget,
    );
    const msg = { id, timeout: this.opts.timeoutS, kwargs: this.opts.kwargs ?? {}, n: job.n, cols: job.cols };
    proc.child.stdin!.write(`${JSON.stringify(msg)}\n`);
  }

  private imagePaths(images: Uint8Array[] | undefined): string[] | undefined {
    if (!images || images.length === 0) return undefined;
    if (!this.imageDir) {
      this.imageDir = join(tmpdir(), 'rlstream-reward-images');
      mkdirSync(this.imageDir, { recursive: true });
    }
    return images.map((png) => {
      const f = join(this.imageDir!, `${imageHashOf(png)}.png`);
      if (!existsSync(f)) writeFileSync(f, png);
      return f;
    });
  }

  /** One outcome per item, in order; a failure is an outcome with its reason, never a throw. */
  async score(items: PythonRewardItem[]): Promise<PythonOutcome[]> {
    if (this.closed) throw new Error('python reward pool is closed');
    if (items.length === 0) return [];
    // only the columns the form reads (verl: no prompt or response_length)
    const easyr1 = this.form !== 'verl';
    const anyImages = items.some((it) => it.images?.length);
    // spread over the workers, at most maxItems per message
    const per = Math.min(this.maxItems, Math.ceil(items.length / this.size));
    const parts: Promise<PythonOutcome[]>[] = [];
    for (let i = 0; i < items.length; i += per) {
      const chunk = items.slice(i, i + per);
      const cols: Record<string, unknown[]> = {
        response: chunk.map((it) => it.response),
        ground_truth: chunk.map((it) => it.ground_truth),
        data_source: chunk.map((it) => it.data_source ?? ''),
        extra_info: chunk.map((it) => it.extra_info ?? null),
      };
      if (easyr1) {
        cols.prompt = chunk.map((it) => it.prompt);
        cols.response_length = chunk.map((it) => it.response_length ?? 0);
      }
      if (anyImages) cols.images = chunk.map((it) => this.imagePaths(it.images) ?? null);
      parts.push(
        new Promise<PythonOutcome[]>((res) => {
          const job: Job = {
            cols,
            n: chunk.length,
            calls: this.form === 'easyr1_batch' ? 1 : chunk.length,
            resolve: res,
          };
          const p = this.idle.shift();
          if (p) this.send(p, job);
          else this.queue.push(job);
        }),
      );
    }
    return (await Promise.all(parts)).flat();
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const p of new Set([...this.procs, ...this.idle])) {
      p.child.stdin!.end();
      this.kill(p);
    }
    for (const j of this.queue.splice(0))
      j.resolve(Array.from({ length: j.n }, () => ({ ok: false, reason: 'python reward pool closed' })));
    this.procs = [];
    this.idle = [];
  }
}

/**
 * The reward stage's backend for a Python module: the same `{name, score, close}` shape as the
 * other backends, outcomes keyed by trajectory id (a failure is never retriable: the same input
 * gives the same exception).
 */
export async function createPythonRewardBackend(
  r: {
    reward_fn_path: string;
    reward_fn_name?: string | null;
    reward_fn_form?: PythonRewardForm;
    python?: string | null;
    python_workers?: number | null;
    timeout_s: number;
    reward_fn_kwargs: Record<string, unknown>;
  },
  warn?: (msg: string) => void,
): Promise<{
  name: string;
  score(
    items: Array<{
      id: string;
      prompt_text: string;
      response_text: string;
      ground_truth?: string;
      images?: Uint8Array[];
      response_ids?: ArrayLike<number>;
      data_source?: string;
      extra_info?: string;
    }>,
  ): Promise<ItemOutcome[]>;
  close(): Promise<void>;
}> {
  const pool = new PythonRewardPool({
    path: r.reward_fn_path,
    name: r.reward_fn_name,
    form: r.reward_fn_form,
    python: r.python,
    workers: r.python_workers,
    timeoutS: r.timeout_s,
    kwargs: r.reward_fn_kwargs,
    warn,
  });
  await pool.start();
  const name = `fn:${r.reward_fn_path}`;
  return {
    name,
    async score(items) {
      const outs = await pool.score(
        items.map((it) => ({
          prompt: it.prompt_text,
          response: it.response_text,
          ground_truth: it.ground_truth ?? '',
          data_source: it.data_source ?? '',
          extra_info: parseExtraInfo(it.extra_info),
          response_length: it.response_ids?.length ?? 0,
          images: it.images,
        })),
      );
      return outs.map((o, i): ItemOutcome =>
        o.ok
          ? { id: items[i]!.id, ok: true, reward: o.reward, details: o.metrics, server: name }
          : { id: items[i]!.id, ok: false, reason: o.reason, retriable: false, server: name },
      );
    },
    close: () => pool.close(),
  };
}

/**
 * Before a run opens anything: a Python reward the run would use (a `.py` reward_fn_path with
 * reward.type function, or remote with the servers off) is started once and stopped, so a missing
 * interpreter, module or function stops the start with one line instead of failing the reward
 * stage later.
 */
export async function checkPythonReward(
  r: {
    type: string;
    remote: { enabled: boolean | null };
    reward_fn_path: string | null;
    reward_fn_name?: string | null;
    reward_fn_form?: PythonRewardForm;
    python?: string | null;
    timeout_s: number;
  },
  env: NodeJS.ProcessEnv = process.env,
): Promise<void> {
  if (!r.reward_fn_path || !isPythonRewardPath(r.reward_fn_path) || r.type === 'model') return;
  if (r.type === 'remote' && isRemoteRewardEnabled(r.remote, env)) return;
  const pool = new PythonRewardPool({
    path: r.reward_fn_path,
    name: r.reward_fn_name,
    form: r.reward_fn_form,
    python: r.python,
    workers: 1,
    timeoutS: r.timeout_s,
    stderr: () => undefined,
  });
  try {
    await pool.start();
  } finally {
    await pool.close();
  }
}
