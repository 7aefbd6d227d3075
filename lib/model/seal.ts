/**
 * Sealing a policy version kept in memory only, off the main thread: a worker thread computes the
 * sha256 of the model.safetensors bytes the version would be written as (checkpointWeightsSha256)
 * and, for bf16 versions, the weights rounded to bf16 as a reader of that file gets them
 * (roundedToBf16), in one pass over the weights. The weights are copied once into one buffer
 * (`packedWeights`, the copy the version keeps), which is moved to the worker (transferred, not
 * copied), sealed there in place and moved back, while the main thread (the rollout's sampling
 * loop, the other stages) runs. So a version costs one copy of the weights, during sealing too.
 * One long-lived worker thread seals every version of the process, one after another.
 * Weights written in shards (over 4 GB) or in another dtype are sealed on the calling thread.
 */
import { Worker } from 'node:worker_threads';
import { RlError, errorMessage } from '../errors.ts';
import { checkpointWeightsSha256, weightsFileLayout, type SaveOptions } from './checkpoint.ts';
import type { ModelConfig } from './config.ts';
import { cloneWeights, type Weights } from './params.ts';
import { roundedToBf16 } from './safetensors.ts';

/** Buffers made by packedWeights: only these are moved to the worker. */
const PACKED = new WeakSet<ArrayBuffer>();

/**
 * `w` copied into one ArrayBuffer (a view per parameter, same names and order): weights sealWeights
 * seals in its worker. They are then the sealed version's own (sealWeights takes them over).
 */
export function packedWeights(w: ReadonlyMap<string, Float32Array>): Weights {
  let n = 0;
  for (const a of w.values()) n += a.length;
  const buf = new ArrayBuffer(n * 4);
  PACKED.add(buf);
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

/** What the worker is given: the file's first bytes, then each parameter's values in `buffer` (transferred). */
interface SealJob {
  header: Uint8Array[];
  buffer: ArrayBuffer;
  tensors: { byteOffset: number; length: number }[];
  /** bf16: hash the values' bf16 bits; the stored weights are their rounding, written in place. */
  bf16: boolean;
}

/**
 * The worker's source (CommonJS, evaluated): for each job, hashes the header, then each tensor's
 * bytes; for bf16 converts in chunks (round to nearest, ties to even; NaN stays a quiet NaN:
 * safetensors.ts bf16Bits), writing each value's rounding over it. It transfers the buffer back
 * (no copy on either thread).
 */
const WORKER = `
const { parentPort } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const CHUNK = 1 << 20;
const bits = new Uint16Array(CHUNK);
const bytes = new Uint8Array(bits.buffer);
function seal({ header, buffer, tensors, bf16 }) {
  const h = createHash('sha256');
  for (const b of header) h.update(b);
  for (const t of tensors) {
    if (!bf16) {
      const v = new Uint8Array(buffer, t.byteOffset, t.length * 4);
      // Hash.update takes at most 2^31 - 1 bytes a call
      for (let i = 0; i < v.length; i += 1 << 30) h.update(v.subarray(i, Math.min(i + (1 << 30), v.length)));
      continue;
    }
    const u = new Uint32Array(buffer, t.byteOffset, t.length);
    for (let i = 0; i < t.length; i += CHUNK) {
      const n = Math.min(CHUNK, t.length - i);
      for (let j = 0; j < n; j++) {
        const x = u[i + j];
        const b = (x & 0x7fffffff) > 0x7f800000 ? (x >>> 16) | 0x40 : ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
        bits[j] = b;
        u[i + j] = b << 16;
      }
      h.update(bytes.subarray(0, n * 2));
    }
  }
  return { sha256: h.digest('hex'), stored: buffer };
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
      // the buffer moves to the worker (the caller's views of it are detached until it comes back)
      this.worker.postMessage({ id, job }, [job.buffer]);
    });
  }
}

/** How many seal worker threads this process has started (tests: one serves every seal). */
export function sealWorkersStarted(): number {
  return SealWorker.count();
}

/** The buffer packedWeights made that every array of `w` lies in; else null (other arrays are never moved). */
function packedBuffer(w: Weights): ArrayBuffer | null {
  let buf: ArrayBuffer | null = null;
  for (const a of w.values()) {
    if (!(a.buffer instanceof ArrayBuffer) || (buf && a.buffer !== buf)) return null;
    buf = a.buffer;
  }
  return buf && PACKED.has(buf) ? buf : null;
}

/**
 * Seals version weights `weights` (not modified afterwards by anyone) as saveCheckpoint would write
 * them with `opts`: in a worker thread when they lie in one buffer (packedWeights) and form one
 * f32 or bf16 file, else on this thread. The sha256 equals checkpointWeightsSha256's. Sealed in the
 * worker, `weights` are taken over: their buffer becomes the stored weights' (bf16: rounded in
 * place), and the arrays given are detached (empty) from the moment the job is posted.
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
  const buffer = packedBuffer(weights);
  if (!layout || !buffer) {
    opts.whileSealing?.();
    const sha256 = checkpointWeightsSha256(config, weights, opts);
    const bf16 = (opts.dtype ?? 'float32') === 'bfloat16';
    const stored = bf16
      ? new Map([...weights].map(([k, a]) => [k, roundedToBf16(a)]))
      : [...weights.values()].some((a) => a.buffer instanceof SharedArrayBuffer)
        ? cloneWeights(weights)
        : weights;
    return { sha256, stored };
  }
  // where each array lies in the buffer (read before the transfer detaches them)
  const at = new Map([...weights].map(([k, a]) => [k, { byteOffset: a.byteOffset, length: a.length }]));
  const job: SealJob = {
    header: layout.header,
    buffer,
    tensors: layout.params.map((name) => {
      const a = at.get(name);
      if (!a) throw new RlError(`sealWeights: weights lack ${name}`);
      return a;
    }),
    bf16: layout.dtype === 'bfloat16',
  };
  const pending = SealWorker.get().seal(job);
  // the worker is hashing: a kill here is a kill mid-seal (test hook, lib/pipeline/crash-points.ts)
  opts.whileSealing?.();
  const done = await pending;
  const stored: Weights = new Map();
  for (const [k, a] of at) stored.set(k, new Float32Array(done.stored, a.byteOffset, a.length));
  return { sha256: done.sha256, stored };
}
