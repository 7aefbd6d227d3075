/**
 * Policy artefacts shared by the stages: the tokenizer and model config a run config implies,
 * and where policy version v lives on a filesystem (`<run_dir>/policy/v000012`: model.safetensors,
 * optimizer state and config.json, written atomically by the update stage). Rollout and advantage
 * load versions through the policy store (lib/policy-store: that directory, or the run's database
 * with a local cache).
 */
import { join, resolve } from 'node:path';
import {
  createTokenizer,
  modelConfig,
  loadCheckpoint,
  readModelDirConfigSync,
  samplingMaskIds,
  stopTokenIds,
  type ModelConfig,
  type Tokenizer,
  type Weights,
} from '../model/index.ts';
import type { VisionConfigInput } from '../model/config.ts';
import { isAdapterDir, loadAdapter } from '../model/checkpoint.ts';
import { loraConfig, type LoraConfig } from '../model/lora.ts';
import { policyKindOf } from '../model/policy-kinds.ts';
import { mergeLoraOnnx } from '../model/lora-merge.ts';
import { ConfigError, RlError, TransientError } from '../errors.ts';
import { loadModelDirTokenizer, type ModelTokenizer } from '../model/hf-model-tokenizer.ts';
import { existsSync } from 'node:fs';
import type { Config } from '../config/index.ts';
import type { Executor, PolicyStore } from '../policy-store/index.ts';
import { takeHandOff } from '../policy-store/handoff.ts';
import { resolveCriticModel } from '../config/index.ts';

export function tokenizerFor(cfg: Config): Tokenizer {
  const m = cfg.actor.model;
  // a model directory with a tokenizer.json brings its own tokenizer
  if (m.path && existsSync(join(m.path, 'tokenizer.json'))) {
    const c = modelDirConfig('actor.model.path', m.path);
    return loadModelDirTokenizer(m.path, {
      bos: c.bosTokenId,
      eos: c.eosTokenId,
      pad: c.padTokenId,
      stopIds: stopTokenIds(c),
    });
  }
  if (m.tokenizer === 'alphabet') {
    if (!m.alphabet)
      throw new ConfigError(
        'actor.model.tokenizer = alphabet needs actor.model.alphabet (or data.task, whose alphabet is used)',
      );
    return createTokenizer({ type: 'alphabet', alphabet: m.alphabet });
  }
  return createTokenizer({ type: 'byte' });
}

export type { ModelTokenizer };

/**
 * The tokenizer of a model directory: its tokenizer.json, or for an rlstream model without one the
 * byte tokenizer when the vocabulary is the byte tokenizer's (259 ids).
 */
export function modelDirTokenizer(dir: string, c: ModelConfig): ModelTokenizer {
  if (existsSync(join(dir, 'tokenizer.json')))
    return loadModelDirTokenizer(dir, {
      bos: c.bosTokenId,
      eos: c.eosTokenId,
      pad: c.padTokenId,
      stopIds: stopTokenIds(c),
    });
  const byte = createTokenizer({ type: 'byte' });
  // a fresh VLM's vocabulary is the byte tokenizer's then its three vision tokens (freshVision)
  if (
    c.vocabSize === byte.vocabSize ||
    (c.vision && c.vocabSize === byte.vocabSize + 3 && c.vision.imageTokenId === byte.vocabSize)
  )
    return byte;
  throw new ConfigError(
    `${dir} has no tokenizer.json (and its vocabulary of ${c.vocabSize} ids is not the byte tokenizer's ${byte.vocabSize}); copy the model's tokenizer files into it`,
  );
}

/**
 * The policy's model config: from actor.model.path's config.json when a model directory is given
 * (a Hugging Face directory or an rlstream checkpoint; the architecture keys of actor.model are
 * then not used), else from actor.model's keys. Checks that the tokenizer fits the model's
 * vocabulary and that prompt + response fit its positions (and a Mistral sliding window).
 */
