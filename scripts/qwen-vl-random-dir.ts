/**
 * Writes a random-weight Qwen2.5-VL (or Qwen2-VL) model directory in Hugging Face's layout, with
 * the real Qwen tokenizer (devkit/qwen-vl-dir.ts): for trying the vision-language path without a
 * download, and for benchmarks at a real shape.
 *
 *   node --import tsx scripts/qwen-vl-random-dir.ts OUT_DIR [--shape tiny|3b] [--model-type qwen2_5_vl|qwen2_vl] [--seed N]
 */
import { writeQwenVlDir } from '../devkit/qwen-vl-dir.ts';

const args = process.argv.slice(2);
const flag = (name: string, dflt: string): string => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : dflt;
};
const out = args.find((a, i) => !a.startsWith('--') && (i === 0 || !args[i - 1].startsWith('--')));
const shape = flag('shape', 'tiny');
const modelType = flag('model-type', 'qwen2_5_vl');
const seed = Number(flag('seed', '1'));
if (
  !out ||
  !['tiny', '3b'].includes(shape) ||
  !['qwen2_5_vl', 'qwen2_vl'].includes(modelType) ||
  !Number.isInteger(seed) ||
  (shape === '3b' && modelType !== 'qwen2_5_vl')
) {
  process.stderr.write(
    'usage: qwen-vl-random-dir.ts OUT_DIR [--shape tiny|3b] [--model-type qwen2_5_vl|qwen2_vl] [--seed N] (3b: qwen2_5_vl only)\n',
  );
  process.exit(2);
}
const { config } = writeQwenVlDir(out, {
  shape: shape as 'tiny' | '3b',
  modelType: modelType as 'qwen2_5_vl' | 'qwen2_vl',
  seed,
});
process.stdout.write(
  `wrote ${out} (${config.modelType}, ${config.numHiddenLayers} layers, hidden ${config.hiddenSize})\n`,
);
