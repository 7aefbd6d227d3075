/**
 * The generation engine a run config names (`rollout.engine`), and the policy version handle the
 * rollout stage gives it: in-process weights for onnx, the version's directory for a server.
 */
import type { Config } from '../config/index.ts';
import { TransientError } from '../errors.ts';
import type { Weights } from '../model/params.ts';
import type { Sampler } from '../model/sample.ts';
import type { Executor, PolicyStore } from '../policy-store/index.ts';
import { Registry } from '../util/registry.ts';
import type { EnginePolicy, EngineName, GenerationEngine } from './engine-port.ts';
import { OnnxEngine } from './onnx-engine.ts';
import { OpenAIEngine } from './openai-engine.ts';

type Factory = (cfg: Config, sampler: Sampler, env: NodeJS.ProcessEnv) => GenerationEngine;

const factories: Record<EngineName, Factory> = {
  onnx: (_cfg, sampler) => new OnnxEngine(sampler),
  openai: (cfg, _sampler, env) => {
    const o = cfg.rollout.openai;
    return new OpenAIEngine({
      urls: o.urls,
      model: o.model,
      timeoutMs: o.timeout_ms,
      maxRetries: o.max_retries,
      concurrencyPerServer: o.concurrency_per_server,
      cooldownMs: o.cooldown_ms,
      reload: o.reload,
      apiKey: o.api_key_env ? (env[o.api_key_env] ?? null) : null,
    });
  },
};

export const engines = new Registry<Factory>('rollout.engine', factories);

export function createEngine(cfg: Config, sampler: Sampler, env: NodeJS.ProcessEnv = process.env): GenerationEngine {
  return engines.get(cfg.rollout.engine)(cfg, sampler, env);
}

/** Policy version `version` for an engine: `weights` loads it in process (onnx), `dir` is where a server loads it from. */
export function enginePolicyOf(
  version: number,
  weights: () => Promise<Weights>,
  store: PolicyStore,
  db?: Executor,
): EnginePolicy {
  return {
    version,
    weights,
    dir: async () => {
      const d = await store.get('policy', version, db);
      if (!d) throw new TransientError(`policy version ${version} is not in the policy store (yet); retrying`);
      return d;
    },
  };
}