export function policyModelConfig(cfg: Config, tok: Tokenizer): ModelConfig {
  return withSamplingMask(policyModelConfigUnmasked(cfg, tok), tok);
}

/**
 * The policy config with `suppressTokenIds`: the ids sampling must never emit (specials other than
 * the stop ids, NUL, padding rows — samplingMaskIds), masked in sampling, scoring and training alike.
 */
export function withSamplingMask(c: ModelConfig, tok: Tokenizer): ModelConfig {
  const ids = samplingMaskIds(tok, c.vocabSize, stopTokenIds(c));
  return ids.length === 0 ? c : modelConfig({ ...c, suppressTokenIds: Array.from(ids) });
}

/**
 * A fresh model's vision tower from actor.model.vision (null when not enabled) and its vocabulary:
 * the tokenizer's ids, then <|image_pad|>, <|vision_start|>, <|vision_end|> (vision.ts).
 */
export function freshVision(
  cfg: Config,
  tok: Tokenizer,
  hiddenSize: number,
): { vision?: VisionConfigInput; vocabSize: number } {
  const v = cfg.actor.model.vision;
  if (!v.enable) return { vocabSize: tok.vocabSize };
  const base = tok.vocabSize;
  return {
    vocabSize: base + 3,
    vision: {
      depth: v.depth,
      hiddenSize: v.hidden_size,
      intermediateSize: v.intermediate_size,
      numHeads: v.num_heads,
      outHiddenSize: hiddenSize,
      patchSize: v.patch_size,
      temporalPatchSize: v.temporal_patch_size,
      spatialMergeSize: v.spatial_merge_size,
      rope: v.rope,
      imageTokenId: base,
      visionStartTokenId: base + 1,
      visionEndTokenId: base + 2,
    },
  };
}

function policyModelConfigUnmasked(cfg: Config, tok: Tokenizer): ModelConfig {
  const m = cfg.actor.model;
  if (m.path) return checkedDirConfig(cfg, 'actor.model.path', m.path, tok);
  return freshModelConfig(m, tok, {
    head: 'lm',
    tieWordEmbeddings: m.tie_embeddings,
    ...freshVision(cfg, tok, m.d_model),
  });
}

/** The architecture keys of actor.model (or the resolved critic.model) a fresh model is built from. */
export type ModelKeys = Pick<
  Config['actor']['model'],
  'qkv_bias' | 'd_model' | 'ffn' | 'n_layers' | 'n_heads' | 'n_kv_heads' | 'max_seq_len' | 'rms_norm_eps' | 'rope_theta'
>;

/**
 * A fresh model's config from the architecture keys (Llama, or Qwen2 with qkv_bias) and the
 * tokenizer's special ids; `vocabSize` and `vision` as freshVision gives them (or the tokenizer's).
 */
export function freshModelConfig(
  m: ModelKeys,
  tok: Tokenizer,
  o: { head: 'lm' | 'value'; tieWordEmbeddings: boolean; vocabSize: number; vision?: VisionConfigInput },
): ModelConfig {
  return modelConfig({
    ...(o.vision ? { vision: o.vision } : {}),
    modelType: m.qkv_bias ? 'qwen2' : 'llama',
    head: o.head,
    hiddenSize: m.d_model,
    intermediateSize: m.ffn,
    numHiddenLayers: m.n_layers,
    numAttentionHeads: m.n_heads,
    numKeyValueHeads: m.n_kv_heads,
    vocabSize: o.vocabSize,
    maxPositionEmbeddings: m.max_seq_len,
    rmsNormEps: m.rms_norm_eps,
    ropeTheta: m.rope_theta,
    tieWordEmbeddings: o.tieWordEmbeddings,
    attentionBias: m.qkv_bias,
    bosTokenId: tok.bos,
    eosTokenId: tok.eos,
    padTokenId: tok.pad,
  });
}

