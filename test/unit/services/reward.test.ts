/**
 * The reward stage's split of a reward's details for scored.v3: numbers (and booleans as 1/0)
 * are metrics, everything else is kept as text (strings as they are, other JSON as JSON text,
 * bounded), never dropped.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  REWARD_TEXT_MAX,
  failedSamples,
  rewardItems,
  scoredGroup,
  splitDetails,
} from '../../../services/reward/logic.ts';
import { Gen } from '../contracts/fixtures.ts';

test('splitDetails: numbers and booleans are metrics; strings and other JSON values are text; non-finite numbers and functions are dropped', () => {
  const long = 'x'.repeat(REWARD_TEXT_MAX + 10);
  const d = splitDetails({
    acc: 1,
    fmt: 0.5,
    ok: true,
    bad: false,
    pred: '42',
    why: 'no final answer',
    parsed: { a: [1, 2] },
    none: null,
    nan: NaN,
    inf: Infinity,
    long,
    fn: () => 1,
    undef: undefined,
  });
  assert.deepEqual(d.numbers, { acc: 1, fmt: 0.5, ok: 1, bad: 0 });
  assert.deepEqual(Object.keys(d.text).sort(), ['long', 'none', 'parsed', 'pred', 'why']);
  assert.equal(d.text.pred, '42');
  assert.equal(d.text.parsed, '{"a":[1,2]}');
  assert.equal(d.text.none, 'null');
  assert.equal(d.text.long.length, REWARD_TEXT_MAX);
  assert.ok(d.text.long.endsWith('…'));
});

test('scoredGroup: a scored sample carries both maps; a failure has neither', () => {
  const g = new Gen(5).trajectoryGroup(2, { n: 2, tokens: 3 });
  const s = scoredGroup(
    g,
    [
      { id: g.samples[0]!.id, ok: true, reward: 1, details: { accuracy: 1, pred: '7' }, server: 'fn' },
      { id: g.samples[1]!.id, ok: false, reason: 'boom', retriable: false },
    ],
    'fn:x',
    1,
  );
  assert.deepEqual(s.samples[0]!.reward_details, { accuracy: 1 });
  assert.deepEqual(s.samples[0]!.reward_text, { pred: '7' });
  assert.deepEqual([s.samples[1]!.reward_details, s.samples[1]!.reward_text, s.samples[1]!.reward], [{}, {}, null]);
  assert.equal(failedSamples([s, s]), 2, 'reward/failures counts the samples left without a reward');
});

test("rewardItems: an image policy's sample is scored on the image it generated, a language sample on the prompt's images; scoredGroup keeps the generated record", () => {
  const gen = new Gen(8).trajectoryGroup(1, { n: 3, tokens: 2, generated: true });
  const prompt = Buffer.from('prompt png');
  const items = rewardItems({ ...gen, images: [prompt] });
  assert.equal(items.length, 3);
  items.forEach((it, i) => assert.deepEqual(it.images, [gen.samples[i].generated!.png]));
  const text = new Gen(9).trajectoryGroup(1, { n: 2, tokens: 2 });
  for (const it of rewardItems({ ...text, images: [prompt] })) assert.deepEqual(it.images, [prompt]);
  const scored = scoredGroup(
    gen,
    gen.samples.map((s) => ({ id: s.id, ok: true as const, reward: 1, details: {}, server: 'x' })),
    'fn:x',
    1,
  );
  scored.samples.forEach((s, i) => assert.equal(s.generated, gen.samples[i].generated));
});
