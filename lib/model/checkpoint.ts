/**
 * Model directories in Hugging Face layout, read and written.
 *
 * Read (`loadCheckpoint`): `config.json` (model_type llama / mistral / qwen2 / qwen3, see
 * config.ts), optional `generation_config.json` (its eos ids stop generation too), weights in
 * `model.safetensors` or sharded with `model.safetensors.index.json` (weight_map: tensor → shard
 * file), stored F32 / BF16 / F16 / F64 and converted to f32. A tied model's `lm_head.weight` (some
 * exporters keep it) and `rotary_emb.inv_freq` buffers are ignored; anything else that does not fit
 * config.json is an error naming the tensor, its expected and found shape, or the missing shard.
 * Everything is validated before anything is returned: nothing half-loads.
 *
 * Written (`saveCheckpoint`): a directory transformers loads — `model.safetensors` (HF parameter
 * names, tied head omitted as save_pretrained does, F32 unless `dtype`, metadata `format: pt`),
 * `config.json` (the source model's keys kept, the stored dtype stated), `generation_config.json`
 * and the source's tokenizer files (copied from `assetsFrom`), and optionally
 * `optimizer.safetensors` (AdamW moments as `<name>.exp_avg` / `<name>.exp_avg_sq`, the step in
 * metadata; when the weights are stored below f32, the f32 master weights as `<name>.master`, which
 * a load with the optimizer state returns as the weights). The directory is written under a
 * temporary name, every file fsynced, then renamed into place, so a half-written checkpoint never
 * looks valid. Loading validates names, shapes and dtypes and names the tensor at fault.
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, promises as fs, readFileSync } from 'node:fs';
import path from 'node:path';
import { ConfigError, withStoragePath } from '../errors.ts';
import { sha256Hex, updateHash } from '../util/hash.ts';
import { PREPROCESSOR_FILE, preprocessorJson, readImageProcessor } from './processor.ts';
import {
  fromHfConfig,
  isQwenVl,
  modelConfig,
  stopTokenIds,
  toHfConfig,
  type HfDtype,
  type ModelConfig,
} from './config.ts';
import { initWeights } from './init.ts';
import { fromHfName, hfName, weightsLayoutOf } from './hf-layout.ts';
import {
  ADAPTER_CONFIG_FILE,
  ADAPTER_MODEL_FILE,
  LORA_MODULES,
  PEFT_PREFIX,
  VISION_LORA_MODULES,
  loraFromPeftConfig,
  towerLoraModules,
  loraSpecs,
  peftAdapterConfig,
  validateAdapter,
  type LoraConfig,
} from './lora.ts';
import { numel, paramSpecs, type ParamSpec, type Weights } from './params.ts';
import {
  decodeSafetensors,
  encodeSafetensors,
  fromFloat32,
  safetensorsHeader,
  safetensorsParts,
  toFloat32,
  type StTensor,
} from './safetensors.ts';
import type { OptimizerState } from './train.ts';

export const MODEL_FILE = 'model.safetensors';
export const MODEL_INDEX_FILE = 'model.safetensors.index.json';
export const OPTIMIZER_FILE = 'optimizer.safetensors';
export const CONFIG_FILE = 'config.json';
export const GENERATION_CONFIG_FILE = 'generation_config.json';
/** Tokenizer files of a Hugging Face model directory, copied along with the weights. */
export const TOKENIZER_FILES = [
  'tokenizer.json',
  'tokenizer_config.json',
  'special_tokens_map.json',
  'added_tokens.json',
  'chat_template.jinja',
  'chat_template.json',
  'vocab.json',
  'merges.txt',
  'tokenizer.model',
  'preprocessor_config.json',
];
/** Every file of a model directory besides the weights and optimizer state. */
export const MODEL_SIDE_FILES = [CONFIG_FILE, GENERATION_CONFIG_FILE, ...TOKENIZER_FILES];

export interface Checkpoint {
  config: ModelConfig;
  weights: Weights;
  optimizer?: OptimizerState;
  /** sha256 (hex) of model.safetensors. */
  weightsSha256: string;
  /** Extra string metadata stored in model.safetensors. */
  metadata: Record<string, string>;
  /** generation_config.json, when the directory has one. */
  generation: Record<string, unknown> | null;
}

export interface SaveOptions {
  optimizer?: OptimizerState;
  metadata?: Record<string, string>;
  /** Replace an existing checkpoint directory (default false: error). */
  overwrite?: boolean;
  /** Stored dtype of model.safetensors (default float32; the optimizer state is always f32). */
  dtype?: HfDtype;
  /** A model directory whose generation_config.json and tokenizer files are copied (the source model). */
  assetsFrom?: string | null;
  /** Shard the weights above this many bytes (default MAX_SHARD_BYTES). */
  maxShardBytes?: number;
  /** Called once every file is in the temporary directory, before it is renamed into place (a test's crash point). */
  beforeRename?: () => void;
}

/**
 * A file's contents for writeDirAtomic: bytes, text, or bytes given as consecutive parts (a
 * safetensors file as safetensorsParts makes it: views of the weights, written one after the
 * other without first joining them into one buffer, which would copy them all).
 */
export type FileData = Uint8Array | string | readonly Uint8Array[];