/** A model directory's config.json (and generation_config.json); one that cannot be read is a ConfigError naming `key`. */
export function modelDirConfig(key: string, dir: string): ModelConfig {
  try {
    return readModelDirConfigSync(dir);
  } catch (e) {
    throw new ConfigError(`${key}: ${(e as Error).message}`);
  }
}

/** Refuses a model directory whose vocabulary is smaller than the run's tokenizer. */
export function checkTokenizerFits(key: string, c: ModelConfig, tok: Tokenizer): void {
  if (tok.vocabSize > c.vocabSize)
    throw new ConfigError(
      `${key}: the tokenizer has ${tok.vocabSize} ids but the model's vocab_size is ${c.vocabSize}; use the tokenizer the model was trained with`,
    );
}

/** A model directory's config, checked against the run's tokenizer and sequence lengths. */
function checkedDirConfig(cfg: Config, key: string, dir: string, tok: Tokenizer): ModelConfig {
  const c = modelDirConfig(key, dir);
  checkTokenizerFits(key, c, tok);
  const total = cfg.data.max_prompt_length + cfg.data.max_response_length;
  if (total > c.maxPositionEmbeddings)
    throw new ConfigError(
      `${key}: data.max_prompt_length + data.max_response_length = ${cfg.data.max_prompt_length} + ${cfg.data.max_response_length} = ${total} exceeds the model's max_position_embeddings ${c.maxPositionEmbeddings}; shorten them`,
    );
  if (c.slidingWindow !== null && total > c.slidingWindow)
    throw new ConfigError(
      `${key}: data.max_prompt_length + data.max_response_length = ${cfg.data.max_prompt_length} + ${cfg.data.max_response_length} = ${total} exceeds the model's sliding_window ${c.slidingWindow} (sliding-window attention is not implemented); shorten them to at most ${c.slidingWindow}`,
    );
  return c;
}

/** The directory a new critic starts from: critic.model.path, else actor.model.path (null: a fresh model). */
export function criticModelDir(cfg: Pick<Config, 'actor' | 'critic'>): string | null {
  return resolveCriticModel(cfg).path ?? cfg.actor.model.path;
}

/**
 * The critic's model config: from critic.model.path's directory (a causal-LM directory becomes a
 * value model: its trunk, a fresh score head), else from actor.model.path's (verl starts the critic
 * from the actor's model), else from the keys.
 */
export function criticModelConfig(cfg: Config, tok: Tokenizer): ModelConfig {
  const m = resolveCriticModel(cfg);
  const dir = criticModelDir(cfg);
  if (dir) {
    const c = checkedDirConfig(cfg, m.path ? 'critic.model.path' : 'actor.model.path', dir, tok);
    return c.head === 'value' ? c : modelConfig({ ...c, head: 'value', tieWordEmbeddings: false });
  }
  return freshModelConfig(m, tok, { head: 'value', tieWordEmbeddings: false, ...freshVision(cfg, tok, m.d_model) });
}

/**
 * Options of the forward passes that make experience — reference and old log-probs, values
 * (Scorer, ValueScorer): `actor.micro_batch_size_per_device_for_experience` rows per
 * `session.run` (verl's log_prob_micro_batch_size_per_gpu), on `actor.threads` threads. The
 * result does not depend on it (test/e2e/estimators.test.ts); the speed and peak memory do.
 */
export function experienceScorerOptions(cfg: Config): {
  threads: number;
  device: Config['actor']['device'];
  maxBatchSize: number;
} {
  return {
    threads: cfg.actor.threads,
    device: cfg.actor.device,
    maxBatchSize: cfg.actor.micro_batch_size_per_device_for_experience,
  };
}

/**
 * Options of the rollout's Sampler: `rollout.batch_size` rows per generation batch (null: 64), on
 * `rollout.device` (null: `actor.device`) with `actor.threads` threads.
 */
