import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import { loadCheckpoint, saveCheckpoint } from '../../model/checkpoint.ts';
import type { HfDtype } from '../../model/config.ts';
import { paramCount } from '../../model/params.ts';
import { ConfigError } from '../../errors.ts';

const DTYPES: Record<string, HfDtype> = { bf16: 'bfloat16', f16: 'float16', f32: 'float32' };

/**
 * The model directory inside `dir`: a run checkpoint (checkpoints/global_step_N) keeps the policy
 * in actor/; a policy version or any model directory is one itself.
 */
export function modelDirOf(dir: string): string {
  const d = resolve(dir);
  if (!existsSync(d)) throw new ConfigError(`${dir} does not exist`);
  if (existsSync(join(d, 'trainer_state.json')) && existsSync(join(d, 'actor', 'config.json'))) return join(d, 'actor');
  return d;
}

/** `rlstream export <checkpoint> --out DIR [--dtype bf16|f16|f32]`: a Hugging Face model directory without optimizer state. */
export const exportCommand: Command = {
  name: 'export',
  summary: 'Write a checkpoint or policy version as a Hugging Face model directory (no optimizer state)',
  usage: 'rlstream export <checkpoint-dir> --out DIR [--dtype bf16|f16|f32]',
  help: [
    'Reads a run checkpoint (<run_dir>/checkpoints/global_step_N: its actor/), a policy version',
    '(<run_dir>/policy/vNNNNNN) or any model directory, and writes DIR with config.json (the source',
    'model\'s keys, the stored dtype stated), generation_config.json, model.safetensors (the source\'s',
    'tensor names and tying) and the source\'s tokenizer files: transformers and vLLM load it as is.',
    '',
    'options:',
    '  --out DIR        directory to create (must not exist)',
    '  --dtype D        stored dtype: bf16, f16 or f32 (default f32, the training precision; bf16 and f16',
    '                   round to nearest even)',
  ].join('\n'),
  async run(argv) {
    const { positionals, flags } = parseArgs(argv, { flags: ['out', 'dtype'] });
    if (positionals.length !== 1) throw new UsageError(`expected one checkpoint directory, got ${positionals.length}`);
    if (!flags.out) throw new UsageError('--out DIR is required');
    const dtype = DTYPES[flags.dtype ?? 'f32'];
    if (!dtype) throw new UsageError(`--dtype must be one of ${Object.keys(DTYPES).join(', ')}, got "${flags.dtype}"`);
    const src = modelDirOf(positionals[0]);
    if (existsSync(flags.out)) throw new ConfigError(`--out ${flags.out} already exists; give a new directory`);
    const ck = await loadCheckpoint(src, { optimizer: false });
    await saveCheckpoint(flags.out, ck.config, ck.weights, { dtype, assetsFrom: src, metadata: ck.metadata.policy_version ? { policy_version: ck.metadata.policy_version } : {} });
    process.stdout.write(`exported ${src} → ${resolve(flags.out)} (${ck.config.modelType}, ${(paramCount(ck.config) / 1e6).toFixed(2)}M parameters, ${flags.dtype ?? 'f32'})\n`);
    return 0;
  },
};