async function writeSynced(file: string, data: FileData): Promise<void> {
  try {
    const fh = await fs.open(file, 'w');
    try {
      if (typeof data === 'string' || data instanceof Uint8Array) await fh.writeFile(data);
      else {
        let at = 0;
        for (const part of data)
          // a write call takes at most 2^31 − 1 bytes: 1 GiB at a time
          for (let o = 0; o < part.byteLength;) {
            const { bytesWritten } = await fh.write(part, o, Math.min(part.byteLength - o, 1 << 30), at);
            o += bytesWritten;
            at += bytesWritten;
          }
      }
      await fh.sync();
    } finally {
      await fh.close();
    }
  } catch (e) {
    throw withStoragePath(e, file);
  } // a write's ENOSPC does not name its file
}

async function syncDir(dir: string): Promise<void> {
  const fh = await fs.open(dir, 'r');
  try {
    await fh.sync();
  } catch {
    /* some filesystems do not support directory fsync */
  } finally {
    await fh.close();
  }
}

export function sha256(data: Uint8Array): string {
  return sha256Hex(data);
}

/** generation_config.json and the tokenizer files of `assetsFrom` (a generation config from `config` when it has none). */
async function sideFiles(config: ModelConfig, assetsFrom: string | null): Promise<Map<string, Buffer>> {
  const side = new Map<string, Buffer>();
  if (assetsFrom) {
    for (const f of [GENERATION_CONFIG_FILE, ...TOKENIZER_FILES]) {
      try {
        side.set(f, await fs.readFile(path.join(assetsFrom, f)));
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
      }
    }
  }
  // a Qwen-VL directory without a source processor config gets transformers' defaults
  if (isQwenVl(config) && !side.has(PREPROCESSOR_FILE))
    side.set(PREPROCESSOR_FILE, Buffer.from(JSON.stringify(preprocessorJson(config), null, 2) + '\n'));
  if (!side.has(GENERATION_CONFIG_FILE)) {
    const eos = stopTokenIds(config);
    side.set(
      GENERATION_CONFIG_FILE,
      Buffer.from(
        JSON.stringify(
          {
            bos_token_id: config.bosTokenId,
            eos_token_id: eos.length === 1 ? eos[0] : eos,
            pad_token_id: config.padTokenId,
          },
          null,
          2,
        ) + '\n',
      ),
    );
  }
  return side;
}

/**
 * optimizer.safetensors: AdamW moments `<name>.exp_avg` / `.exp_avg_sq` for `specs`, the step in
 * metadata; with `masters` (weights stored below f32), the f32 master weights as `<name>.master`.
 */
/** optimizer.safetensors as its parts (safetensorsParts: views of the moments, no copy). */
function optimizerFile(specs: ParamSpec[], o: OptimizerState, masters: Weights | null = null): Buffer[] {
  const entries: [string, { shape: number[]; data: Float32Array }][] = [];
  for (const s of specs) {
    const m = o.expAvg.get(s.name),
      v = o.expAvgSq.get(s.name);
    if (!m || !v) throw new ConfigError(`saveCheckpoint: optimizer state lacks moments for ${s.name}`);
    entries.push(
      [`${s.name}.exp_avg`, { shape: s.shape, data: m }],
      [`${s.name}.exp_avg_sq`, { shape: s.shape, data: v }],
    );
    if (masters) entries.push([`${s.name}.master`, { shape: s.shape, data: masters.get(s.name)! }]);
  }
  return safetensorsParts(entries, { step: String(o.step), optimizer: 'adamw' });
}

/** A file of a written directory: its name, the sha256 of the bytes written and their size. */
export interface WrittenFile {
  name: string;
  sha256: string;
  sizeBytes: number;
}

/**
 * Writes `files` as directory `dir`: under a temporary name, every file fsynced, then renamed into
 * place (an existing `dir` is replaced only with `overwrite`), so a half-written directory never looks valid.
 */