export function samplerOptions(cfg: Config): {
  threads: number;
  device: Config['actor']['device'];
  maxBatchSize: number;
} {
  return {
    threads: cfg.actor.threads,
    device: cfg.rollout.device ?? cfg.actor.device,
    maxBatchSize: cfg.rollout.batch_size ?? 64,
  };
}

export function policyDir(runDir: string, version: number): string {
  return join(runDir, 'policy', `v${String(version).padStart(6, '0')}`);
}

/** Critic version v (value model + its AdamW state), written by the update stage next to policy v. */
export function criticDir(runDir: string, version: number): string {
  return join(runDir, 'critic', `v${String(version).padStart(6, '0')}`);
}

/** A LoRA run's policy: adapters (actor.model.lora) on the frozen base model at actor.model.path. */
export interface PolicyLora {
  config: LoraConfig;
  baseDir: string;
}

/** actor.model.lora with its base model directory, or null for full fine-tuning. */
export function policyLora(cfg: Config): PolicyLora | null {
  const l = cfg.actor.model.lora;
  // an image policy's LoRA is its DiT's (lib/pipeline/image-policy.ts imageLora)
  if (!l || policyKindOf(cfg.actor.model) === 'image') return null;
  if (!cfg.actor.model.path)
    throw new ConfigError(
      'actor.model.lora needs actor.model.path: the base model directory the adapters are trained on',
    );
  return {
    config: loraConfig(
      {
        rank: l.rank,
        alpha: l.alpha,
        dropout: l.dropout,
        targetModules: l.target_modules,
        visionTargetModules: l.vision_target_modules,
      },
      'actor.model.lora',
    ),
    baseDir: cfg.actor.model.path,
  };
}

const sharedBases = new Map<string, Promise<Weights>>();

/**
 * The frozen base of a LoRA run, read once per process and shared by every stage in it (update,
 * rollout, the advantage stage's reference): the arrays are never written (the trainer keeps the
 * base frozen, merges make new arrays), so in embedded mode the base is in memory once.
 */
export function sharedBaseWeights(dir: string): Promise<Weights> {
  const key = resolve(dir);
  let p = sharedBases.get(key);
  if (!p) {
    p = loadCheckpoint(key, { optimizer: false }).then((ck) => ck.weights);
    p.catch(() => sharedBases.delete(key));
    sharedBases.set(key, p);
  }
  return p;
}

/**
 * Loads and caches one policy version's weights (reloaded only when the version changes) from the
 * policy store, or (a full policy, embedded) takes the arrays the update stage of this process
 * handed over when it wrote them, once the store records their sha256 for that version. A LoRA version (a PEFT adapter directory) is merged into the base, which is read
 * once and kept: W + s·B·A for the adapted layers (new arrays), every other tensor the base's own;
 * an adapter whose B are all zero (version 0) is the base itself, with no copy — the reference policy.
 * (Merged weights rather than the adapter path for sampling: bench/model.ts measures both.)
 */
