/**
 * The calculator example's problems (deterministic by seed): `a*b=`, `a+b=` or `a-b=` with
 * three-digit a and b; the answer is the integer result. Demonstrations for the SFT warm start: with
 * the tool (a `calc` call in the run's tool-call format, the tool's answer, then the result) and
 * without it (the result directly, for the no-tool control).
 */
import { Rng } from '../../lib/util/rng.ts';
import { formatToolCall } from '../../lib/env/tool-calls.ts';
import { calc } from './calc.ts';

export interface Problem {
  prompt: string;
  answer: string;
  expression: string;
}

const OPS = ['*', '+', '-'] as const;

export function generateProblems(count: number, seed: number): Problem[] {
  const rng = Rng.fromSeed(`calculator:${seed}`);
  return Array.from({ length: count }, () => {
    const a = 100 + rng.int(900);
    const b = 100 + rng.int(900);
    const op = OPS[rng.int(OPS.length)];
    const expression = `${a}${op}${b}`;
    return { prompt: `${expression}=`, answer: calc({ expression }), expression };
  });
}

/** The conversation a tool-using policy should have: call, the tool's answer, the result. */
export function toolDemonstration(p: Problem, format = 'hermes') {
  return [
    { role: 'user', content: p.prompt },
    { role: 'assistant', content: formatToolCall(format, { name: 'calc', arguments: { expression: p.expression } }) },
    { role: 'tool', content: p.answer },
    { role: 'assistant', content: p.answer },
  ];
}