export async function writeDirAtomic(
  dir: string,
  files: ReadonlyMap<string, FileData>,
  overwrite: boolean,
  beforeRename?: () => void,
): Promise<WrittenFile[]> {
  const parent = path.dirname(path.resolve(dir));
  await fs.mkdir(parent, { recursive: true });
  const tmp = path.join(parent, `.${path.basename(dir)}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
  await fs.mkdir(tmp);
  try {
    for (const [f, data] of files) await writeSynced(path.join(tmp, f), data);
    await syncDir(tmp);
    beforeRename?.();
    let old: string | null = null;
    try {
      await fs.access(dir);
      if (!overwrite)
        throw new ConfigError(`saveCheckpoint: ${dir} already exists (pass overwrite: true to replace it)`);
      old = `${tmp}.old`;
      await fs.rename(dir, old);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    }
    await fs.rename(tmp, dir);
    await syncDir(parent);
    if (old) await fs.rm(old, { recursive: true, force: true });
    return [...files]
      .map(([name, data]) => {
        const parts = typeof data === 'string' ? [Buffer.from(data)] : data instanceof Uint8Array ? [data] : data;
        const h = createHash('sha256');
        for (const b of parts) updateHash(h, b);
        return { name, sha256: h.digest('hex'), sizeBytes: parts.reduce((a, b) => a + b.byteLength, 0) };
      })
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  } catch (e) {
    await fs.rm(tmp, { recursive: true, force: true }).catch(() => undefined);
    throw e;
  }
}

/**
 * The weights files of a checkpoint directory as saveCheckpoint writes them, each as its parts
 * (safetensorsParts: views of the arrays, bf16 converted), and the shard index when there are
 * several. `weights` are checked against the model's parameters.
 */
function weightFiles(
  config: ModelConfig,
  weights: Weights,
  opts: Pick<SaveOptions, 'dtype' | 'metadata' | 'maxShardBytes'>,
): { files: { name: string; parts: Buffer[] }[]; index: string | null } {
  const specs = paramSpecs(config);
  for (const s of specs) {
    const w = weights.get(s.name);
    if (!w) throw new ConfigError(`saveCheckpoint: weights lack ${s.name}`);
    if (w.length !== numel(s.shape))
      throw new ConfigError(`saveCheckpoint: ${s.name} has ${w.length} values, expected [${s.shape}]`);
  }
  const dtype = opts.dtype ?? 'float32';
  const meta = weightsMetadata(config, opts);
  const bytesPer = dtype === 'float32' ? 4 : 2;
  const total = specs.reduce((a, s) => a + numel(s.shape) * bytesPer, 0);
  const parts = (g: ParamSpec[]) =>
    safetensorsParts(
      g.map((s) => [hfName(config.tensorLayout, s.name), fromFloat32(weights.get(s.name)!, s.shape, dtype)]),
      meta,
    );
  if (total <= (opts.maxShardBytes ?? MAX_SHARD_BYTES))
    return { files: [{ name: MODEL_FILE, parts: parts(specs) }], index: null };
  // save_pretrained's sharding: consecutive tensors up to the shard size, model-0000i-of-0000n + the index
  const groups: ParamSpec[][] = [[]];
  let size = 0;
  for (const s of specs) {
    const n = numel(s.shape) * bytesPer;
    if (size + n > (opts.maxShardBytes ?? MAX_SHARD_BYTES) && groups[groups.length - 1].length) {
      groups.push([]);
      size = 0;
    }
    groups[groups.length - 1].push(s);
    size += n;
  }
  const weightMap: Record<string, string> = {};
  const pad = (i: number) => String(i).padStart(5, '0');
  const files = groups.map((g, i) => {
    const f = `model-${pad(i + 1)}-of-${pad(groups.length)}.safetensors`;
    for (const s of g) weightMap[hfName(config.tensorLayout, s.name)] = f;
    return { name: f, parts: parts(g) };
  });
  return { files, index: JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }, null, 2) };
}

/** The safetensors metadata of a weights file saveCheckpoint writes. */
function weightsMetadata(config: ModelConfig, opts: Pick<SaveOptions, 'dtype' | 'metadata'>): Record<string, string> {
  const dtype = opts.dtype ?? 'float32';
  // the source's dtype outlives an f32 training checkpoint, so export can write it back
  const source: Record<string, string> =
    config.storedDtype && config.storedDtype !== dtype ? { source_dtype: config.storedDtype } : {};
  return { format: 'pt', ...source, ...(opts.metadata ?? {}) };
}

/**
 * The layout of the one model.safetensors saveCheckpoint writes for weights of `config` (`opts` as
 * it is given them): its first bytes (header length, header) and the parameters whose values
 * follow, in order, in `dtype`; null when the weights are written in shards.
 */
export function weightsFileLayout(
  config: ModelConfig,
  opts: Pick<SaveOptions, 'dtype' | 'metadata' | 'maxShardBytes'> = {},
): { header: [Buffer, Buffer]; params: string[]; dtype: 'float32' | 'bfloat16' } | null {
  const dtype = opts.dtype ?? 'float32';
  if (dtype !== 'float32' && dtype !== 'bfloat16') return null;
  const specs = paramSpecs(config);
  const bytesPer = dtype === 'float32' ? 4 : 2;
  if (specs.reduce((a, s) => a + numel(s.shape) * bytesPer, 0) > (opts.maxShardBytes ?? MAX_SHARD_BYTES)) return null;
  const st = dtype === 'float32' ? 'F32' : 'BF16';
  const header = safetensorsHeader(
    specs.map((s) => [hfName(config.tensorLayout, s.name), { dtype: st, shape: s.shape }]),
    weightsMetadata(config, opts),
  );
  return { header, params: specs.map((s) => s.name), dtype };
}

/**
 * The sha256 saveCheckpoint returns for these weights (`opts` as it is given them), computed over
 * the bytes it would write without writing them: a policy version kept in memory only is named by it.
 */
export function checkpointWeightsSha256(
  config: ModelConfig,
  weights: Weights,
  opts: Pick<SaveOptions, 'dtype' | 'metadata' | 'maxShardBytes'> = {},
): string {
  const hash = createHash('sha256');
  for (const f of weightFiles(config, weights, opts).files) for (const b of f.parts) updateHash(hash, b);
  return hash.digest('hex');
}

/** Write a checkpoint directory atomically; returns the sha256 of model.safetensors and every file written (name, sha256, size). */
export async function saveCheckpoint(
  dir: string,
  config: ModelConfig,
  weights: Weights,
  opts: SaveOptions = {},
): Promise<{ weightsSha256: string; files: WrittenFile[] }> {
  const specs = paramSpecs(config);
  const dtype = opts.dtype ?? 'float32';
  const files = new Map<string, FileData>();
  const hash = createHash('sha256');
  const w = weightFiles(config, weights, opts);
  for (const f of w.files) {
    // written part by part: the weights are not joined into one buffer (a copy of them all)
    files.set(f.name, f.parts);
    if (w.index !== null) for (const b of f.parts) updateHash(hash, b);
  }
  if (w.index !== null) files.set(MODEL_INDEX_FILE, w.index);
  // the source's generation config and tokenizer files (read before the temporary directory exists)
  const side = await sideFiles(config, opts.assetsFrom ?? null);
  // weights stored below f32: the optimizer state carries the f32 master weights training resumes from
  if (opts.optimizer)
    files.set(OPTIMIZER_FILE, optimizerFile(specs, opts.optimizer, dtype === 'float32' ? null : weights));
  files.set(CONFIG_FILE, JSON.stringify(toHfConfig(config, dtype), null, 2) + '\n');
  for (const [f, data] of side) files.set(f, data);
  const written = await writeDirAtomic(dir, files, !!opts.overwrite, opts.beforeRename);
  // one file: its sha256 as written; shards: the sha256 of their bytes in order
  const single = written.find((f) => f.name === MODEL_FILE);
  return { weightsSha256: single ? single.sha256 : hash.digest('hex'), files: written };
}

/**
 * Writes a directory holding only optimizer.safetensors (atomically): the AdamW state of a
 * checkpoint, kept apart from the weights-only policy version it belongs to. `lora`: the state of
 * the adapters of that LoRA config; `masters`: the f32 weights of a version stored below f32.
 * Returns the file written (name, sha256, size).
 */
export async function saveOptimizer(
  dir: string,
  config: ModelConfig,
  state: OptimizerState,
  o: { lora?: LoraConfig | null; masters?: Weights | null } = {},
): Promise<WrittenFile[]> {
  const specs = o.lora ? loraSpecs(config, o.lora) : paramSpecs(config);
  return writeDirAtomic(dir, new Map([[OPTIMIZER_FILE, optimizerFile(specs, state, o.masters ?? null)]]), true);
}

/** Weights above this many bytes are written in shards (save_pretrained's layout; a Buffer holds at most 4 GiB). */
export const MAX_SHARD_BYTES = 4e9;

/**
 * A whole file as one Buffer, in 1 GiB reads: fs.readFile stops at 2 GiB, and a Hugging Face shard
 * is up to ~4 GB (Qwen2.5-VL-3B's first is 3.98 GB). Buffers reach 4 GiB; larger is one line.
 */
export async function readWholeFile(file: string): Promise<Buffer> {
  const fh = await fs.open(file, 'r');
  try {
    const size = (await fh.stat()).size;
    if (size > 2 ** 32)
      throw new ConfigError(
        `${file} is ${(size / 2 ** 30).toFixed(1)} GiB; reshard the model to files under 4 GiB (save_pretrained(max_shard_size="4GB"))`,
      );
    const buf = Buffer.allocUnsafe(size);
    for (let at = 0; at < size;) {
      const { bytesRead } = await fh.read(buf, at, Math.min(2 ** 30, size - at), at);
      if (bytesRead === 0) throw new ConfigError(`${file}: ended after ${at} of ${size} bytes while being read`);
      at += bytesRead;
    }
    return buf;
  } finally {
    await fh.close();
  }
}

async function readFile(file: string, what: string): Promise<Buffer> {
  try {
    return await readWholeFile(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT')
      throw new ConfigError(`checkpoint: ${what} not found at ${file}`);
    throw e;
  }
}

/** Check a decoded tensor map against the config's parameter specs; returns float32 weights. */
export function weightsFromTensors(
  config: ModelConfig,
  tensors: Map<string, StTensor>,
  source: string,
  suffix = '',
): Weights {
  // either tensor layout (hf-layout.ts) is read; names are compared in rlstream's (flat) one
  if ([...tensors.keys()].some((k) => fromHfName(k) !== k))
    tensors = new Map([...tensors].map(([k, t]) => [fromHfName(k), t]));
  const specs = paramSpecs(config);
  const want = new Set(specs.map((s) => s.name + suffix));
  const ignorable = (k: string) =>
    (config.tieWordEmbeddings && k === 'lm_head.weight' + suffix) || k.endsWith('rotary_emb.inv_freq' + suffix);
  const extra = [...tensors.keys()].filter((k) => !want.has(k) && !ignorable(k));
  if (extra.length)
    throw new ConfigError(
      `${source}: unexpected tensor(s) ${extra.slice(0, 5).join(', ')}${extra.length > 5 ? ` (+${extra.length - 5} more)` : ''} for this config.json (${config.modelType}, ${config.numHiddenLayers} layers, head "${config.head}")`,
    );
  const w: Weights = new Map();
  for (const s of specs) {
    const name = s.name + suffix;
    const t = tensors.get(name);
    if (!t) throw new ConfigError(`${source}: missing tensor ${name} (expected shape [${s.shape}])`);
    if (t.shape.length !== s.shape.length || t.shape.some((d, i) => d !== s.shape[i]))
      throw new ConfigError(`${source}: tensor ${name} has shape [${t.shape}], expected [${s.shape}] from config.json`);
    w.set(s.name, toFloat32(t, name, source));
  }
  return w;
}

async function readJson(file: string, what: string, optional: true): Promise<Record<string, unknown> | null>;
async function readJson(file: string, what: string, optional?: false): Promise<Record<string, unknown>>;
async function readJson(file: string, what: string, optional = false): Promise<Record<string, unknown> | null> {
  let text: string;
  try {
    text = (await fs.readFile(file)).toString('utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') {
      if (optional) return null;
      throw new ConfigError(`${path.dirname(file)} is not a model directory: ${what} not found`);
    }
    throw e;
  }
  let j: unknown;
  try {
    j = JSON.parse(text);
  } catch (e) {
    throw new ConfigError(`${file} is not valid JSON (${(e as Error).message})`);
  }
  if (!j || typeof j !== 'object' || Array.isArray(j)) throw new ConfigError(`${file} must hold a JSON object`);
  return j as Record<string, unknown>;
}

/** The model config of a directory (config.json + generation_config.json), without reading weights. */
export async function readModelDirConfig(
  dir: string,
): Promise<{ config: ModelConfig; generation: Record<string, unknown> | null }> {
  const cfgJson = await readJson(path.join(dir, CONFIG_FILE), CONFIG_FILE);
  const generation = await readJson(path.join(dir, GENERATION_CONFIG_FILE), GENERATION_CONFIG_FILE, true);
  return { config: withWeightsLayout(fromHfConfig(cfgJson, generation), dir), generation };
}

/** The config with the tensor layout and stored dtype of `dir`'s weights (hf-layout.ts), when it has any. */
function withWeightsLayout(c: ModelConfig, dir: string): ModelConfig {
  const w = weightsLayoutOf(dir);
  if (!w) return c;
  // f32 is the default (absent), so an rlstream checkpoint's config reads back as it was written
  if (w.dtype === 'float32' && w.layout === 'flat') return c;
  return modelConfig({
    ...c,
    ...(w.dtype !== 'float32' ? { storedDtype: w.dtype } : {}),
    ...(w.layout === 'nested' ? { tensorLayout: 'nested' } : {}),
  });
}

/** readModelDirConfig, synchronously (for start-up checks). */
export function readModelDirConfigSync(dir: string): ModelConfig {
  const read = (f: string, optional: boolean): Record<string, unknown> | null => {
    const file = path.join(dir, f);
    if (!existsSync(file)) {
      if (optional) return null;
      // a LoRA checkpoint's actor/ (PEFT layout) holds the adapter only: its base lives elsewhere
      if (isAdapterDir(dir))
        throw new ConfigError(
          `${dir} is a LoRA adapter (PEFT adapter_config.json, no ${CONFIG_FILE}), not a full model; merge it into its base with \`rlstream export ${dir} --merge --out DIR\` and give DIR as actor.model.path (with actor.model.lora to train a new adapter on the merged model)`,
        );
      throw new ConfigError(`${dir} is not a model directory: ${f} not found`);
    }
    let j: unknown;
    try {
      j = JSON.parse(readFileSync(file, 'utf8'));
    } catch (e) {
      throw new ConfigError(`${file} is not valid JSON (${(e as Error).message})`);
    }
    if (!j || typeof j !== 'object' || Array.isArray(j)) throw new ConfigError(`${file} must hold a JSON object`);
    return j as Record<string, unknown>;
  };
  return withWeightsLayout(fromHfConfig(read(CONFIG_FILE, false)!, read(GENERATION_CONFIG_FILE, true)), dir);
}