export class PolicyCache {
  /** Versions taken from the in-process hand-off (lib/policy-store/handoff.ts) rather than read from the store. */
  fromMemory = 0;
  private version = -1;
  private weights: Weights | null = null;
  /** The weights held were taken from the hand-off (taking them again is free while it holds them). */
  private handed = false;
  private base: Weights | null = null;
  constructor(
    private readonly store: PolicyStore,
    private readonly expect: ModelConfig,
    private readonly onLoad?: (version: number) => void,
    private readonly lora: PolicyLora | null = null,
  ) {}
  /** `db`: the batch's executor (PGlite has one connection, held by the batch's transaction). */
  async get(version: number, db?: Executor): Promise<Weights> {
    if (version === this.version && this.weights) return this.weights;
    // embedded: the update stage in this process handed this version's weights over as it wrote them
    const handed = this.lora ? null : await takeHandOff(this.store, version, db);
    if (handed) {
      // taken again after release(): not a new version
      if (!(this.handed && version === this.version)) {
        this.fromMemory++;
        this.onLoad?.(version);
      }
      this.version = version;
      this.weights = handed;
      this.handed = true;
      return handed;
    }
    this.handed = false;
    // a version named by a record is written before the record is published; it is missing only
    // for an instant while a restarted update stage rewrites it (same bytes), or until a shared
    // volume shows it: retry rather than dead-letter the batch
    const dir = await this.store.get('policy', version, db);
    const where =
      this.store.kind === 'filesystem'
        ? this.store.writeDir('policy', version)
        : this.store.kind === 's3'
          ? `the S3 bucket (pipeline.policy_store = s3)`
          : `the run's database (pipeline.policy_store = postgres)`;
    if (!dir) {
      // versions are written in order: a missing one below the newest was pruned, and waiting cannot bring it back
      const newest = Math.max(-1, ...(await this.store.versions('policy', db)));
      if (newest > version) {
        throw new RlError(
          `policy version ${version} is no longer in ${where}: the update stage pruned it (it is at version ${newest}, and this batch was made for version ${version}); raise trainer.keep_policy_versions to keep more versions (a version kept in memory only, policy.version_files = checkpoints, goes once no rollout may sample with it)`,
          { code: 'ERR_POLICY_PRUNED' },
        );
      }
      throw new TransientError(
        `policy version ${version} is not in ${where} (yet); retrying${this.store.kind === 'filesystem' ? ' — in distributed mode trainer.run_dir must be a volume shared by the stages, or use pipeline.policy_store=postgres' : ''}`,
      );
    }
    if (this.lora && isAdapterDir(dir)) return this.adapted(version, dir);
    const ck = await loadCheckpoint(dir, { optimizer: false }).catch((e: unknown) => {
      if (existsSync(join(dir, 'model.safetensors'))) throw e;
      throw new TransientError(
        `policy version ${version} at ${dir} went away while loading (being rewritten); retrying`,
        { cause: e },
      );
    });
    if (
      ck.config.vocabSize !== this.expect.vocabSize ||
      ck.config.hiddenSize !== this.expect.hiddenSize ||
      ck.config.numHiddenLayers !== this.expect.numHiddenLayers
    ) {
      throw new ConfigError(
        `policy version ${version} at ${dir} does not match actor.model (vocab ${ck.config.vocabSize}/${this.expect.vocabSize}, d_model ${ck.config.hiddenSize}/${this.expect.hiddenSize}, layers ${ck.config.numHiddenLayers}/${this.expect.numHiddenLayers})`,
      );
    }
    this.version = version;
    this.weights = ck.weights;
    this.onLoad?.(version);
    return ck.weights;
  }

  /**
   * Lets go of weights taken from the in-process hand-off: the next get() takes them from it again
   * (no load), and once the update stage stops handing a version off (no rollout may sample with it
   * any more) nothing keeps its arrays alive. Weights read from the store are kept.
   */
  release(): void {
    if (this.handed) this.weights = null;
  }

  private async adapted(version: number, dir: string): Promise<Weights> {
    const l = this.lora!;
    this.base ??= await sharedBaseWeights(l.baseDir);
    this.weights = null; // the previous merge may go before the next is made
    const ad = await loadAdapter(dir, this.expect, { optimizer: false, expect: l.config }).catch((e: unknown) => {
      if (existsSync(join(dir, 'adapter_model.safetensors'))) throw e;
      throw new TransientError(
        `policy version ${version} at ${dir} went away while loading (being rewritten); retrying`,
        { cause: e },
      );
    });
    const off = [...ad.adapter].every(([k, v]) => !k.endsWith('.lora_B.weight') || v.every((x) => x === 0));
    this.weights = off ? this.base : await mergeLoraOnnx(this.expect, l.config, this.base, ad.adapter);
    this.version = version;
    this.onLoad?.(version);
    return this.weights;
  }
}
