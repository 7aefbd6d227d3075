/**
 * onnxruntime-node helpers: session creation with our thread defaults, typed tensors in and out.
 * The Node binding copies every output into JS memory, pre-allocated ones too (they are written in
 * place and copied; see runInto); inputs created from typed arrays are not copied on the CPU EP.
 */
import { existsSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import ort from 'onnxruntime-node';
import { ConfigError, errorMessage } from '../errors.ts';
import { collectGarbage } from '../util/gc.ts';
import type { DType, TensorData } from './builder.ts';
import type { Device } from './devices.ts';

export { ort };

export interface SessionOptions {
  /** intra-op threads (default 2, or RLSTREAM_ORT_THREADS). */
  threads?: number;
  /** 'cpu' (default) or 'cuda' where the CUDA EP is installed. */
  device?: Device;
  graphOptimizationLevel?: 'disabled' | 'basic' | 'extended' | 'all';
  /**
   * Allocate every tensor with malloc/free instead of ORT's CPU arena and memory pattern (training
   * graphs, whose tensors are few and large: the arena's growth would keep ~1.7× their peak).
   */
  lowMemory?: boolean;
  /** Optional path to write the optimised model (debugging). */
  optimizedModelFilePath?: string;
}

export function defaultThreads(): number {
  const env = Number(process.env.RLSTREAM_ORT_THREADS);
  return Number.isInteger(env) && env > 0 ? env : 2;
}

export { DEVICES, type Device } from './devices.ts';

const CUDA_INSTALL =
  'on a networked machine with CUDA 12 and cuDNN 9 run `ONNXRUNTIME_NODE_INSTALL=cuda12 node node_modules/onnxruntime-node/script/install.js` (npm ci skips that download: package.json allowScripts denies onnxruntime-node its postinstall)';
const WEBGPU_NEEDS =
  "webgpu needs a GPU whose driver provides Vulkan (Linux: the driver's Vulkan ICD and the loader, Debian package libvulkan1)";

/**
 * Where onnxruntime-node's native binding and its provider libraries live, e.g.
 * node_modules/onnxruntime-node/bin/napi-v6/linux/x64 (null when the layout is not recognised).
 */
export function ortBinaryDir(): string | null {
  const bin = join(dirname(createRequire(import.meta.url).resolve('onnxruntime-node')), '..', 'bin');
  if (!existsSync(bin)) return null;
  for (const napi of readdirSync(bin)
    .filter((d) => d.startsWith('napi-v'))
    .sort()
    .reverse()) {
    const dir = join(bin, napi, process.platform, process.arch);
    if (existsSync(dir)) return dir;
  }
  return null;
}

/**
 * Why the CUDA EP cannot load here, or null when its library is installed: it ships as separate
 * shared libraries (libonnxruntime_providers_cuda.so) that `npm ci` does not download. `dir` is
 * for tests.
 */
export function cudaProviderMissing(setting = 'actor.device', dir: string | null = ortBinaryDir()): string | null {
  const lib = process.platform === 'win32' ? 'onnxruntime_providers_cuda.dll' : 'libonnxruntime_providers_cuda.so';
  if (dir && existsSync(join(dir, lib))) return null;
  return `${setting}=cuda: onnxruntime-node's CUDA execution provider is not installed (${lib} not found in ${dir ?? 'the onnxruntime-node package'}); ${CUDA_INSTALL}, or set ${setting}=cpu`;
}

/**
 * Fails fast, saying what to do, when `device` cannot run here: called before a run opens
 * anything. cuda: its provider library must be installed; cuda and webgpu: a one-node session must
 * start on the device (it fails without a usable GPU).
 */
export async function checkDevice(device: Device, setting = 'actor.device'): Promise<void> {
  if (device === 'cpu') return;
  if (device === 'cuda') {
    const missing = cudaProviderMissing(setting);
    if (missing) throw new ConfigError(missing);
  }
  const { GraphBuilder } = await import('./builder.ts');
  const b = new GraphBuilder({ name: 'device_check', float: 'float32' });
  b.output(b.neg(b.input('x', 'float32', [1])), 'y');
  try {
    await (await createSessionRaw(b.toBytes(), { device, threads: 1 })).release();
  } catch (e) {
    throw new ConfigError(
      `${setting}=${device}: ${deviceProblem(device, e) ?? errorMessage(e)}; or set ${setting}=cpu`,
    );
  }
}

/** An ORT session on `opts.device`; a device that cannot start is a ConfigError saying what it needs. */
export async function createSession(model: Uint8Array, opts: SessionOptions = {}): Promise<ort.InferenceSession> {
  try {
    return await createSessionRaw(model, opts);
  } catch (e) {
    const problem = opts.device ? deviceProblem(opts.device, e) : null;
    if (problem) throw new ConfigError(`device ${opts.device}: ${problem}`);
    throw e;
  }
}

/** What a session-creation error says about the device's execution provider failing to start, or null when it is about something else. */
function deviceProblem(device: Device, e: unknown): string | null {
  const msg = errorMessage(e);
  // ORT's message leads with a source location and may span lines; keep its reason
  const flat = msg.replace(/\s+/g, ' ').trim();
  const reason = /(Failed to .*)$/.exec(flat)?.[1] ?? flat;
  if (device === 'cuda' && /providers?_(shared|cuda)|Failed to load|CUDA/i.test(msg))
    return `onnxruntime could not start its CUDA execution provider (${reason}); ${CUDA_INSTALL}`;
  if (device === 'webgpu' && /webgpu|adapter|dawn|vulkan/i.test(msg))
    return `onnxruntime could not start its WebGPU execution provider (${reason}); ${WEBGPU_NEEDS}`;
  return null;
}

function createSessionRaw(model: Uint8Array, opts: SessionOptions): Promise<ort.InferenceSession> {
  return ort.InferenceSession.create(model, {
    intraOpNumThreads: opts.threads ?? defaultThreads(),
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: opts.graphOptimizationLevel ?? 'all',
    executionProviders: [opts.device ?? 'cpu'],
    // on a GPU EP, ORT warns at every session that shape ops stay on the CPU (by design): errors only
    ...(opts.device && opts.device !== 'cpu' ? { logSeverityLevel: 3 as const } : {}),
    ...(opts.optimizedModelFilePath ? { optimizedModelFilePath: opts.optimizedModelFilePath } : {}),
    // no CPU arena (its power-of-two growth keeps freed blocks: +70 % peak RSS on a training step)
    // and no memory pattern (one block sized for the whole first run): big tensors go straight to
    // malloc/free, so what is freed goes back to the system
    ...(opts.lowMemory ? { enableCpuMemArena: false, enableMemPattern: false } : {}),
    // RLSTREAM_ORT_PROFILE=<prefix>: ORT's per-node profile (chrome trace JSON, written when the session is released)
    ...(process.env.RLSTREAM_ORT_PROFILE
      ? { enableProfiling: true, profileFilePrefix: process.env.RLSTREAM_ORT_PROFILE }
      : {}),
  });
}

/** Pre-allocated outputs of at least this many bytes in one run have their returned copies collected at once (runInto). */
export const COLLECT_COPIES_BYTES = 256 * 2 ** 20;

/**
 * Runs `sess` writing the outputs in `into` into their tensors' buffers (pre-allocated outputs) and
 * returns the outputs named in `others`. onnxruntime-node 1.30 also returns a fresh JS copy of every
 * pre-allocated output (measured: a new buffer per run), which lives until V8 next collects; for a
 * training step's gradients (a copy of the model per micro-batch) that is gigabytes of garbage,
 * so above COLLECT_COPIES_BYTES the copies are dropped here and collected at once.
 */
export async function runInto(
  sess: ort.InferenceSession,
  feeds: Record<string, ort.Tensor>,
  into: Record<string, ort.Tensor>,
  others: readonly string[],
  collectAbove = COLLECT_COPIES_BYTES,
): Promise<Record<string, ort.Tensor>> {
  const fetches: Record<string, ort.Tensor | null> = { ...into };
  for (const n of others) fetches[n] = null;
  const out = await sess
    .run(feeds, fetches as ort.InferenceSession.FetchesType)
    .then((r) => Object.fromEntries(others.map((n) => [n, r[n]])));
  const bytes = Object.values(into).reduce((a, t) => a + (t.data as ArrayBufferView).byteLength, 0);
  if (bytes >= collectAbove) collectGarbage();
  return out;
}

/** An ORT tensor from a typed array (int64 accepts Int32Array/number[] and converts). */
export function tensor(dtype: DType, data: TensorData | number[], dims: readonly number[]): ort.Tensor {
  const n = dims.reduce((a, b) => a * b, 1);
  let arr: TensorData;
  if (dtype === 'int64' && !(data instanceof BigInt64Array)) {
    arr = BigInt64Array.from(Array.from(data as ArrayLike<number>, (v) => BigInt(v)));
  } else if (Array.isArray(data)) {
    arr =
      dtype === 'float64'
        ? Float64Array.from(data)
        : dtype === 'int32'
          ? Int32Array.from(data)
          : dtype === 'bool' || dtype === 'uint8'
            ? Uint8Array.from(data)
            : Float32Array.from(data);
  } else arr = data;
  if (arr.length !== n) throw new Error(`tensor: ${arr.length} values for dims [${dims}] (${n} expected)`);
  return new ort.Tensor(dtype === 'bool' ? 'bool' : dtype, arr as any, dims as number[]);
}

export function scalar(dtype: DType, v: number): ort.Tensor {
  return tensor(dtype, [v], []);
}
