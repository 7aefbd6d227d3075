/**
 * Binary-search demonstrations for the SFT warm start of the guess-number example
 * (examples/guess-number-sft.yaml → examples/guess-number-sft-rl.yaml; docs/agents.md):
 *
 *   node --import tsx examples/guess-number/demonstrations.ts [--out FILE] [--rows N]
 *
 * writes FILE (default examples/guess-number/data/sft.jsonl): one conversation per training row of
 * data.task guess_number (data.seed 1, the RL run's training secrets), `{messages}`: the prompt
 * `:`, then each guess the midpoint ⌊(lo + hi) / 2⌋ of the secrets still possible, answered `>`
 * or `<` as env.ts answers, until the guess is the secret (at most 5 guesses, 3.375 on average
 * over 1..16).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { tasks } from '../../lib/tasks/index.ts';

export interface Message {
  role: 'user' | 'assistant';
  content: string;
}

/** The binary search for `secret` in 1..16 as a conversation (prompt, guesses, answers). */
export function binarySearchEpisode(secret: number): Message[] {
  if (!Number.isInteger(secret) || secret < 1 || secret > 16)
    throw new RangeError(`the secret must be an integer in 1..16, got ${secret}`);
  const messages: Message[] = [{ role: 'user', content: ':' }];
  let lo = 1,
    hi = 16;
  for (;;) {
    const guess = Math.floor((lo + hi) / 2);
    messages.push({ role: 'assistant', content: String(guess) });
    if (guess === secret) return messages;
    if (guess < secret) lo = guess + 1;
    else hi = guess - 1;
    messages.push({ role: 'user', content: guess < secret ? '>' : '<' });
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      out: { type: 'string', default: join(import.meta.dirname, 'data', 'sft.jsonl') },
      rows: { type: 'string', default: '4096' },
    },
  });
  const rows = tasks.get('guess_number').generate(Number(values.rows), 1);
  const out = resolve(values.out);
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(
    out,
    rows.map((r) => JSON.stringify({ messages: binarySearchEpisode(Number(r.answer)) })).join('\n') + '\n',
  );
  console.log(`wrote ${rows.length} binary-search demonstrations to ${out}`);
}
