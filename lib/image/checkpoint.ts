/**
 * An image policy's model directory: config.json (`model_type: "rlstream_dit"`, the DitConfig
 * fields in snake_case, `class_names`: the prompt of each class) and model.safetensors (F32
 * weights by name). `rlstream generate <dir> --prompt NAME --image-out PATH` samples from it.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ConfigError } from '../errors.ts';
import { decodeSafetensors, encodeSafetensors, toFloat32 } from '../model/safetensors.ts';
import { ditConfig, ditParamSpecs, type DitConfig, type DitWeights, type ParamSpec } from './dit.ts';

export const DIT_MODEL_TYPE = 'rlstream_dit';

const KEYS: [keyof DitConfig, string][] = [
  ['imageSize', 'image_size'],
  ['channels', 'channels'],
  ['patchSize', 'patch_size'],
  ['hidden', 'hidden_size'],
  ['depth', 'depth'],
  ['heads', 'num_heads'],
  ['mlpRatio', 'mlp_ratio'],
  ['numClasses', 'num_classes'],
  ['timeFreqs', 'time_freqs'],
];

export interface DitModel {
  config: DitConfig;
  classNames: string[];
  weights: DitWeights;
}

/** Whether `dir` holds an image policy (config.json model_type rlstream_dit). */
export function isDitDir(dir: string): boolean {
  const p = join(dir, 'config.json');
  if (!existsSync(p)) return false;
  try {
    return (JSON.parse(readFileSync(p, 'utf8')) as { model_type?: unknown }).model_type === DIT_MODEL_TYPE;
  } catch {
    return false;
  }
}

export function saveDit(dir: string, m: DitModel): void {
  mkdirSync(dir, { recursive: true });
  for (const [f, data] of ditFiles(m)) writeFileSync(join(dir, f), data);
}

/** A model directory's files by name: config.json and model.safetensors (equal weights give equal bytes). */
export function ditFiles(m: DitModel): Map<string, Uint8Array | string> {
  if (m.classNames.length !== m.config.numClasses)
    throw new ConfigError(`saveDit: ${m.classNames.length} class names for ${m.config.numClasses} classes`);
  const cfg: Record<string, unknown> = { model_type: DIT_MODEL_TYPE };
  for (const [k, s] of KEYS) cfg[s] = m.config[k];
  cfg.class_names = m.classNames;
  const specs = ditParamSpecs(m.config);
  return new Map<string, Uint8Array | string>([
    ['config.json', JSON.stringify(cfg, null, 2) + '\n'],
    [
      'model.safetensors',
      encodeSafetensors(
        specs.map((s) => [s.name, { dtype: 'F32' as const, shape: s.shape, data: m.weights.get(s.name)! }]),
      ),
    ],
  ]);
}

/** AdamW state of an image policy: first and second moments by parameter, and the step count. */
export interface DitOptimizerState {
  step: number;
  expAvg: DitWeights;
  expAvgSq: DitWeights;
}

/**
 * optimizer.safetensors of an image policy: `<param>.exp_avg`, `<param>.exp_avg_sq`, metadata `step`,
 * over the trained parameters (`of`: a config = every weight, or the specs, e.g. a LoRA adapter's).
 */
export function ditOptimizerFile(of: DitConfig | ParamSpec[], st: DitOptimizerState): Uint8Array {
  const specs = Array.isArray(of) ? of : ditParamSpecs(of);
  return encodeSafetensors(
    specs.flatMap((s) => [
      [`${s.name}.exp_avg`, { dtype: 'F32' as const, shape: s.shape, data: st.expAvg.get(s.name)! }],
      [`${s.name}.exp_avg_sq`, { dtype: 'F32' as const, shape: s.shape, data: st.expAvgSq.get(s.name)! }],
    ]),
    { step: String(st.step) },
  );
}

export function loadDitOptimizer(file: string, of: DitConfig | ParamSpec[]): DitOptimizerState {
  const { tensors, metadata } = decodeSafetensors(readFileSync(file), file);
  const st: DitOptimizerState = { step: Number(metadata?.step ?? NaN), expAvg: new Map(), expAvgSq: new Map() };
  if (!Number.isInteger(st.step)) throw new ConfigError(`${file}: metadata step missing`);
  for (const s of Array.isArray(of) ? of : ditParamSpecs(of))
    for (const [suffix, into] of [
      ['exp_avg', st.expAvg],
      ['exp_avg_sq', st.expAvgSq],
    ] as const) {
      const t = tensors.get(`${s.name}.${suffix}`);
      if (!t) throw new ConfigError(`${file}: ${s.name}.${suffix} missing`);
      into.set(s.name, toFloat32(t, s.name, file));
    }
  return st;
}

export function loadDit(dir: string): DitModel {
  const raw = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
  if (raw.model_type !== DIT_MODEL_TYPE)
    throw new ConfigError(`${dir}/config.json: model_type is not ${DIT_MODEL_TYPE}`);
  const c: Record<string, number> = {};
  for (const [k, s] of KEYS) {
    if (typeof raw[s] !== 'number') throw new ConfigError(`${dir}/config.json: ${s} must be a number`);
    c[k] = raw[s] as number;
  }
  const config = ditConfig(c as unknown as DitConfig);
  const classNames = raw.class_names;
  if (
    !Array.isArray(classNames) ||
    classNames.length !== config.numClasses ||
    !classNames.every((x) => typeof x === 'string')
  )
    throw new ConfigError(`${dir}/config.json: class_names must list ${config.numClasses} strings`);
  const { weights } = readDitTensors(join(dir, 'model.safetensors'), ditParamSpecs(config));
  return { config, classNames: classNames as string[], weights };
}

/**
 * The tensors `specs` names from a safetensors file (model weights, EMA, a LoRA adapter) as
 * float32, with the file's metadata; `ifMissing`: the one-line message when the file cannot be read.
 */
export function readDitTensors(
  file: string,
  specs: readonly ParamSpec[],
  ifMissing?: string,
): { weights: DitWeights; metadata: Record<string, string> | undefined } {
  let bytes: Uint8Array;
  try {
    bytes = readFileSync(file);
  } catch (e) {
    if (ifMissing === undefined) throw e;
    throw new ConfigError(ifMissing);
  }
  const { tensors, metadata } = decodeSafetensors(bytes, file);
  const weights: DitWeights = new Map();
  for (const s of specs) {
    const t = tensors.get(s.name);
    if (!t) throw new ConfigError(`${file}: tensor ${s.name} missing`);
    weights.set(s.name, toFloat32(t, s.name, file));
  }
  return { weights, metadata };
}
