/**
 * What the calculator's SFT learns, position by position (docs/agents.md, "Calculator: measured"):
 *
 *   node --import tsx examples/calculator/diagnose.ts [--steps 768] [--every 64] [--rows 16384] [-o key=value ...]
 *
 * Trains the model of sft.yaml (its keys, overridden by -o) on `rows` tool-call demonstrations
 * (problems of seed 1), without writing a run, and prints every `every` steps the held-out
 * (256 problems of seed 2) teacher-forced probability of the right token, averaged over each
 * segment of a demonstration's loss positions: the call's constant text before the operands, each
 * operand digit, the operator, the call's closing (with its EOS), and the reply (calc's answer
 * copied, then EOS). At the end: how many of 100 greedy first turns call calc with the prompt's
 * expression, and the largest difference between the sampler's log-probs of 32 second-turn
 * continuations (prompts of different lengths, left-padded in one batch) and the trainer's
 * recomputation of them (right-padded): positions that disagree between the two would show here.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { sftModelConfig } from '../../app/sft.ts';
import { loadConfig } from '../../lib/config/index.ts';
import { Sampler } from '../../lib/model/sample.ts';
import { createTrainer } from '../../lib/model/train.ts';
import { lrAt } from '../../lib/optim/lr-schedule.ts';
import { tokenizerFor } from '../../lib/pipeline/policy.ts';
import { trainerSettings } from '../../lib/pipeline/trainer-settings.ts';
import { loadSftExamples } from '../../lib/sft/data.ts';
import { collate, sftBatchIndices, type SftExample } from '../../lib/sft/logic.ts';
import { generateProblems, toolDemonstration, type Problem } from './problems.ts';

const { values: a } = parseArgs({
  options: {
    steps: { type: 'string', default: '768' },
    every: { type: 'string', default: '64' },
    rows: { type: 'string', default: '16384' },
    o: { type: 'string', multiple: true, default: [] },
  },
});
const dir = join(tmpdir(), `calculator-diagnose-${process.pid}`);
mkdirSync(dir, { recursive: true });
const lines = (rows: unknown[]) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
const heldOut = generateProblems(256, 2);
writeFileSync(
  join(dir, 'train.jsonl'),
  lines(generateProblems(Number(a.rows), 1).map((p) => ({ messages: toolDemonstration(p) }))),
);
writeFileSync(join(dir, 'held-out.jsonl'), lines(heldOut.map((p) => ({ messages: toolDemonstration(p) }))));
const configFor = (file: string) =>
  loadConfig({
    file: join(import.meta.dirname, 'sft.yaml'),
    command: 'sft',
    overrides: [`data.train_files=${join(dir, file)}`, `trainer.run_dir=${join(dir, 'run')}`, ...a.o],
  });
const cfg = configFor('train.jsonl');
const tok = tokenizerFor(cfg);
const model = sftModelConfig(cfg, tok);
const train = (await loadSftExamples(cfg, tok)).examples;
const held = (await loadSftExamples(configFor('held-out.jsonl'), tok)).examples;

const SEGMENTS = [
  'call text',
  'op1[0]',
  'op1[1]',
  'op1[2]',
  'operator',
  'op2[0]',
  'op2[1]',
  'op2[2]',
  'call end',
  'reply',
];

/** The loss positions of a demonstration by segment (the expression is found inside the call). */
function segments(e: SftExample, p: Problem): Map<string, number[]> {
  const text = Array.from(e.tokens, (t) => (t < 256 ? String.fromCharCode(t) : '\u0001')).join('');
  const exprAt = text.indexOf(`"${p.expression}"`, text.indexOf('<tool_call>')) + 1;
  const callEos = text.indexOf('\u0001', exprAt);
  const out = new Map<string, number[]>(SEGMENTS.map((k) => [k, []]));
  for (let i = 0; i < e.tokens.length; i++) {
    if (!e.mask[i]) continue;
    const j = i - exprAt;
    const k =
      j < 0
        ? 'call text'
        : j < 3
          ? `op1[${j}]`
          : j === 3
            ? 'operator'
            : j < 7
              ? `op2[${j - 4}]`
              : i <= callEos
                ? 'call end'
                : 'reply';
    out.get(k)!.push(i);
  }
  return out;
}
const heldSegments = held.map((e, i) => segments(e, heldOut[i]));
const settings = trainerSettings(cfg).actor;
const trainer = createTrainer({ ...settings.trainer, model, loss: { type: 'sft' } });
const cpuSeconds = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
};

