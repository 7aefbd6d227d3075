import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generateProblems, splitOf, stepFacts, TEMPLATE_TEXTS } from '../../../examples/word-problems/problems.ts';

/** Evaluates the solution's lines "x op y = z" and returns z of the last one. */
function checkSolution(solution: string): number {
  const lines = solution.split('\n');
  const answer = /^#### (-?\d+)$/.exec(lines.pop()!);
  assert.ok(answer, `ends with "#### n": ${solution}`);
  let last = NaN;
  for (const l of lines) {
    const m = /^(\d+) ([+\-*]) (\d+) = (-?\d+)$/.exec(l);
    assert.ok(m, `a step is "a op b = c": ${l}`);
    const [a, b, c] = [Number(m[1]), Number(m[3]), Number(m[4])];
    assert.equal(m[2] === '+' ? a + b : m[2] === '-' ? a - b : a * b, c, l);
    last = c;
  }
  assert.equal(Number(answer[1]), last);
  return last;
}

test('word problems: deterministic by seed, worked solutions whose arithmetic is right and end in #### answer', () => {
  const a = generateProblems('train', 300, 5),
    b = generateProblems('train', 300, 5);
  assert.deepEqual(a, b);
  assert.notDeepEqual(generateProblems('train', 50, 6), a.slice(0, 50));
  for (const p of [...a, ...generateProblems('heldout', 100, 5)]) {
    assert.equal(String(checkSolution(p.solution)), p.answer);
    assert.ok(Number(p.answer) >= 0, 'small non-negative integers');
    assert.ok(!p.prompt.includes('{'), p.prompt);
  }
});

test('the held-out split uses other templates and other operand tuples than the training split', () => {
  assert.equal(TEMPLATE_TEXTS.train.filter((t) => TEMPLATE_TEXTS.heldout.includes(t)).length, 0);
  // a story's numbers (in order) identify its operand tuple; none is shared between the splits
  const nums = (s: string) => (s.match(/\d+/g) ?? []).join(',');
  const train = new Set(
    generateProblems('train', 2000, 1).map((p) => `${p.solution.split('\n')[0].match(/[+\-*]/)![0]}:${nums(p.prompt)}`),
  );
  const held = generateProblems('heldout', 300, 1).map(
    (p) => `${p.solution.split('\n')[0].match(/[+\-*]/)![0]}:${nums(p.prompt)}`,
  );
  assert.equal(held.filter((k) => train.has(k)).length, 0);
  assert.equal(splitOf('add', [3, 4]), splitOf('add', [3, 4]));
  const tuples = Array.from({ length: 729 }, (_, i) => [
    1 + (i % 9),
    1 + (Math.floor(i / 9) % 9),
    1 + Math.floor(i / 81),
  ]).filter(([a, b, c]) => c < a + b);
  const heldFrac = tuples.filter((t) => splitOf('add_sub', t) === 'heldout').length / tuples.length;
  assert.ok(heldFrac > 0.1 && heldFrac < 0.3, `about one tuple in five is held out (${heldFrac})`);
});

test('each single arithmetic fact of a held-out solution (a line "x op y = z") occurs in the training split', () => {
  const facts = (n: number) => new Set(generateProblems('train', n, 1).flatMap((p) => stepFacts(p.solution)));
  const trainFacts = facts(40000);
  const held = generateProblems('heldout', 300, 1);
  const missing = held.flatMap((p) => stepFacts(p.solution)).filter((f) => !trainFacts.has(f));
  assert.deepEqual(missing, []);
  // the prepared SFT file's 8192 training problems hold nearly all of them (a fact like 17 - 5 = 12 arises from few tuples)
  const sftFacts = facts(8192);
  assert.ok(held.filter((p) => stepFacts(p.solution).every((f) => sftFacts.has(f))).length >= 0.98 * held.length);
  assert.ok(
    held.some((p) => p.solution.includes('*')) &&
      held.some((p) => p.solution.includes('-')) &&
      held.some((p) => p.solution.includes('+')),
  );
  // a tuple its hash holds out whose arithmetic no training tuple has is in neither split (products of 10..59 and 7 are outside mul's range)
  const outside = Array.from({ length: 50 }, (_, i) => splitOf('mul', [10 + i, 7]));
  assert.ok(outside.includes(null) && !outside.includes('heldout'), String(outside));
});

test('the wide template set adds training phrasings but no word that only the held-out templates have', () => {
  const words = (ts: string[]) =>
    new Set(
      ts
        .join(' ')
        .replace(/\{\w+\}/g, ' ')
        .toLowerCase()
        .match(/[a-z]+/g),
    );
  const base = words(TEMPLATE_TEXTS.train),
    extra = words(TEMPLATE_TEXTS.wideExtra);
  const heldOnly = [...words(TEMPLATE_TEXTS.heldout)].filter((w) => !base.has(w));
  assert.ok(heldOnly.includes('basket') && heldOnly.includes('altogether'), heldOnly.join(' '));
  assert.deepEqual(
    heldOnly.filter((w) => extra.has(w)),
    [],
  );
  assert.equal(TEMPLATE_TEXTS.wideExtra.length, 24);
  assert.equal(
    TEMPLATE_TEXTS.wideExtra.filter((t) => TEMPLATE_TEXTS.heldout.includes(t) || TEMPLATE_TEXTS.train.includes(t))
      .length,
    0,
  );
  // base is the default and unchanged; wide draws from all 36 templates, and only training tuples
  assert.deepEqual(generateProblems('train', 200, 5, 'base'), generateProblems('train', 200, 5));
  const asPattern = (t: string) => new RegExp(`^${t.replace(/[.?]/g, '\\$&').replace(/\{\w+\}/g, '\\w+')}$`);
  const extraPatterns = TEMPLATE_TEXTS.wideExtra.map(asPattern);
  const wide = generateProblems('train', 2000, 5, 'wide');
  const fromExtra = wide.filter((p) => extraPatterns.some((re) => re.test(p.prompt))).length;
  assert.ok(
    fromExtra > 0.55 * wide.length && fromExtra < 0.8 * wide.length,
    `${fromExtra} of ${wide.length} from the 24 added templates`,
  );
  for (const p of wide) assert.equal(String(checkSolution(p.solution)), p.answer);
  // a solution names its operation and operand tuple: no held-out one is a training one
  const held = new Set(generateProblems('heldout', 300, 1).map((p) => p.solution));
  assert.equal(wide.filter((p) => held.has(p.solution)).length, 0);
});