/**
 * A causal-LM checkpoint as the start of a value model (critic): the same trunk, no LM head, and a
 * fresh `score.weight` [1, D] ~ N(0, 0.02) seeded by `seed` (as transformers initialises the head
 * of AutoModelForTokenClassification loaded from an LM).
 */
export function valueModelFrom(
  ck: Pick<Checkpoint, 'config' | 'weights'>,
  seed: number,
): { config: ModelConfig; weights: Weights } {
  if (ck.config.head === 'value') return ck;
  const config = modelConfig({ ...ck.config, head: 'value', tieWordEmbeddings: false });
  const fresh = initWeights(config, seed);
  const weights: Weights = new Map();
  for (const s of paramSpecs(config))
    weights.set(s.name, s.name === 'score.weight' ? fresh.get(s.name)! : ck.weights.get(s.name)!);
  return { config, weights };
}

/** The shards model.safetensors.index.json names, in index order, each checked to be a file of `dir`. */
function indexShards(
  dir: string,
  index: Record<string, unknown>,
): { map: Record<string, unknown>; entries: [string, unknown][]; shards: string[] } {
  const indexFile = path.join(dir, MODEL_INDEX_FILE);
  const map = index.weight_map;
  if (!map || typeof map !== 'object' || Array.isArray(map))
    throw new ConfigError(`${indexFile}: "weight_map" must be an object {tensor name: shard file}`);
  const entries = Object.entries(map as Record<string, unknown>);
  const shards = [...new Set(entries.map(([, f]) => String(f)))];
  for (const f of shards) {
    if (f.includes('/') || f.includes('\\') || f.startsWith('.'))
      throw new ConfigError(`${indexFile}: shard name ${JSON.stringify(f)} must be a file name in the same directory`);
    if (!existsSync(path.join(dir, f)))
      throw new ConfigError(`${indexFile} names shard ${f}, which is missing from ${dir}`);
  }
  return { map: map as Record<string, unknown>, entries, shards };
}

