/**
 * The generation-engine port of the rollout stage: sample one response per request with a given
 * policy version, returning token ids, behaviour log-probs and finish reasons. Adapters:
 *   onnx    the in-process Sampler (lib/model/sample.ts) — onnx-engine.ts
 *   openai  OpenAI-compatible HTTP engines (serve-policy, vLLM, SGLang) — openai-engine.ts
 * Both pass one contract suite (test/support/engine-contract.ts).
 */
import type { Weights } from '../model/params.ts';
import type { Generation, GenerationRequest, SamplingParamsInput } from '../model/sample.ts';

/** A policy version as an engine needs it: in-process weights, or the directory a server loads. */
export interface EnginePolicy {
  version: number;
  weights(): Promise<Weights>;
  dir(): Promise<string>;
}

export interface GenerationEngine {
  readonly name: string;
  /** One generation per request, in request order; a retriable RlError when the engine is unreachable. */
  generate(
    policy: EnginePolicy,
    requests: readonly GenerationRequest[],
    params: SamplingParamsInput,
  ): Promise<Generation[]>;
  close(): Promise<void>;
}

/** rollout.engine values. */
export const ENGINE_NAMES = ['onnx', 'openai'] as const;
export type EngineName = (typeof ENGINE_NAMES)[number];
