/**
 * The guess-number environment's shaping (each guess earns the bits of the range it removes ÷ 4)
 * and its no-feedback control (`?` for every wrong guess, no shaping); the binary-search
 * and random-guess demonstrations of the SFT warm starts, played against the environment; guesses
 * written as one letter (kwargs.letters).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { start, step } from '../../../examples/guess-number/env.ts';
import { binarySearchEpisode, randomGuessEpisode } from '../../../examples/guess-number/demonstrations.ts';
import { Rng } from '../../../lib/util/rng.ts';

const row = (kwargs: Record<string, unknown>) => ({ ground_truth: '11', extra_info: { secret: 11 }, kwargs });

test('shaping: bisection earns 1/4 per halving, a guess outside the range earns nothing, a solved search earns 1 + 1 in total', () => {
  const s = start(row({ shaping: 1 }));
  const a = step(s, { content: '8' }); // 1..16 → 9..16
  assert.deepEqual([a.messages[0]?.content, a.reward, a.done], ['>', 0.25, false]);
  const b = step(s, { content: '3' }); // outside 9..16: no information
  assert.deepEqual([b.messages[0]?.content, b.reward], ['>', 0]);
  const c = step(s, { content: '12' }); // 9..16 → 9..11
  assert.ok(Math.abs(c.reward - (3 - Math.log2(3)) / 4) < 1e-12);
  const d = step(s, { content: '11' }); // 3 left → solved
  assert.ok(Math.abs(d.reward - (1 + Math.log2(3) / 4)) < 1e-12);
  assert.equal(d.done, true);
  assert.deepEqual(d.metrics, { solved: 1, guesses: 4, accuracy: 1 });
  assert.ok(Math.abs(a.reward + b.reward + c.reward + d.reward - 2) < 1e-12);
  assert.throws(() => start(row({ shaping: -1 })), /kwargs.shaping must be a number ≥ 0/);
});

test('no shaping by default; feedback false answers ? and gives only the success reward', () => {
  const plain = start(row({}));
  assert.deepEqual(step(plain, { content: '8' }), {
    messages: [{ role: 'user', content: '>' }],
    reward: 0,
    done: false,
    metrics: { accuracy: 0 },
  });
  const blind = start(row({ feedback: false, shaping: 1 }));
  const a = step(blind, { content: '8' });
  assert.deepEqual([a.messages[0]?.content, a.reward], ['?', 0]);
  assert.equal(step(blind, { content: '11' }).reward, 1);
});

test("binary-search demonstrations: the answers are the environment's, every secret is found in ≤ 5 guesses, 3.375 on average", () => {
  let total = 0;
  for (let secret = 1; secret <= 16; secret++) {
    const msgs = binarySearchEpisode(secret);
    assert.deepEqual(msgs[0], { role: 'user', content: ':' });
    const s = start({ ground_truth: String(secret), extra_info: { secret } });
    const guesses = msgs.filter((m) => m.role === 'assistant');
    for (let i = 1; i < msgs.length; i += 2) {
      const r = step(s, msgs[i]);
      if (i + 1 < msgs.length) assert.deepEqual([r.messages[0].content, r.done], [msgs[i + 1].content, false]);
      else assert.equal(r.done, true, `secret ${secret}: the last guess is right`);
    }
    assert.ok(guesses.length <= 5);
    total += guesses.length;
  }
  assert.equal(total / 16, 3.375);
  assert.throws(() => binarySearchEpisode(17), /integer in 1\.\.16/);
});

test('letters: A = 1 … P = 16; a digit or a letter past P is not a guess', () => {
  const s = start(row({ letters: true, shaping: 1 }));
  assert.deepEqual([step(s, { content: 'H' }).messages[0]?.content], ['>']); // 8
  assert.deepEqual([step(s, { content: '12' }).messages[0]?.content], ['?']);
  assert.deepEqual([step(s, { content: 'Q' }).messages[0]?.content], ['?']);
  const done = step(s, { content: 'K' }); // 11
  assert.deepEqual([done.done, done.metrics], [true, { solved: 1, guesses: 4, accuracy: 1 }]);
  assert.equal(step(start(row({})), { content: 'K' }).messages[0]?.content, '?');
});

test("random-guess demonstrations: the environment's answers, at most 6 guesses, the last right or the sixth", () => {
  const rng = Rng.fromSeed('random-guesses-test');
  const counts = new Map<string, number>();
  for (let k = 0; k < 200; k++) {
    const secret = 1 + (k % 16);
    const msgs = randomGuessEpisode(secret, rng);
    const s = start({ ground_truth: String(secret), extra_info: { secret } });
    const guesses = msgs.filter((m) => m.role === 'assistant');
    assert.ok(guesses.length >= 1 && guesses.length <= 6);
    for (const g of guesses) counts.set(g.content, (counts.get(g.content) ?? 0) + 1);
    for (let i = 1; i < msgs.length; i += 2) {
      const r = step(s, msgs[i]);
      if (i + 1 < msgs.length) assert.deepEqual([r.messages[0].content, r.done], [msgs[i + 1].content, false]);
      else assert.ok(r.done || guesses.length === 6, `secret ${secret}: ends right or after 6 guesses`);
    }
  }
  assert.equal(counts.size, 16, 'every number 1..16 is guessed');
  assert.throws(() => randomGuessEpisode(0, rng), /integer in 1\.\.16/);
});