/**
 * Every tensor of a directory's weights: model.safetensors, or the shards named by
 * model.safetensors.index.json (each tensor must come from the shard the index names). Returns the
 * tensors and the sha256 of the weight bytes (of the file, or of the shards in index order).
 * `float32`: each bf16 / f16 / f64 tensor is converted to f32 as its shard is read, so a shard's
 * bytes are released before the next shard is read (peak: the f32 weights plus one shard, instead
 * of plus every shard).
 */
async function readWeightTensors(
  dir: string,
  opts: { float32?: boolean } = {},
): Promise<{ tensors: Map<string, StTensor>; metadata: Record<string, string>; sha: string; source: string }> {
  const keep = (name: string, t: StTensor, file: string): StTensor =>
    opts.float32 && (t.dtype === 'BF16' || t.dtype === 'F16' || t.dtype === 'F64')
      ? { dtype: 'F32', shape: t.shape, data: toFloat32(t, name, file) }
      : t;
  const single = path.join(dir, MODEL_FILE),
    indexFile = path.join(dir, MODEL_INDEX_FILE);
  if (
    !existsSync(single) &&
    !existsSync(indexFile) &&
    (existsSync(path.join(dir, 'pytorch_model.bin')) || existsSync(path.join(dir, 'pytorch_model.bin.index.json')))
  ) {
    throw new ConfigError(
      `${dir} has only PyTorch pickle weights (pytorch_model.bin); download the model's safetensors files, or convert once with transformers: AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)`,
    );
  }
  const index = existsSync(single) ? null : await readJson(indexFile, `${MODEL_FILE} (or ${MODEL_INDEX_FILE})`);
  if (!index) {
    const buf = await readFile(single, MODEL_FILE);
    const { tensors, metadata } = decodeSafetensors(buf, single);
    for (const [name, t] of tensors) tensors.set(name, keep(name, t, single));
    return { tensors, metadata, sha: sha256(buf), source: single };
  }
  const { map, entries, shards } = indexShards(dir, index);
  const tensors = new Map<string, StTensor>();
  const hash = createHash('sha256');
  let metadata: Record<string, string> = {};
  for (const f of shards) {
    const file = path.join(dir, f);
    const buf = await readWholeFile(file);
    updateHash(hash, buf);
    const d = decodeSafetensors(buf, file);
    metadata = { ...d.metadata, ...metadata };
    for (const [name, t] of d.tensors) {
      const owner = map[name];
      if (owner === undefined) continue; // not in the index: transformers does not read it either
      if (owner !== f) continue;
      tensors.set(name, keep(name, t, file));
    }
  }
  for (const [name, f] of entries)
    if (!tensors.has(name))
      throw new ConfigError(`${indexFile} puts tensor ${name} in ${String(f)}, which does not contain it`);
  return { tensors, metadata, sha: hash.digest('hex'), source: `${dir} (${shards.length} shards)` };
}

