/**
 * Sealing a policy version kept in memory only, off the main thread: a worker thread computes the
 * sha256 of the model.safetensors bytes the version would be written as (checkpointWeightsSha256)
 * and, for bf16 versions, the weights rounded to bf16 as a reader of that file gets them
 * (roundedToBf16), in one pass over the weights. The weights are copied once into shared memory
 * (`sharedWeights`, the copy the version keeps) so the worker reads them without another copy,
 * and the main thread (the rollout's sampling loop, the other stages) runs meanwhile. One
 * long-lived worker thread seals every version of the process, one after another.
 * Weights written in shards (over 4 GB) or in another dtype are sealed on the calling thread.
 */
import { Worker } from 'node:worker_threads';
import { RlError, errorMessage } from '../errors.ts';
import { checkpointWeightsSha256, weightsFileLayout, type SaveOptions } from './checkpoint.ts';
import type { ModelConfig } from './config.ts';
import { cloneWeights, type Weights } from './params.ts';
import { roundedToBf16 } from './safetensors.ts';

/** `w` copied into one SharedArrayBuffer (a view per parameter, same names and order). */
export function sharedWeights(w: ReadonlyMap<string, Float32Array>): Weights {
  let n = 0;
  for (const a of w.values()) n += a.length;
  const buf = new SharedArrayBuffer(n * 4);
  const out: Weights = new Map();
  let at = 0;
  for (const [k, a] of w) {
    const v = new Float32Array(buf, at * 4, a.length);
    v.set(a);
    out.set(k, v);
    at += a.length;
  }
  return out;
}

/** A sealed version: the sha256 of its weights file, and its weights as a reader of that file gets them. */
export interface Sealed {
  sha256: string;
  /** The weights as stored (f32, or their bf16 rounding widened to f32), in ordinary (not shared) memory. */
  stored: Weights;
}

/** What the worker is given: the file's first bytes, then each parameter's values in shared memory. */
interface SealJob {
  header: Uint8Array[];
  tensors: { buffer: SharedArrayBuffer; byteOffset: number; length: number }[];
  /** bf16: hash the values' bf16 bits; the stored weights are their rounding. */
  bf16: boolean;
  /** Bytes of the shared buffer: the worker returns the stored weights in a buffer of this size (same offsets). */
  byteLength: number;
}

/**
 * The worker's source (CommonJS, evaluated): for each job, hashes the header, then each tensor's
 * bytes; for bf16 converts in chunks (round to nearest, ties to even; NaN stays a quiet NaN:
 * safetensors.ts bf16Bits). It returns the stored weights in an ordinary buffer it transfers (no
 * copy on this thread): the readers feed them to onnxruntime, which takes no SharedArrayBuffer.
 */
const WORKER = `
const { parentPort } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const CHUNK = 1 << 20;
const bits = new Uint16Array(CHUNK);
const bytes = new Uint8Array(bits.buffer);
function seal({ header, tensors, bf16, byteLength }) {
  const h = createHash('sha256');
  for (const b of header) h.update(b);
  const out = new ArrayBuffer(byteLength);
  for (const t of tensors) {
    if (!bf16) {
      const v = new Uint8Array(t.buffer, t.byteOffset, t.length * 4);
      // Hash.update takes at most 2^31 - 1 bytes a call
      for (let i = 0; i < v.length; i += 1 << 30) h.update(v.subarray(i, Math.min(i + (1 << 30), v.length)));
      new Uint8Array(out, t.byteOffset, t.length * 4).set(v);
      continue;
    }
    const u = new Uint32Array(t.buffer, t.byteOffset, t.length);
    const r = new Uint32Array(out, t.byteOffset, t.length);
    for (let i = 0; i < t.length; i += CHUNK) {
      const n = Math.min(CHUNK, t.length - i);
      for (let j = 0; j < n; j++) {
        const x = u[i + j];
        const b = (x & 0x7fffffff) > 0x7f800000 ? (x >>> 16) | 0x40 : ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
        bits[j] = b;
        r[i + j] = b << 16;
      }
      h.update(bytes.subarray(0, n * 2));
    }
  }
  return { sha256: h.digest('hex'), stored: out };
}
parentPort.on('message', ({ id, job }) => {
  let r;
  try {
    r = seal(job);
  } catch (e) {
    parentPort.postMessage({ id, error: String((e && e.message) || e) });
    return;
  }
  parentPort.postMessage({ id, sha256: r.sha256, stored: r.stored }, [r.stored]);
});
`;

interface SealReply {
  id: number;
  sha256?: string;
  stored?: ArrayBuffer;
  error?: string;
}

