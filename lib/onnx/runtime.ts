/**
 * onnxruntime-node helpers: session creation with our thread defaults, typed tensors in and out.
 * The Node binding copies every output into JS memory; inputs created from typed arrays are not
 * copied on the CPU EP.
 */
import ort from 'onnxruntime-node';
import type { DType, TensorData } from './builder.ts';

export { ort };

export interface SessionOptions {
  /** intra-op threads (default 2, or RLSTREAM_ORT_THREADS). */
  threads?: number;
  /** 'cpu' (default) or 'cuda' where the CUDA EP is installed. */
  device?: 'cpu' | 'cuda';
  graphOptimizationLevel?: 'disabled' | 'basic' | 'extended' | 'all';
  /** Optional path to write the optimised model (debugging). */
  optimizedModelFilePath?: string;
}

export function defaultThreads(): number {
  const env = Number(process.env.RLSTREAM_ORT_THREADS);
  return Number.isInteger(env) && env > 0 ? env : 2;
}

export async function createSession(model: Uint8Array, opts: SessionOptions = {}): Promise<ort.InferenceSession> {
  return ort.InferenceSession.create(model, {
    intraOpNumThreads: opts.threads ?? defaultThreads(),
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: opts.graphOptimizationLevel ?? 'all',
    executionProviders: [opts.device === 'cuda' ? 'cuda' : 'cpu'],
    ...(opts.optimizedModelFilePath ? { optimizedModelFilePath: opts.optimizedModelFilePath } : {}),
  });
}

/** An ORT tensor from a typed array (int64 accepts Int32Array/number[] and converts). */
export function tensor(dtype: DType, data: TensorData | number[], dims: readonly number[]): ort.Tensor {
  const n = dims.reduce((a, b) => a * b, 1);
  let arr: TensorData;
  if (dtype === 'int64' && !(data instanceof BigInt64Array)) {
    arr = BigInt64Array.from(Array.from(data as ArrayLike<number>, (v) => BigInt(v)));
  } else if (Array.isArray(data)) {
    arr = dtype === 'float64' ? Float64Array.from(data) : dtype === 'int32' ? Int32Array.from(data) : dtype === 'bool' || dtype === 'uint8' ? Uint8Array.from(data) : Float32Array.from(data);
  } else arr = data;
  if (arr.length !== n) throw new Error(`tensor: ${arr.length} values for dims [${dims}] (${n} expected)`);
  return new ort.Tensor(dtype === 'bool' ? 'bool' : dtype, arr as any, dims as number[]);
}

export function scalar(dtype: DType, v: number): ort.Tensor { return tensor(dtype, [v], []); }
