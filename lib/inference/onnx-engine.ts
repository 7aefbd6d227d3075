/** The `onnx` generation engine: the rollout's own onnxruntime Sampler, in process. */
import type { Generation, GenerationRequest, Sampler, SamplingParamsInput } from '../model/sample.ts';
import type { EnginePolicy, GenerationEngine } from './engine-port.ts';

export class OnnxEngine implements GenerationEngine {
  readonly name = 'onnx';
  constructor(private readonly sampler: Sampler) {}
  async generate(
    policy: EnginePolicy,
    requests: readonly GenerationRequest[],
    params: SamplingParamsInput,
  ): Promise<Generation[]> {
    return this.sampler.generate(await policy.weights(), requests, params);
  }
  async close(): Promise<void> {}
}
