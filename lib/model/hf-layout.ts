/**
 * Tensor-name layouts of a Hugging Face vision-language checkpoint, and the stored dtype of a
 * directory's weights, read from the safetensors headers alone (no tensor data).
 *
 * Qwen2-VL / Qwen2.5-VL checkpoints come in two layouts:
 *   flat   (transformers < 4.52, and what ≥ 4.52 writes back by reversing its key mapping):
 *          `model.layers.N.*`, `model.embed_tokens.weight`, `model.norm.weight`, `visual.*`, `lm_head.weight`;
 *   nested (Qwen2_5_VLModel holding `language_model` and `visual`, as transformers 5 saves it):
 *          `model.language_model.layers.N.*`, `model.language_model.embed_tokens.weight`, …,
 *          `model.visual.*`, `lm_head.weight`.
 * rlstream names parameters in the flat layout; `hfName` / `fromHfName` translate. A directory's
 * layout is kept in ModelConfig.tensorLayout, so what is read in one layout is written back in it
 * (model.safetensors and PEFT adapter names alike).
 */
import { closeSync, existsSync, openSync, readFileSync, readSync } from 'node:fs';
import path from 'node:path';
import { ConfigError } from '../errors.ts';

export const TENSOR_LAYOUTS = ['flat', 'nested'] as const;
export type TensorLayout = (typeof TENSOR_LAYOUTS)[number];

const NESTED_LM = 'model.language_model.';
const NESTED_VISUAL = 'model.visual.';

/** The checkpoint name of rlstream parameter `name` in `layout` (flat: unchanged). */
export function hfName(layout: TensorLayout | undefined, name: string): string {
  if (layout !== 'nested') return name;
  if (name.startsWith('visual.')) return 'model.' + name;
  if (name.startsWith('model.')) return NESTED_LM + name.slice('model.'.length);
  return name; // lm_head.weight, score.weight
}

/** The rlstream name of a checkpoint tensor in either layout. */
export function fromHfName(name: string): string {
  if (name.startsWith(NESTED_LM)) return 'model.' + name.slice(NESTED_LM.length);
  if (name.startsWith(NESTED_VISUAL)) return name.slice('model.'.length);
  return name;
}

/** The layout tensor names are in: nested when any is under model.language_model. or model.visual. */
export function layoutOf(names: Iterable<string>): TensorLayout {
  for (const n of names) {
    const k = n.startsWith('base_model.model.') ? n.slice('base_model.model.'.length) : n;
    if (k.startsWith(NESTED_LM) || k.startsWith(NESTED_VISUAL)) return 'nested';
  }
  return 'flat';
}

export type HfDtype = 'float32' | 'bfloat16' | 'float16';
const DTYPE_OF: Record<string, HfDtype> = { F32: 'float32', BF16: 'bfloat16', F16: 'float16', F64: 'float32' };

/** The JSON header of a safetensors file (tensor entries and __metadata__), reading only its first bytes. */
export function readSafetensorsHeader(file: string): Record<string, unknown> {
  const fd = openSync(file, 'r');
  try {
    const len = Buffer.alloc(8);
    if (readSync(fd, len, 0, 8, 0) !== 8) throw new ConfigError(`${file}: too short for a safetensors header`);
    const n = Number(len.readBigUInt64LE(0));
    if (!(n > 0 && n < 1e9)) throw new ConfigError(`${file}: header length ${n} is not plausible`);
    const buf = Buffer.alloc(n);
    readSync(fd, buf, 0, n, 8);
    const h: unknown = JSON.parse(buf.toString('utf8'));
    if (!h || typeof h !== 'object' || Array.isArray(h)) throw new ConfigError(`${file}: header must be a JSON object`);
    return h as Record<string, unknown>;
  } catch (e) {
    if (e instanceof SyntaxError) throw new ConfigError(`${file}: header is not valid JSON (${e.message})`);
    throw e;
  } finally {
    closeSync(fd);
  }
}

/**
 * Tensor layout and stored dtype of a model directory's weights (model.safetensors, or the index
 * and its first shard): the dtype is the weights file's `source_dtype` metadata when present (a
 * checkpoint trained in f32 from a bf16 model keeps saying bf16), else the tensors' one float
 * dtype (float32 when they mix). Null when the directory has no safetensors weights.
 */
export function weightsLayoutOf(dir: string): { layout: TensorLayout; dtype: HfDtype } | null {
  const single = path.join(dir, 'model.safetensors'),
    index = path.join(dir, 'model.safetensors.index.json');
  let names: string[];
  let first: string;
  if (existsSync(single)) {
    first = single;
    names = [];
  } else if (existsSync(index)) {
    let map: Record<string, unknown>;
    try {
      map = (JSON.parse(readFileSync(index, 'utf8')) as { weight_map?: Record<string, unknown> }).weight_map ?? {};
    } catch {
      return null; // the loader says what is wrong with the index
    }
    names = Object.keys(map);
    const shard = Object.values(map)[0];
    if (typeof shard !== 'string' || !existsSync(path.join(dir, shard))) return null;
    first = path.join(dir, shard);
  } else return null;
  const header = readSafetensorsHeader(first);
  const meta = (header.__metadata__ ?? {}) as Record<string, unknown>;
  const entries = Object.entries(header).filter(([k]) => k !== '__metadata__');
  if (!names.length) names = entries.map(([k]) => k);
  const floats = new Set(
    entries.map(([, v]) => DTYPE_OF[String((v as { dtype?: unknown }).dtype)]).filter((d): d is HfDtype => !!d),
  );
  const src = typeof meta.source_dtype === 'string' ? meta.source_dtype : null;
  const dtype: HfDtype =
    src && (Object.values(DTYPE_OF) as string[]).includes(src)
      ? (src as HfDtype)
      : floats.size === 1
        ? [...floats][0]
        : 'float32';
  return { layout: layoutOf(names), dtype };
}