async function report(step: number): Promise<void> {
  const batch = collate(held, tok.pad);
  const { perToken } = await trainer.evaluate(batch);
  const sum = new Map<string, { p: number; n: number }>(SEGMENTS.map((k) => [k, { p: 0, n: 0 }]));
  heldSegments.forEach((seg, r) => {
    for (const [k, idx] of seg)
      for (const i of idx) {
        sum.get(k)!.p += Math.exp(perToken[r * batch.seqLen + i]);
        sum.get(k)!.n++;
      }
  });
  const cols = SEGMENTS.map((k) => `${k} ${(sum.get(k)!.p / Math.max(1, sum.get(k)!.n)).toFixed(2)}`);
  console.log(`step ${String(step).padStart(4)}  ${cols.join('  ')}  (${cpuSeconds().toFixed(0)} CPU s)`);
}

const steps = Number(a.steps);
const plan = {
  units: train.length,
  batchSize: cfg.actor.global_batch_size,
  epochs: Math.ceil((steps * cfg.actor.global_batch_size) / train.length),
  maxSteps: steps,
  shuffle: cfg.data.shuffle,
  seed: cfg.data.seed,
};
await report(0);
for (let s = 1; s <= steps; s++) {
  const batch = collate(
    sftBatchIndices(plan, s).map((i) => train[i]),
    tok.pad,
  );
  await trainer.step(batch, lrAt(settings.schedule, s, steps));
  if (s % Number(a.every) === 0 || s === steps) await report(s);
}

const sampler = new Sampler(model, { threads: cfg.actor.threads });
const weights = trainer.getWeights();
const first = await sampler.generate(
  weights,
  heldOut.slice(0, 100).map((p, i) => ({ id: `h${i}`, prompt: tok.encode(p.prompt, { addSpecialTokens: true }) })),
  { maxNewTokens: 80, temperature: 0 },
);
const right = first.filter((g, i) => tok.decode(g.tokens).includes(`"expression":"${heldOut[i].expression}"`)).length;
console.log(`greedy first turns calling calc with the prompt's expression: ${right}/100`);

// second turns: the first turn (closed by EOS) and a tool answer of varying length, left-padded together
const second = heldOut.slice(0, 32).map((p, i) => {
  const ids = [...tok.encode(p.prompt, { addSpecialTokens: true }), ...first[i].tokens];
  if (ids[ids.length - 1] !== tok.eos) ids.push(tok.eos);
  ids.push(...tok.encode(String(BigInt(p.answer) * BigInt(i + 1))));
  return { id: `s${i}`, prompt: Int32Array.from(ids) };
});
const cont = await sampler.generate(weights, second, { maxNewTokens: 8, temperature: 1, seed: 3 });
const rows = second.map((r, i) => ({
  tokens: Int32Array.from([...r.prompt, ...cont[i].tokens]),
  mask: Uint8Array.from([
    ...new Array<number>(r.prompt.length).fill(0),
    ...new Array<number>(cont[i].tokens.length).fill(1),
  ]),
  source: r.id,
}));
const scored = collate(rows, tok.pad);
const { perToken } = await trainer.evaluate(scored);
let maxDiff = 0;
rows.forEach((_, i) =>
  cont[i].logprobs.forEach((lp, t) => {
    maxDiff = Math.max(maxDiff, Math.abs(perToken[i * scored.seqLen + second[i].prompt.length + t] - lp));
  }),
);
const lens = second.map((r) => r.prompt.length);
console.log(
  `sampler vs trainer log-probs of ${rows.length} continuations (prompts ${Math.min(...lens)}–${Math.max(...lens)} tokens, left-padded together): max |difference| ${maxDiff.toExponential(2)}`,
);
