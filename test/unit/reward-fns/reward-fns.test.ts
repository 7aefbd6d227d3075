import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { applyRewardFn, loadRewardModule, parseExtraInfo } from '../../../lib/reward-fns/index.ts';

const dir = mkdtempSync(join(tmpdir(), 'rl-rewardfn-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const input = {
  prompt: 'What is 2+2?',
  response: 'It is 4',
  ground_truth: '4',
  data_source: 'gsm8k',
  extra_info: { index: 3 },
  kwargs: { w: 2 },
};

test("verl's compute_score(data_source, solution_str, ground_truth, extra_info) is called positionally", async () => {
  const f = join(dir, 'verl.mjs');
  writeFileSync(
    f,
    [
      'export const calls = [];',
      'export function compute_score(data_source, solution_str, ground_truth, extra_info, kwargs) {',
      '  calls.push([data_source, solution_str, ground_truth, extra_info, kwargs]);',
      '  return solution_str.endsWith(ground_truth) ? 1.0 : 0.0;',
      '}',
    ].join('\n'),
  );
  const fn = await loadRewardModule(f);
  assert.deepEqual(await applyRewardFn(fn, input), { ok: true, reward: 1, metrics: { overall: 1 } });
  const mod = (await import(f)) as { calls: unknown[][] };
  assert.deepEqual(mod.calls[0], ['gsm8k', 'It is 4', '4', { index: 3 }, { w: 2 }]);
});

test('a return of {score, …} is the reward with the other keys as metrics; booleans count 1/0', async () => {
  const f = join(dir, 'verl-dict.mjs');
  writeFileSync(
    f,
    'export function compute_score(ds, s, gt) { return { score: s === gt ? 1 : -1, acc: s === gt, pred: s, n: 2 }; }\n',
  );
  const fn = await loadRewardModule(f);
  assert.deepEqual(await applyRewardFn(fn, { ...input, response: '4' }), {
    ok: true,
    reward: 1,
    metrics: { acc: 1, pred: '4', n: 2, overall: 1 },
  });
  const b = join(dir, 'verl-bool.mjs');
  writeFileSync(b, 'export const compute_score = (ds, s, gt) => s === gt;\n');
  assert.deepEqual(await applyRewardFn(await loadRewardModule(b), input), {
    ok: true,
    reward: 0,
    metrics: { overall: 0 },
  });
});

test('the object form gets data_source and extra_info too, and may return a bare number', async () => {
  const f = join(dir, 'obj.mjs');
  writeFileSync(
    f,
    'export default ({ data_source, extra_info, response }) => (data_source === "gsm8k" && extra_info.index === 3 ? response.length : -1);\n',
  );
  assert.deepEqual(await applyRewardFn(await loadRewardModule(f), input), {
    ok: true,
    reward: 7,
    metrics: { overall: 7 },
  });
});

test('a module with no usable export says what it exports and which shapes work', async () => {
  const f = join(dir, 'none.mjs');
  writeFileSync(f, 'export const score = 1;\n');
  await assert.rejects(
    loadRewardModule(f),
    /must export a function: .*export default function .*compute_score\(data_source, solution_str, ground_truth, extra_info\).*it exports score/,
  );
  const g = join(dir, 'bad-return.mjs');
  writeFileSync(g, 'export function compute_score() { return "high"; }\n');
  const o = await applyRewardFn(await loadRewardModule(g), input);
  assert.equal(o.ok, false);
  assert.match(
    (o as { reason: string }).reason,
    /returned "high"; expected a number, \{reward: number, metrics\?\} or \{score: number, …\}/,
  );
});

test('extra_info text from the trajectories parses to an object', () => {
  assert.deepEqual(parseExtraInfo('{"a":1}'), { a: 1 });
  assert.deepEqual(parseExtraInfo('{}'), {});
  assert.deepEqual(parseExtraInfo(''), {});
  assert.deepEqual(parseExtraInfo('[1]'), {});
});

test('gsm8k: exact match on the number after the last ####, plus a format bonus for ending in #### n, reported separately', async () => {
  const { gsm8k } = await import('../../../lib/reward-fns/index.ts');
  const score = (response: string, ground_truth: string) =>
    applyRewardFn(gsm8k, { prompt: '', response, ground_truth, kwargs: {} });
  assert.deepEqual(await score('3 * 4 = 12\n12 - 5 = 7\n#### 7', '7'), {
    ok: true,
    reward: 1.1,
    metrics: { overall: 1.1, accuracy: 1, format: 1, answer: '7' },
  });
  assert.deepEqual(await score('#### 6\nso #### 1,024 apples', '#### 1024'), {
    ok: true,
    reward: 1,
    metrics: { overall: 1, accuracy: 1, format: 0, answer: '1024' },
  });
  assert.deepEqual(await score('2 + 2 = 5\n#### 5', '4'), {
    ok: true,
    reward: 0.1,
    metrics: { overall: 0.1, accuracy: 0, format: 1, answer: '5' },
  });
  assert.deepEqual(await score('the answer is 4', '4'), {
    ok: true,
    reward: 0,
    metrics: { overall: 0, accuracy: 0, format: 0, answer: '' },
  });
  const w = await applyRewardFn(gsm8k, {
    prompt: '',
    response: '#### -3',
    ground_truth: '-3',
    kwargs: { format_weight: 0.5 },
  });
  assert.equal(w.ok && w.reward, 1.5);
});
