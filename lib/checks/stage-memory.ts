/**
 * The memory a stage needs, from its model's parameter count and what the stage holds, checked
 * against the process's cgroup memory limit at start: a stage whose limit (a pod's
 * `resources.limits.memory`) is below it is refused with how much it needs, instead of being
 * OOM-killed and restarted forever. fp32 throughout (the CPU image trains in fp32), P parameters:
 *
 *   rollout    weights 4P + KV cache 2 · L · H_kv · d_head · T · B · 4 bytes
 *              (L layers, H_kv KV heads, T = max prompt + response tokens, B = rollout.batch_size)
 *   advantage  policy 4P (+ reference 4P with a KL term) (+ critic 4P with GAE)
 *   update     weights, gradients, AdamW m and v: 16P (+ the critic's 16P with GAE)
 *   controller, reward: no model
 *
 * plus RUNTIME_BYTES for node, onnxruntime and the data. This is a floor (activations come on
 * top), so only a limit below it is refused. Embedded (`rlstream train`) holds every stage in one
 * process: the sum.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Config } from '../config/index.ts';
import { ConfigError } from '../errors.ts';

/** node, onnxruntime and the loaded data, before any model (measured RSS of a tiny run: ~250 MiB). */
export const RUNTIME_BYTES = 256 * 1024 ** 2;
/** rollout.batch_size when null (lib/config/schema.ts). */
const DEFAULT_ROLLOUT_BATCH = 64;
/** cgroup v1 reports "no limit" as a page-rounded 2^63 − 1. */
const V1_UNLIMITED = 2 ** 62;

export interface ModelShape {
  params: number;
  layers: number;
  kvHeads: number;
  headDim: number;
}

export interface StageMemoryInput {
  policy: ModelShape;
  /** The critic's parameter count (GAE), else null. */
  criticParams: number | null;
  /** Whether the advantage stage holds a reference policy (a KL loss or KL in reward). */
  reference: boolean;
  /** Tokens of one sequence: max prompt + max response. */
  seqTokens: number;
  /** Sequences per rollout forward batch. */
  rolloutBatch: number;
}

export interface StageNeed {
  stage: string;
  bytes: number;
  /** What the bytes are, e.g. "weights 1.2 GiB + KV cache 0.3 GiB + runtime 256 MiB". */
  parts: Array<[string, number]>;
}

/** Bytes a stage needs at least (see the module comment); `stage` 'embedded' sums all five. */
export function stageMemoryNeed(stage: string, m: StageMemoryInput): StageNeed {
  const P = m.policy.params;
  const kv = 2 * m.policy.layers * m.policy.kvHeads * m.policy.headDim * m.seqTokens * m.rolloutBatch * 4;
  const partsOf = (s: string): Array<[string, number]> => {
    switch (s) {
      case 'rollout':
        return [
          ['policy weights', 4 * P],
          ['KV cache', kv],
        ];
      case 'advantage':
        return [
          ['policy weights', 4 * P],
          ...(m.reference ? [['reference weights', 4 * P] as [string, number]] : []),
          ...(m.criticParams !== null ? [['critic weights', 4 * m.criticParams] as [string, number]] : []),
        ];
      case 'update':
        return [
          ['weights, gradients and AdamW state', 16 * P],
          ...(m.criticParams !== null
            ? [['critic weights, gradients and AdamW state', 16 * m.criticParams] as [string, number]]
            : []),
        ];
      default:
        return [];
    }
  };
  const parts =
    stage === 'embedded'
      ? ['rollout', 'advantage', 'update'].flatMap((s) =>
          partsOf(s).map(([k, v]) => [`${s} ${k}`, v] as [string, number]),
        )
      : partsOf(stage);
  parts.push(['runtime', RUNTIME_BYTES]);
  return { stage, bytes: parts.reduce((s, [, v]) => s + v, 0), parts };
}

/**
 * This process's memory limit from its cgroup: v2 `memory.max`, else v1
 * `memory/memory.limit_in_bytes` (or `memory.limit_in_bytes` at the root given); null when
 * unlimited or unreadable. `root` is /sys/fs/cgroup unless a test gives another.
 */
export function cgroupMemoryLimit(root = '/sys/fs/cgroup'): number | null {
  for (const f of ['memory.max', join('memory', 'memory.limit_in_bytes'), 'memory.limit_in_bytes']) {
    let v: string;
    try {
      v = readFileSync(join(root, f), 'utf8').trim();
    } catch {
      continue;
    }
    if (v === 'max') return null;
    const n = Number(v);
    return Number.isFinite(n) && n > 0 && n < V1_UNLIMITED ? n : null;
  }
  return null;
}

const GiB = 1024 ** 3;
export function formatBytes(b: number): string {
  return b >= GiB ? `${(b / GiB).toFixed(2)} GiB` : `${(b / 1024 ** 2).toFixed(0)} MiB`;
}

/** The refusal line for a stage under `limit`, or null when it fits (or there is no limit). */
export function memoryRefusal(need: StageNeed, limit: number | null, params: number): string | null {
  if (limit === null || limit >= need.bytes) return null;
  const what = need.stage === 'embedded' ? 'this process (all five stages, rlstream train)' : `the ${need.stage} stage`;
  return `${what} needs at least ${formatBytes(need.bytes)} for a ${(params / 1e6).toFixed(2)} M-parameter policy (${need.parts
    .map(([k, v]) => `${k} ${formatBytes(v)}`)
    .join(
      ' + ',
    )}), but its memory limit (cgroup) is ${formatBytes(limit)}: raise the limit (the pod's resources.limits.memory) to at least ${formatBytes(Math.ceil(need.bytes / GiB) * GiB)}, or use a smaller model or rollout.batch_size`;
}

/** The sizing input of a config: its policy's (and critic's) parameter counts and shapes. */
export async function stageMemoryInput(cfg: Config): Promise<StageMemoryInput> {
  const { tokenizerFor, policyModelConfig, criticModelConfig } = await import('../pipeline/policy.ts');
  const { paramCount } = await import('../model/params.ts');
  const tok = tokenizerFor(cfg);
  const c = policyModelConfig(cfg, tok);
  return {
    policy: { params: paramCount(c), layers: c.numHiddenLayers, kvHeads: c.numKeyValueHeads, headDim: c.headDim },
    criticParams: cfg.critic.enable ? paramCount(criticModelConfig(cfg, tok)) : null,
    reference: cfg.algorithm.use_kl_loss || cfg.algorithm.use_kl_in_reward,
    seqTokens: cfg.data.max_prompt_length + cfg.data.max_response_length,
    rolloutBatch: cfg.rollout.batch_size ?? DEFAULT_ROLLOUT_BATCH,
  };
}

/**
 * Refuses a start (ConfigError, not retriable) when the stage's — or, embedded, the process's —
 * cgroup memory limit is below what its model needs. Stages without a model pass without reading
 * the model.
 */
export async function checkStageMemory(
  cfg: Config,
  stage: 'embedded' | string,
  opts: { cgroupRoot?: string } = {},
): Promise<void> {
  if (stage !== 'embedded' && !['rollout', 'advantage', 'update'].includes(stage)) return;
  const limit = cgroupMemoryLimit(opts.cgroupRoot);
  if (limit === null) return;
  const input = await stageMemoryInput(cfg);
  const line = memoryRefusal(stageMemoryNeed(stage, input), limit, input.policy.params);
  if (line) throw new ConfigError(line, { limit, stage });
}
