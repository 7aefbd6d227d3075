/**
 * The policy `rlstream serve-policy` serves: a model directory (a Hugging Face directory, an
 * rlstream checkpoint or policy version) or a run directory (`<run_dir>/config.yaml` +
 * `<run_dir>/policy/vNNNNNN`). A run directory gives the run's own model config (with the same
 * sampling mask as the rollout stage), so the server samples exactly what the rollout would.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { loadConfig } from '../config/index.ts';
import { ConfigError } from '../errors.ts';
import { ChatTemplate } from '../model/chat-template.ts';
import { isAdapterDir, MODEL_FILE, MODEL_INDEX_FILE, readModelDirConfig } from '../model/checkpoint.ts';
import { stopTokenIds, type ModelConfig } from '../model/config.ts';
import type { Tokenizer } from '../model/tokenizer.ts';
import type { PolicyRef } from './policy-weights.ts';
import { modelDirTokenizer, policyDir, policyModelConfig, tokenizerFor, withSamplingMask } from '../pipeline/policy.ts';

export interface ServedPolicy {
  /** The name clients give as `model`. */
  name: string;
  config: ModelConfig;
  tokenizer: Tokenizer;
  chatTemplate: ChatTemplate | null;
  /** Ids that end a response. */
  stopIds: number[];
  /** The run directory being followed, or null for a model directory. */
  runDir: string | null;
}

/** True when `dir` is a run directory (a resolved config.yaml and a policy/ folder). */
export function isRunDir(dir: string): boolean {
  return existsSync(join(dir, 'config.yaml')) && existsSync(join(dir, 'policy'));
}

/** The complete policy versions of a run directory, ascending (a version is renamed into place whole). */
export function runPolicyVersions(runDir: string): number[] {
  const root = join(runDir, 'policy');
  if (!existsSync(root)) return [];
  return readdirSync(root)
    .map((n) => /^v(\d{6,})$/.exec(n))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => Number(m[1]))
    .filter((v) => {
      const d = policyDir(runDir, v);
      return existsSync(join(d, MODEL_FILE)) || existsSync(join(d, MODEL_INDEX_FILE));
    })
    .sort((a, b) => a - b);
}

export async function openServedPolicy(
  path: string,
  opts: { name?: string; chatTemplateFile?: string } = {},
): Promise<{ policy: ServedPolicy; initial: PolicyRef }> {
  const dir = resolve(path);
  if (!existsSync(dir)) throw new ConfigError(`${path} does not exist; give a model directory or a run directory`);
  let config: ModelConfig, tokenizer: Tokenizer, runDir: string | null, initial: PolicyRef;
  if (isRunDir(dir)) {
    const cfg = loadConfig({ file: join(dir, 'config.yaml') });
    if (cfg.actor.model.lora)
      throw new ConfigError(
        `${path} is a LoRA run; serve-policy serves full weights: export a merged version (rlstream export --merge) and serve that directory`,
      );
    tokenizer = tokenizerFor(cfg);
    config = policyModelConfig(cfg, tokenizer);
    runDir = dir;
    const versions = runPolicyVersions(dir);
    if (!versions.length)
      throw new ConfigError(`${path} has no policy version yet (policy/v000000 is written when the run starts)`);
    const newest = versions[versions.length - 1];
    initial = { version: newest, dir: policyDir(dir, newest) };
  } else {
    if (isAdapterDir(dir))
      throw new ConfigError(`${path} is a LoRA adapter; merge it first (rlstream export ${path} --merge --out DIR)`);
    const own = (await readModelDirConfig(dir)).config;
    if (own.head !== 'lm') throw new ConfigError(`${path} is a value model; serve-policy needs a causal LM`);
    tokenizer = modelDirTokenizer(dir, own);
    config = withSamplingMask(own, tokenizer);
    runDir = null;
    const m = /^v(\d{6,})$/.exec(basename(dir));
    initial = { version: m ? Number(m[1]) : 0, dir };
  }
  let chatTemplate = tokenizer.chatTemplate;
  if (opts.chatTemplateFile) {
    if (!existsSync(opts.chatTemplateFile))
      throw new ConfigError(`--chat-template ${opts.chatTemplateFile} does not exist`);
    chatTemplate = new ChatTemplate(readFileSync(opts.chatTemplateFile, 'utf8'), {}, opts.chatTemplateFile);
  }
  const stopIds = [...new Set([...stopTokenIds(config), ...tokenizer.stopIds])].filter((id) => id < config.vocabSize);
  return {
    policy: { name: opts.name ?? basename(dir), config, tokenizer, chatTemplate, stopIds, runDir },
    initial,
  };
}