/** Load and validate a model or checkpoint directory (the optimizer state when present and `optimizer` is not false). */
export async function loadCheckpoint(dir: string, opts: { optimizer?: boolean } = {}): Promise<Checkpoint> {
  const { config, generation } = await readModelDirConfig(dir);
  readImageProcessor(dir, config); // a Qwen-VL directory's image processor: present and supported
  const { tensors, metadata, sha, source } = await readWeightTensors(dir, { float32: true });
  const weights = weightsFromTensors(config, tensors, source);
  tensors.clear();
  const out: Checkpoint = { config, weights, weightsSha256: sha, metadata, generation };
  if (opts.optimizer !== false) {
    const ofile = path.join(dir, OPTIMIZER_FILE);
    let obuf: Buffer | null = null;
    try {
      obuf = await fs.readFile(ofile);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    }
    if (obuf) {
      const od = decodeSafetensors(obuf, ofile);
      const step = Number(od.metadata.step);
      if (!Number.isInteger(step) || step < 0)
        throw new ConfigError(
          `${ofile}: metadata "step" must be a non-negative integer, got ${JSON.stringify(od.metadata.step)}`,
        );
      const m = new Map<string, StTensor>(),
        v = new Map<string, StTensor>(),
        masters = new Map<string, StTensor>();
      for (const [k, t] of od.tensors) {
        if (k.endsWith('.exp_avg')) m.set(k, t);
        else if (k.endsWith('.exp_avg_sq')) v.set(k, t);
        else if (k.endsWith('.master')) masters.set(k, t);
        else
          throw new ConfigError(
            `${ofile}: unexpected tensor ${k} (expected <param>.exp_avg / <param>.exp_avg_sq / <param>.master)`,
          );
      }
      // weights stored below f32: training resumes from the f32 master weights, not their rounding
      if (masters.size) out.weights = weightsFromTensors(config, masters, ofile, '.master');
      out.optimizer = {
        step,
        expAvg: weightsFromTensors(config, m, ofile, '.exp_avg'),
        expAvgSq: weightsFromTensors(config, v, ofile, '.exp_avg_sq'),
      };
    } else if (opts.optimizer === true) {
      throw new ConfigError(`checkpoint: ${OPTIMIZER_FILE} not found in ${dir}`);
    }
  }
  return out;
}

