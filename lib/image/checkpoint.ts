/**
 * An image policy's model directory: config.json (`model_type: "rlstream_dit"`, the DitConfig
 * fields in snake_case, `class_names`: the prompt of each class) and model.safetensors (F32
 * weights by name). `rlstream generate <dir> --prompt NAME --image-out PATH` samples from it.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ConfigError } from '../errors.ts';
import { decodeSafetensors, encodeSafetensors, toFloat32 } from '../model/safetensors.ts';
import { ditConfig, ditParamSpecs, type DitConfig, type DitWeights } from './dit.ts';

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
  if (m.classNames.length !== m.config.numClasses)
    throw new ConfigError(`saveDit: ${m.classNames.length} class names for ${m.config.numClasses} classes`);
  mkdirSync(dir, { recursive: true });
  const cfg: Record<string, unknown> = { model_type: DIT_MODEL_TYPE };
  for (const [k, s] of KEYS) cfg[s] = m.config[k];
  cfg.class_names = m.classNames;
  writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg, null, 2) + '\n');
  const specs = ditParamSpecs(m.config);
  writeFileSync(
    join(dir, 'model.safetensors'),
    encodeSafetensors(
      specs.map((s) => [s.name, { dtype: 'F32' as const, shape: s.shape, data: m.weights.get(s.name)! }]),
    ),
  );
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
  const path = join(dir, 'model.safetensors');
  const st = decodeSafetensors(readFileSync(path), path).tensors;
  const weights: DitWeights = new Map();
  for (const s of ditParamSpecs(config)) {
    const t = st.get(s.name);
    if (!t) throw new ConfigError(`${path}: weight ${s.name} missing`);
    weights.set(s.name, toFloat32(t, s.name, path));
  }
  return { config, classNames: classNames as string[], weights };
}
