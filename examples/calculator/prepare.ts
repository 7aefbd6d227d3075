/**
 * Prepares the calculator example (examples/calculator/README.md):
 *
 *   node --import tsx examples/calculator/prepare.ts [--out DIR] [--sft N] [--rl N] [--heldout N]
 *
 * writes into DIR (default examples/calculator/data):
 *   sft-tool.jsonl    {messages}: call calc, the tool's answer, the result (rlstream sft, with the tool)
 *   sft-direct.jsonl  {prompt, response}: the result directly (rlstream sft, the no-tool control)
 *   rl.jsonl          other problems {prompt, answer} (rlstream train, GRPO)
 *   heldout.jsonl     problems of another seed that are in neither file above {prompt, answer} (validation)
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { generateProblems, toolDemonstration, type Problem } from './problems.ts';

const { values } = parseArgs({
  options: {
    out: { type: 'string', default: join(import.meta.dirname, 'data') },
    sft: { type: 'string', default: '16384' },
    rl: { type: 'string', default: '4096' },
    heldout: { type: 'string', default: '200' },
  },
});
const out = resolve(values.out);
mkdirSync(out, { recursive: true });
const train = generateProblems(Number(values.sft) + Number(values.rl), 1);
const seen = new Set(train.map((p) => p.expression));
const heldout = generateProblems(Number(values.heldout) * 2, 2)
  .filter((p) => !seen.has(p.expression))
  .slice(0, Number(values.heldout));
const sft = train.slice(0, Number(values.sft));
const rl = train.slice(Number(values.sft));
const lines = (rows: unknown[]) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
const qa = (ps: Problem[]) => ps.map((p) => ({ prompt: p.prompt, answer: p.answer }));
writeFileSync(join(out, 'sft-tool.jsonl'), lines(sft.map((p) => ({ messages: toolDemonstration(p) }))));
writeFileSync(join(out, 'sft-direct.jsonl'), lines(sft.map((p) => ({ prompt: p.prompt, response: p.answer }))));
writeFileSync(join(out, 'rl.jsonl'), lines(qa(rl)));
writeFileSync(join(out, 'heldout.jsonl'), lines(qa(heldout)));
console.log(`wrote ${sft.length} demonstrations, ${rl.length} RL rows, ${heldout.length} held-out rows to ${out}`);
