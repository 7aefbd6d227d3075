/**
 * Demonstrations for the SFT warm starts of the guess-number example (docs/agents.md):
 *
 *   node --import tsx examples/guess-number/demonstrations.ts [--kind binary|random] [--out FILE] [--rows N]
 *
 * writes FILE: one conversation per training row of data.task guess_number (data.seed 1, the RL
 * run's training secrets), `{messages}`: the prompt `:`, then guesses answered `>` or `<` as
 * env.ts answers, until the guess is the secret.
 *  - `binary` (default; data/sft.jsonl, examples/guess-number-sft.yaml): each guess the midpoint
 *    ⌊(lo + hi) / 2⌋ of the secrets still possible (at most 5 guesses, 3.375 on average over
 *    1..16): the search itself.
 *  - `random` (data/random.jsonl; the format warm start of docs/agents.md): each guess a number
 *    drawn uniformly from 1..16 whatever the answers said, at most 6: how to write every guess,
 *    and nothing of the search (no guess depends on an answer).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { tasks } from '../../lib/tasks/index.ts';
import { Rng } from '../../lib/util/rng.ts';

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

/** Uniformly random guesses in 1..16 for `secret`, answered as env.ts answers, until right or after `maxGuesses`. */
export function randomGuessEpisode(secret: number, rng: Rng, maxGuesses = 6): Message[] {
  if (!Number.isInteger(secret) || secret < 1 || secret > 16)
    throw new RangeError(`the secret must be an integer in 1..16, got ${secret}`);
  const messages: Message[] = [{ role: 'user', content: ':' }];
  for (let k = 0; k < maxGuesses; k++) {
    const guess = 1 + rng.int(16);
    messages.push({ role: 'assistant', content: String(guess) });
    if (guess === secret) return messages;
    messages.push({ role: 'user', content: guess < secret ? '>' : '<' });
  }
  return messages;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      kind: { type: 'string', default: 'binary' },
      out: { type: 'string' },
      rows: { type: 'string', default: '4096' },
    },
  });
  const rng = Rng.fromSeed('guess-number-random-guesses');
  const kinds: Record<string, { file: string; episode: (secret: number) => Message[] }> = {
    binary: { file: 'sft.jsonl', episode: binarySearchEpisode },
    random: { file: 'random.jsonl', episode: (secret) => randomGuessEpisode(secret, rng) },
  };
  const kind = kinds[values.kind];
  if (!kind) throw new Error(`--kind must be one of ${Object.keys(kinds).join(', ')}, got ${values.kind}`);
  const rows = tasks.get('guess_number').generate(Number(values.rows), 1);
  const out = resolve(values.out ?? join(import.meta.dirname, 'data', kind.file));
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, rows.map((r) => JSON.stringify({ messages: kind.episode(Number(r.answer)) })).join('\n') + '\n');
  console.log(`wrote ${rows.length} ${values.kind} demonstrations to ${out}`);
}
