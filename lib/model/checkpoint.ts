/**
 * Checkpoints: a directory with `model.safetensors` (HF parameter names, F32, metadata
 * `format: pt`), `config.json` (HF keys), and optionally `optimizer.safetensors` (AdamW moments as
 * `<name>.exp_avg` / `<name>.exp_avg_sq`, the step in metadata). The directory is written under a
 * temporary name, every file fsynced, then renamed into place, so a half-written checkpoint never
 * looks valid. Loading validates names, shapes and dtypes and names the tensor at fault.
 */
import { createHash, randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { ConfigError, withStoragePath } from '../errors.ts';
import { fromHfConfig, toHfConfig, type ModelConfig } from './config.ts';
import { numel, paramSpecs, type Weights } from './params.ts';
import { decodeSafetensors, encodeSafetensors, toFloat32, type StTensor } from './safetensors.ts';
import type { OptimizerState } from './train.ts';

export const MODEL_FILE = 'model.safetensors';
export const OPTIMIZER_FILE = 'optimizer.safetensors';
export const CONFIG_FILE = 'config.json';

export interface Checkpoint {
  config: ModelConfig;
  weights: Weights;
  optimizer?: OptimizerState;
  /** sha256 (hex) of model.safetensors. */
  weightsSha256: string;
  /** Extra string metadata stored in model.safetensors. */
  metadata: Record<string, string>;
}

export interface SaveOptions {
  optimizer?: OptimizerState;
  metadata?: Record<string, string>;
  /** Replace an existing checkpoint directory (default false: error). */
  overwrite?: boolean;
}

async function writeSynced(file: string, data: Uint8Array | string): Promise<void> {
  try {
    const fh = await fs.open(file, 'w');
    try { await fh.writeFile(data); await fh.sync(); } finally { await fh.close(); }
  } catch (e) { throw withStoragePath(e, file); } // a write's ENOSPC does not name its file
}

async function syncDir(dir: string): Promise<void> {
  const fh = await fs.open(dir, 'r');
  try { await fh.sync(); } catch { /* some filesystems do not support directory fsync */ } finally { await fh.close(); }
}

export function sha256(data: Uint8Array): string { return createHash('sha256').update(data).digest('hex'); }

/** Write a checkpoint directory atomically; returns the sha256 of model.safetensors. */
export async function saveCheckpoint(dir: string, config: ModelConfig, weights: Weights, opts: SaveOptions = {}): Promise<{ weightsSha256: string }> {
  const specs = paramSpecs(config);
  for (const s of specs) {
    const w = weights.get(s.name);
    if (!w) throw new ConfigError(`saveCheckpoint: weights lack ${s.name}`);
    if (w.length !== numel(s.shape)) throw new ConfigError(`saveCheckpoint: ${s.name} has ${w.length} values, expected [${s.shape}]`);
  }
  const model = encodeSafetensors(specs.map((s) => [s.name, { shape: s.shape, data: weights.get(s.name)! }]), { format: 'pt', ...(opts.metadata ?? {}) });
  const parent = path.dirname(path.resolve(dir));
  await fs.mkdir(parent, { recursive: true });
  const tmp = path.join(parent, `.${path.basename(dir)}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
  await fs.mkdir(tmp);
  try {
    await writeSynced(path.join(tmp, MODEL_FILE), model);
    if (opts.optimizer) {
      const o = opts.optimizer;
      const entries: [string, { shape: number[]; data: Float32Array }][] = [];
      for (const s of specs) {
        const m = o.expAvg.get(s.name), v = o.expAvgSq.get(s.name);
        if (!m || !v) throw new ConfigError(`saveCheckpoint: optimizer state lacks moments for ${s.name}`);
        entries.push([`${s.name}.exp_avg`, { shape: s.shape, data: m }], [`${s.name}.exp_avg_sq`, { shape: s.shape, data: v }]);
      }
      await writeSynced(path.join(tmp, OPTIMIZER_FILE), encodeSafetensors(entries, { step: String(o.step), optimizer: 'adamw' }));
    }
    await writeSynced(path.join(tmp, CONFIG_FILE), JSON.stringify(toHfConfig(config), null, 2) + '\n');
    await syncDir(tmp);
    let old: string | null = null;
    try {
      await fs.access(dir);
      if (!opts.overwrite) throw new ConfigError(`saveCheckpoint: ${dir} already exists (pass overwrite: true to replace it)`);
      old = `${tmp}.old`;
      await fs.rename(dir, old);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    }
    await fs.rename(tmp, dir);
    await syncDir(parent);
    if (old) await fs.rm(old, { recursive: true, force: true });
  } catch (e) {
    await fs.rm(tmp, { recursive: true, force: true }).catch(() => undefined);
    throw e;
  }
  return { weightsSha256: sha256(model) };
}

async function readFile(file: string, what: string): Promise<Buffer> {
  try { return await fs.readFile(file); } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') throw new ConfigError(`checkpoint: ${what} not found at ${file}`);
    throw e;
  }
}

/** Check a decoded tensor map against the config's parameter specs; returns float32 weights. */
export function weightsFromTensors(config: ModelConfig, tensors: Map<string, StTensor>, source: string, suffix = ''): Weights {
  const specs = paramSpecs(config);
  const want = new Set(specs.map((s) => s.name + suffix));
  const extra = [...tensors.keys()].filter((k) => !want.has(k) && !(config.tieWordEmbeddings && k === 'lm_head.weight' + suffix));
  if (extra.length) throw new ConfigError(`${source}: unexpected tensor(s) ${extra.slice(0, 5).join(', ')}${extra.length > 5 ? ` (+${extra.length - 5} more)` : ''} for this config.json (${config.modelType}, ${config.numHiddenLayers} layers, head "${config.head}")`);
  const w: Weights = new Map();
  for (const s of specs) {
    const name = s.name + suffix;
    const t = tensors.get(name);
    if (!t) throw new ConfigError(`${source}: missing tensor ${name} (expected shape [${s.shape}])`);
    if (t.shape.length !== s.shape.length || t.shape.some((d, i) => d !== s.shape[i])) throw new ConfigError(`${source}: tensor ${name} has shape [${t.shape}], expected [${s.shape}] from config.json`);
    w.set(s.name, toFloat32(t, name, source));
  }
  return w;
}

/** Load and validate a checkpoint directory (the optimizer state when present and `optimizer` is not false). */
export async function loadCheckpoint(dir: string, opts: { optimizer?: boolean } = {}): Promise<Checkpoint> {
  const cfgText = (await readFile(path.join(dir, CONFIG_FILE), CONFIG_FILE)).toString('utf8');
  let cfgJson: Record<string, unknown>;
  try { cfgJson = JSON.parse(cfgText); } catch (e) { throw new ConfigError(`checkpoint: ${path.join(dir, CONFIG_FILE)} is not valid JSON (${(e as Error).message})`); }
  const config = fromHfConfig(cfgJson);
  const modelBuf = await readFile(path.join(dir, MODEL_FILE), MODEL_FILE);
  const src = path.join(dir, MODEL_FILE);
  const { tensors, metadata } = decodeSafetensors(modelBuf, src);
  const weights = weightsFromTensors(config, tensors, src);
  const out: Checkpoint = { config, weights, weightsSha256: sha256(modelBuf), metadata };
  if (opts.optimizer !== false) {
    const ofile = path.join(dir, OPTIMIZER_FILE);
    let obuf: Buffer | null = null;
    try { obuf = await fs.readFile(ofile); } catch (e) { if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e; }
    if (obuf) {
      const od = decodeSafetensors(obuf, ofile);
      const step = Number(od.metadata.step);
      if (!Number.isInteger(step) || step < 0) throw new ConfigError(`${ofile}: metadata "step" must be a non-negative integer, got ${JSON.stringify(od.metadata.step)}`);
      const m = new Map<string, StTensor>(), v = new Map<string, StTensor>();
      for (const [k, t] of od.tensors) {
        if (k.endsWith('.exp_avg')) m.set(k, t);
        else if (k.endsWith('.exp_avg_sq')) v.set(k, t);
        else throw new ConfigError(`${ofile}: unexpected tensor ${k} (expected <param>.exp_avg / <param>.exp_avg_sq)`);
      }
      out.optimizer = { step, expAvg: weightsFromTensors(config, m, ofile, '.exp_avg'), expAvgSq: weightsFromTensors(config, v, ofile, '.exp_avg_sq') };
    } else if (opts.optimizer === true) {
      throw new ConfigError(`checkpoint: ${OPTIMIZER_FILE} not found in ${dir}`);
    }
  }
  return out;
}

/** sha256 of a checkpoint's model.safetensors. */
export async function checkpointSha256(dir: string): Promise<string> {
  return sha256(await readFile(path.join(dir, MODEL_FILE), MODEL_FILE));
}