/** The weights file of a model directory: adapter_model.safetensors for a LoRA adapter, else model.safetensors. */
export function weightsFileOf(dir: string): string {
  return isAdapterDir(dir) ? ADAPTER_MODEL_FILE : MODEL_FILE;
}

/** sha256 of a checkpoint's model.safetensors (its shards in index order; a LoRA adapter's adapter_model.safetensors). */
export async function checkpointSha256(dir: string): Promise<string> {
  const f = weightsFileOf(dir);
  if (f === MODEL_FILE && !existsSync(path.join(dir, f)) && existsSync(path.join(dir, MODEL_INDEX_FILE))) {
    // the shards' bytes in index order, as loadCheckpoint hashes them, one shard in memory at a time
    const { shards } = indexShards(dir, await readJson(path.join(dir, MODEL_INDEX_FILE), MODEL_INDEX_FILE));
    const hash = createHash('sha256');
    for (const s of shards) updateHash(hash, await readWholeFile(path.join(dir, s)));
    return hash.digest('hex');
  }
  return sha256(await readFile(path.join(dir, f), f));
}

// ── LoRA adapters in PEFT layout (lib/model/lora.ts) ──

export interface AdapterSaveOptions {
  optimizer?: OptimizerState;
  metadata?: Record<string, string>;
  overwrite?: boolean;
  /** The base model directory (adapter_config.json base_model_name_or_path; its generation config and tokenizer files are copied). */
  basePath: string | null;
  /** Called once every file is in the temporary directory, before it is renamed into place (a test's crash point). */
  beforeRename?: () => void;
}

export interface AdapterCheckpoint {
  lora: LoraConfig;
  /** Adapter tensors by rlstream name (`<module>.lora_A.weight`, without PEFT's prefix). */
  adapter: Weights;
  optimizer?: OptimizerState;
  /** sha256 (hex) of adapter_model.safetensors. */
  weightsSha256: string;
  metadata: Record<string, string>;
  /** base_model_name_or_path of adapter_config.json. */
  basePath: string | null;
}

/** Whether `dir` holds a PEFT adapter (adapter_config.json) rather than a full model. */
export function isAdapterDir(dir: string): boolean {
  return existsSync(path.join(dir, ADAPTER_CONFIG_FILE));
}

/**
 * Write a PEFT adapter directory atomically: adapter_config.json, adapter_model.safetensors
 * (tensors `base_model.model.<module>.lora_A.weight` / `.lora_B.weight`, F32, metadata format pt),
 * optionally optimizer.safetensors (the adapters' AdamW moments), and the base's generation config
 * and tokenizer files. No config.json: transformers and peft load the base from
 * base_model_name_or_path and apply the adapter. Returns the sha256 of adapter_model.safetensors and
 * every file written with its sha256 and size.
 */
export async function saveAdapter(
  dir: string,
  config: ModelConfig,
  lora: LoraConfig,
  adapter: Weights,
  opts: AdapterSaveOptions,
): Promise<{ weightsSha256: string; files: WrittenFile[] }> {
  validateAdapter(config, lora, adapter, 'saveAdapter');
  const specs = loraSpecs(config, lora);
  const model = encodeSafetensors(
    specs.map((s) => [
      PEFT_PREFIX + hfName(config.tensorLayout, s.name),
      { shape: s.shape, data: adapter.get(s.name)! },
    ]),
    { format: 'pt', ...(opts.metadata ?? {}) },
  );
  const files = new Map<string, FileData>([[ADAPTER_MODEL_FILE, model]]);
  if (opts.optimizer) files.set(OPTIMIZER_FILE, optimizerFile(specs, opts.optimizer));
  files.set(ADAPTER_CONFIG_FILE, JSON.stringify(peftAdapterConfig(lora, opts.basePath, config), null, 2) + '\n');
  for (const [f, data] of await sideFiles(config, opts.basePath)) files.set(f, data);
  const written = await writeDirAtomic(dir, files, !!opts.overwrite, opts.beforeRename);
  return { weightsSha256: written.find((f) => f.name === ADAPTER_MODEL_FILE)!.sha256, files: written };
}

/**
 * Load a PEFT adapter directory for the base model `config`. An adapter that does not fit the
 * base (another architecture, width or depth; target modules it lacks) is one line naming the
 * tensor and both shapes; `expect` (the run's LoRA config) must match rank, alpha and targets.
 */
