import { existsSync, rmdirSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { makeDirs } from '../../../lib/util/make-dirs.ts';
import { join, resolve } from 'node:path';
import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import {
  isAdapterDir,
  loadAdapter,
  loadCheckpoint,
  saveCheckpoint,
  type AdapterCheckpoint,
  type Checkpoint,
} from '../../../lib/model/checkpoint.ts';
import type { Weights } from '../../../lib/model/params.ts';
import { mergeLoraOnnx } from '../../../lib/model/lora-merge.ts';
import type { HfDtype } from '../../../lib/model/config.ts';
import { paramCount } from '../../../lib/model/params.ts';
import { ConfigError } from '../../../lib/errors.ts';

const DTYPES: Record<string, HfDtype> = { bf16: 'bfloat16', f16: 'float16', f32: 'float32' };
const SHORT = (d: HfDtype) => Object.keys(DTYPES).find((k) => DTYPES[k] === d)!;

/**
 * The model directory inside `dir`: a run checkpoint (checkpoints/global_step_N) keeps the policy
 * in actor/; a policy version or any model directory is one itself.
 */
export function modelDirOf(dir: string): string {
  const d = resolve(dir);
  if (!existsSync(d)) throw new ConfigError(`${dir} does not exist`);
  if (
    existsSync(join(d, 'trainer_state.json')) &&
    (existsSync(join(d, 'actor', 'config.json')) || isAdapterDir(join(d, 'actor')))
  )
    return join(d, 'actor');
  return d;
}

/**
 * `rlstream export <checkpoint> --out DIR [--dtype bf16|f16|f32]`: a Hugging Face model directory
 * without optimizer state, in the source's tensor layout and (by default) stored dtype.
 */
export const exportCommand: Command = {
  name: 'export',
  summary: 'Write a checkpoint or policy version as a Hugging Face model directory (no optimizer state)',
  usage: 'rlstream export <checkpoint-dir> --out DIR [--dtype bf16|f16|f32] [--merge [--base DIR]]',
  help: [
    'Reads a run checkpoint (<run_dir>/checkpoints/global_step_N: its actor/), a policy version',
    '(<run_dir>/policy/vNNNNNN) or any model directory, and writes DIR with config.json (the source',
    "model's keys, the stored dtype stated), generation_config.json, model.safetensors (the source's",
    "tensor names and tying) and the source's tokenizer files: transformers and vLLM load it as is.",
    '',
    'options:',
    '  --out DIR        directory to create (must not exist)',
    "  --dtype D        stored dtype: bf16, f16 or f32 (default: the source model's, so a bf16 model trained",
    '                   here is written bf16 again; bf16 and f16 round to nearest even)',
    '  --merge          the source is a LoRA adapter (PEFT adapter_config.json + adapter_model.safetensors,',
    '                   as a LoRA run writes): write the merged model, W + (alpha / r)·B·A per adapted layer',
    "  --base DIR       the base model the adapter was trained on (default: the adapter's",
    '                   base_model_name_or_path)',
  ].join('\n'),
  async run(argv) {
    const { positionals, flags, booleans } = parseArgs(argv, { flags: ['out', 'dtype', 'base'], booleans: ['merge'] });
    if (positionals.length !== 1) throw new UsageError(`expected one checkpoint directory, got ${positionals.length}`);
    if (!flags.out) throw new UsageError('--out DIR is required');
    const asked = flags.dtype === undefined ? null : DTYPES[flags.dtype];
    if (asked === undefined)
      throw new UsageError(`--dtype must be one of ${Object.keys(DTYPES).join(', ')}, got "${flags.dtype}"`);
    const src = modelDirOf(positionals[0]);
    if (existsSync(flags.out)) throw new ConfigError(`--out ${flags.out} already exists; give a new directory`);
    // the directory can be created there (says why not), then is written whole under a temporary name
    rmdirSync(makeDirs(flags.out, 'the export directory (--out)'));
    if (isAdapterDir(src) || booleans.has('merge')) {
      if (!isAdapterDir(src))
        throw new ConfigError(
          `--merge: ${src} is not a LoRA adapter (no adapter_config.json); export it without --merge`,
        );
      if (!booleans.has('merge'))
        throw new ConfigError(
          `${src} is a LoRA adapter (PEFT layout, loadable with peft as it is); pass --merge to write the merged model`,
        );
      const { base, baseDir, adapter, weights } = await loadMergedAdapter(src, flags.base);
      const dtype = asked ?? base.config.storedDtype ?? 'float32';
      await saveCheckpoint(flags.out, base.config, weights, {
        dtype,
        assetsFrom: baseDir,
        metadata: adapter.metadata.policy_version ? { policy_version: adapter.metadata.policy_version } : {},
      });
      process.stdout.write(
        `merged ${src} (LoRA rank ${adapter.lora.rank} on ${adapter.lora.targetModules.join(', ')}) into ${baseDir} → ${resolve(flags.out)} (${(paramCount(base.config) / 1e6).toFixed(2)}M parameters, ${SHORT(dtype)})\n`,
      );
      return 0;
    }
    const ck = await loadCheckpoint(src, { optimizer: false });
    const dtype = asked ?? ck.config.storedDtype ?? 'float32';
    await saveCheckpoint(flags.out, ck.config, ck.weights, {
      dtype,
      assetsFrom: src,
      metadata: ck.metadata.policy_version ? { policy_version: ck.metadata.policy_version } : {},
    });
    process.stdout.write(
      `exported ${src} → ${resolve(flags.out)} (${ck.config.modelType}, ${(paramCount(ck.config) / 1e6).toFixed(2)}M parameters, ${SHORT(dtype)})\n`,
    );
    return 0;
  },
};

/** A LoRA adapter directory merged into its base (--base, else base_model_name_or_path). */
export async function loadMergedAdapter(
  src: string,
  baseFlag: string | undefined,
): Promise<{ base: Checkpoint; baseDir: string; adapter: AdapterCheckpoint; weights: Weights }> {
  const baseDir = await baseOf(src, baseFlag);
  const base = await loadCheckpoint(baseDir, { optimizer: false });
  // an adapter whose shapes or modules do not fit the base is one line naming the tensor
  const adapter = await loadAdapter(src, base.config, { optimizer: false });
  return {
    base,
    baseDir,
    adapter,
    weights: await mergeLoraOnnx(base.config, adapter.lora, base.weights, adapter.adapter),
  };
}

/** The base model directory of an adapter: --base, else its adapter_config.json base_model_name_or_path. */
async function baseOf(adapterDir: string, base: string | undefined): Promise<string> {
  if (base) return modelDirOf(base);
  const j = JSON.parse(await readFile(join(adapterDir, 'adapter_config.json'), 'utf8')) as {
    base_model_name_or_path?: unknown;
  };
  const p = typeof j.base_model_name_or_path === 'string' ? j.base_model_name_or_path : null;
  if (!p || !existsSync(p))
    throw new ConfigError(
      `${adapterDir}/adapter_config.json names base model ${JSON.stringify(p)}, which is not a directory here; pass --base DIR (the model the adapter was trained on)`,
    );
  return modelDirOf(p);
}