/**
 * The process's one seal worker, started on the first seal and kept for the next ones (a worker
 * thread takes tens of ms to start). It does not keep the process alive while no seal is pending;
 * if it fails or exits, the seals in flight fail (retriable) and the next seal starts a new one.
 */
class SealWorker {
  private static current: SealWorker | null = null;
  private static started = 0;
  private readonly worker: Worker;
  private readonly pending = new Map<
    number,
    { resolve: (r: { sha256: string; stored: ArrayBuffer }) => void; reject: (e: Error) => void }
  >();
  private next = 0;

  static get(): SealWorker {
    if (!SealWorker.current) SealWorker.current = new SealWorker();
    return SealWorker.current;
  }

  /** How many seal workers this process has started (one, unless one failed). */
  static count(): number {
    return SealWorker.started;
  }

  private constructor() {
    SealWorker.started++;
    this.worker = new Worker(WORKER, { eval: true });
    this.worker.unref();
    this.worker.on('message', (m: SealReply) => {
      const p = this.pending.get(m.id);
      if (!p) return;
      this.pending.delete(m.id);
      if (this.pending.size === 0) this.worker.unref();
      if (m.error !== undefined || !m.stored || !m.sha256)
        p.reject(new RlError(`sealing a policy version failed in its worker: ${m.error}`, { retriable: true }));
      else p.resolve({ sha256: m.sha256, stored: m.stored });
    });
    this.worker.on('error', (e) =>
      this.fail(new RlError(`sealing a policy version failed in its worker: ${errorMessage(e)}`, { retriable: true })),
    );
    this.worker.on('exit', (code) =>
      this.fail(new RlError(`sealing a policy version: its worker exited (code ${code})`, { retriable: true })),
    );
  }

  private fail(e: RlError): void {
    if (SealWorker.current === this) SealWorker.current = null;
    for (const p of this.pending.values()) p.reject(e);
    this.pending.clear();
  }

  seal(job: SealJob): Promise<{ sha256: string; stored: ArrayBuffer }> {
    const id = this.next++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      // a pending seal keeps the process alive (its caller awaits it)
      this.worker.ref();
      this.worker.postMessage({ id, job });
    });
  }
}

/** How many seal worker threads this process has started (tests: one serves every seal). */
export function sealWorkersStarted(): number {
  return SealWorker.count();
}

/** Whether every array of `w` lies in one SharedArrayBuffer (sharedWeights). */
function inSharedMemory(w: Weights): SharedArrayBuffer | null {
  let buf: SharedArrayBuffer | null = null;
  for (const a of w.values()) {
    if (!(a.buffer instanceof SharedArrayBuffer) || (buf && a.buffer !== buf)) return null;
    buf = a.buffer;
  }
  return buf;
}

/**
 * Seals version weights `weights` (not modified afterwards by anyone) as saveCheckpoint would write
 * them with `opts`: in a worker thread when they are in shared memory (sharedWeights) and form one
 * f32 or bf16 file, else on this thread. The sha256 equals checkpointWeightsSha256's.
 */
export async function sealWeights(
  config: ModelConfig,
  weights: Weights,
  opts: Pick<SaveOptions, 'dtype' | 'metadata' | 'maxShardBytes'> & {
    /** Called while the worker seals (after the job is posted, before its result; on this thread: before sealing). */
    whileSealing?: () => void;
  } = {},
): Promise<Sealed> {
  const layout = weightsFileLayout(config, opts);
  const shared = inSharedMemory(weights);
  if (!layout || !shared) {
    opts.whileSealing?.();
    const sha256 = checkpointWeightsSha256(config, weights, opts);
    const bf16 = (opts.dtype ?? 'float32') === 'bfloat16';
    const stored = bf16
      ? new Map([...weights].map(([k, a]) => [k, roundedToBf16(a)]))
      : shared
        ? cloneWeights(weights)
        : weights;
    return { sha256, stored };
  }
  const job: SealJob = {
    header: layout.header,
    tensors: layout.params.map((name) => {
      const a = weights.get(name);
      if (!a) throw new RlError(`sealWeights: weights lack ${name}`);
      return { buffer: shared, byteOffset: a.byteOffset, length: a.length };
    }),
    bf16: layout.dtype === 'bfloat16',
    byteLength: shared.byteLength,
  };
  const pending = SealWorker.get().seal(job);
  // the worker is hashing: a kill here is a kill mid-seal (test hook, lib/pipeline/crash-points.ts)
  opts.whileSealing?.();
  const done = await pending;
  const stored: Weights = new Map();
  for (const [k, a] of weights) stored.set(k, new Float32Array(done.stored, a.byteOffset, a.length));
  return { sha256: done.sha256, stored };
}