export async function loadAdapter(
  dir: string,
  config: ModelConfig,
  opts: { optimizer?: boolean; expect?: LoraConfig } = {},
): Promise<AdapterCheckpoint> {
  const cfgFile = path.join(dir, ADAPTER_CONFIG_FILE);
  const file = path.join(dir, ADAPTER_MODEL_FILE);
  const buf = await readFile(file, ADAPTER_MODEL_FILE);
  const decoded = decodeSafetensors(buf, file);
  const metadata = decoded.metadata;
  // PEFT names in either tensor layout (hf-layout.ts), whatever the base's
  const tensors = new Map(
    [...decoded.tensors].map(([k, t]) =>
      k.startsWith(PEFT_PREFIX) ? [PEFT_PREFIX + fromHfName(k.slice(PEFT_PREFIX.length)), t] : [k, t],
    ),
  );
  const peftJson = await readJson(cfgFile, ADAPTER_CONFIG_FILE);
  // a vision-language base, or target_modules as a regex: the adapted modules are the file's tensors
  // (PEFT matches list entries by suffix, so e.g. gate_proj also adapts a Qwen2.5-VL tower's MLP)
  const derived = config.vision || !isModuleList(peftJson.target_modules) ? adaptedModules(tensors.keys()) : null;
  const lora = loraFromPeftConfig(
    derived ? { ...peftJson, target_modules: derived.decoder } : peftJson,
    cfgFile,
    derived?.tower,
  );
  if (opts.expect) {
    const e = opts.expect;
    const show = (l: LoraConfig) =>
      `rank ${l.rank}, alpha ${l.alpha}, target modules ${l.targetModules.join(', ')}${towerLoraModules(config, l).length ? `, vision target modules ${towerLoraModules(config, l).join(', ')}` : ''}`;
    if (
      e.rank !== lora.rank ||
      e.alpha !== lora.alpha ||
      e.targetModules.join() !== lora.targetModules.join() ||
      towerLoraModules(config, e).join() !== towerLoraModules(config, lora).join()
    ) {
      throw new ConfigError(
        `${cfgFile}: the adapter (${show(lora)}) is not actor.model.lora (${show(e)}); set actor.model.lora to the adapter's values`,
      );
    }
  }
  const specs = loraSpecs(config, lora);
  const known = new Set(specs.map((s) => PEFT_PREFIX + s.name));
  const base = `the base model (${config.modelType}, ${config.numHiddenLayers} layers, hidden ${config.hiddenSize}, ffn ${config.intermediateSize})`;
  for (const k of tensors.keys()) {
    if (!known.has(k))
      throw new ConfigError(
        `${file}: tensor ${k} has no module in ${base}; the adapter was trained on another base model`,
      );
  }
  const adapter: Weights = new Map();
  for (const s of specs) {
    const t = tensors.get(PEFT_PREFIX + s.name);
    if (!t)
      throw new ConfigError(
        `${file}: tensor ${PEFT_PREFIX + s.name} is missing (target modules ${lora.targetModules.join(', ')} on ${base})`,
      );
    if (t.shape.join() !== s.shape.join())
      throw new ConfigError(
        `${file}: tensor ${PEFT_PREFIX + s.name} has shape [${t.shape}], ${base} needs [${s.shape}]; the adapter was trained on another base model`,
      );
    adapter.set(s.name, toFloat32(t, s.name, file));
  }
  const cfgJson = peftJson;
  const out: AdapterCheckpoint = {
    lora,
    adapter,
    weightsSha256: sha256(buf),
    metadata,
    basePath: typeof cfgJson.base_model_name_or_path === 'string' ? cfgJson.base_model_name_or_path : null,
  };
  if (opts.optimizer !== false) {
    const ofile = path.join(dir, OPTIMIZER_FILE);
    if (existsSync(ofile)) {
      const od = decodeSafetensors(await fs.readFile(ofile), ofile);
      const step = Number(od.metadata.step);
      if (!Number.isInteger(step) || step < 0)
        throw new ConfigError(
          `${ofile}: metadata "step" must be a non-negative integer, got ${JSON.stringify(od.metadata.step)}`,
        );
      const pick = (suffix: string): Weights =>
        new Map(
          specs.map((s) => {
            const t = od.tensors.get(s.name + suffix);
            if (!t || t.shape.join() !== s.shape.join())
              throw new ConfigError(`${ofile}: ${s.name + suffix} is missing or not [${s.shape}]`);
            return [s.name, toFloat32(t, s.name + suffix, ofile)];
          }),
        );
      out.optimizer = { step, expAvg: pick('.exp_avg'), expAvgSq: pick('.exp_avg_sq') };
    } else if (opts.optimizer === true) throw new ConfigError(`checkpoint: ${OPTIMIZER_FILE} not found in ${dir}`);
  }
  return out;
}

/** Whether a PEFT target_modules is module names ('all-linear', one name, or a list) rather than a regex. */
function isModuleList(tm: unknown): boolean {
  if (Array.isArray(tm) || tm === 'all-linear') return true;
  return typeof tm === 'string' && /^[A-Za-z0-9_]+$/.test(tm);
}

/** The decoder and ViT-block modules that PEFT tensor names (rlstream layout) adapt. */
function adaptedModules(names: Iterable<string>): { decoder: string[]; tower: string[] } {
  const dec = new Set<string>(),
    tower = new Set<string>();
  for (const n of names) {
    const d = /^base_model\.model\.model\.layers\.\d+\.(?:self_attn|mlp)\.([a-z_]+)\.lora_[AB]\.weight$/.exec(n);
    if (d) dec.add(d[1]);
    const v = /^base_model\.model\.visual\.blocks\.\d+\.(?:attn|mlp)\.([a-z0-9_]+)\.lora_[AB]\.weight$/.exec(n);
    if (v) tower.add(v[1]);
  }
  // names outside both are reported by the shape / module checks that follow
  return {
    decoder: LORA_MODULES.filter((m) => dec.has(m)),
    tower: VISION_LORA_MODULES.filter((m) => tower.has(m)),
  };
}
