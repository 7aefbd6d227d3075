import { test } from 'node:test';
import assert from 'node:assert/strict';
import { tasks, numberGame, arithmetic } from '../../../lib/tasks/index.ts';
import { rewardFns, applyRewardFn } from '../../../lib/reward-fns/index.ts';
import { Rng } from '../../../lib/util/rng.ts';

test('number game rows: three distinct numbers, answer is the index of the largest, seeded', () => {
  const rows = numberGame.generate(200, 7);
  assert.deepEqual(rows, numberGame.generate(200, 7));
  assert.notDeepEqual(rows, numberGame.generate(200, 8));
  const counts = [0, 0, 0];
  for (const r of rows) {
    const nums = r.prompt.slice(0, -1).split(' ').map(Number);
    assert.equal(new Set(nums).size, 3);
    assert.equal(Number(r.answer), nums.indexOf(Math.max(...nums)));
    counts[Number(r.answer)]++;
    for (const ch of r.prompt + r.answer) assert.ok(numberGame.alphabet.includes(ch));
  }
  assert.ok(
    counts.every((c) => c > 40),
    `answers roughly balanced: ${counts}`,
  );
});

test('arithmetic rows evaluate correctly', () => {
  for (const r of arithmetic.generate(100, 1)) {
    const m = /^(\d+)([+-])(\d+)=$/.exec(r.prompt)!;
    assert.equal(Number(r.answer), m[2] === '+' ? Number(m[1]) + Number(m[3]) : Number(m[1]) - Number(m[3]));
  }
});

test('unknown task / reward names list the valid ones', () => {
  assert.throws(
    () => tasks.get('numbergame'),
    /unknown data\.task "numbergame" — valid: arithmetic, guess_number, number_game, number_game_vision/,
  );
  assert.throws(
    () => rewardFns.get('exact'),
    /valid: arithmetic, exact_match, format, gsm8k, number_game, number_game_vision/,
  );
});

test('reward functions: accuracy + format, failures are never zeros', async () => {
  const fn = rewardFns.get('number_game');
  const ok = await applyRewardFn(fn, { prompt: '1 5 3:', response: ' 1', ground_truth: '1', kwargs: {} });
  assert.deepEqual(ok, { ok: true, reward: 1.1, metrics: { overall: 1.1, accuracy: 1, format: 1 } });
  const wrong = await applyRewardFn(fn, {
    prompt: '1 5 3:',
    response: '2',
    ground_truth: '1',
    kwargs: { format_weight: 0.5 },
  });
  assert.deepEqual(wrong, { ok: true, reward: 0.5, metrics: { overall: 0.5, accuracy: 0, format: 1 } });
  const thrown = await applyRewardFn(
    () => {
      throw new Error('boom');
    },
    { prompt: '', response: '', ground_truth: '', kwargs: {} },
  );
  assert.deepEqual(thrown, { ok: false, reason: 'reward function threw: boom' });
  const nan = await applyRewardFn(() => ({ reward: NaN }), { prompt: '', response: '', ground_truth: '', kwargs: {} });
  assert.equal(nan.ok, false);
  assert.match((nan as { reason: string }).reason, /non-finite reward/);
  // metrics: booleans count as 1/0, strings are kept (stored as text details); NaN or other types are a failure
  const mixed = await applyRewardFn(() => ({ reward: 1, metrics: { correct: true, pred: '42', score: 0.5 } }), {
    prompt: '',
    response: '',
    ground_truth: '',
    kwargs: {},
  });
  assert.deepEqual(mixed, { ok: true, reward: 1, metrics: { correct: 1, pred: '42', score: 0.5, overall: 1 } });
  for (const bad of [NaN, { x: 1 }, null]) {
    const o = await applyRewardFn(() => ({ reward: 1, metrics: { m: bad as never } }), {
      prompt: '',
      response: '',
      ground_truth: '',
      kwargs: {},
    });
    assert.equal(o.ok, false);
    assert.match((o as { reason: string }).reason, /metric m=.*a metric is a finite number, a boolean or a string/);
  }
});

test('Rng is deterministic, restorable and uniform enough', () => {
  const a = Rng.fromSeed('x'),
    b = Rng.fromSeed('x');
  for (let i = 0; i < 10; i++) assert.equal(a.nextU32(), b.nextU32());
  const st = a.state();
  const v = a.next();
  assert.equal(Rng.fromState(st).next(), v);
  const r = Rng.fromSeed(1);
  let sum = 0;
  for (let i = 0; i < 20000; i++) sum += r.next();
  assert.ok(Math.abs(sum / 20000 - 0.5) < 0.01);
  assert.deepEqual(Rng.fromSeed(3).shuffle([1, 2, 3, 4, 5]).sort(), [1, 2, 3, 4, 5]);
});
