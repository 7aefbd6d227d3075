/**
 * Python reward functions (lib/reward-fns/python-pool.ts + python_worker.py) with Debian's
 * /usr/bin/python3: the verl-style math reward shipped in examples/, the four call forms and the
 * keys each receives, per-call timeouts, a crashing worker replaced, exceptions with their last
 * frame, and start-time failures (interpreter, module, function) as one line.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import sharp from 'sharp';
import { PythonRewardPool, type PythonOutcome } from '../../../lib/reward-fns/python-pool.ts';
import { loadConfig } from '../../../lib/config/index.ts';
import { ConfigError } from '../../../lib/errors.ts';
import { ROOT } from '../../../devkit/pipeline-procs.ts';

const PYTHON = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
const dir = join(ROOT, 'test/.tmp', `python-pool-${process.pid}`);
mkdirSync(dir, { recursive: true });
after(() => rmSync(dir, { recursive: true, force: true }));

function py(name: string, src: string): string {
  const f = join(dir, name);
  writeFileSync(f, src);
  return f;
}

const quiet = { stderr: () => undefined, warn: () => undefined };
const item = (
  response: string,
  ground_truth: string,
  extra: Partial<Parameters<PythonRewardPool['score']>[0][0]> = {},
) => ({
  prompt: 'p',
  response,
  ground_truth,
  ...extra,
});

async function withPool<T>(
  opts: Partial<ConstructorParameters<typeof PythonRewardPool>[0]> & { path: string },
  f: (p: PythonRewardPool) => Promise<T>,
): Promise<T> {
  const pool = new PythonRewardPool({ python: PYTHON, timeoutS: 10, workers: 2, ...quiet, ...opts });
  await pool.start();
  try {
    return await f(pool);
  } finally {
    await pool.close();
  }
}

const rewards = (o: PythonOutcome[]) => o.map((x) => (x.ok ? x.reward : x.reason));

test('verl-style math reward (examples/python-reward/math_boxed.py): boxed answers extracted and compared', async () => {
  const cases: Array<[string, string, number]> = [
    ['The answer is \\boxed{42}.', '42', 1],
    ['so \\boxed{\\dfrac{1}{2}}', '0.5', 1],
    ['\\boxed{\\frac12}', '\\frac{1}{2}', 1],
    ['first \\boxed{3} then \\boxed{x = 1,000}', '1000', 1],
    ['\\boxed{\\frac{\\sqrt{3}}{2}}', '\\frac{\\sqrt3}{2}', 1],
    ['\\boxed{10\\%}', '10', 1],
    ['\\boxed{\\text{(B)}}', '(B)', 1],
    ['\\boxed{2.50}', '5/2', 1],
    ['\\boxed{\\left( 1, 2 \\right)}', '(1,2)', 1],
    ['42', '42', 0], // no box: no answer
    ['\\boxed{41}', '42', 0],
    ['\\boxed{{unbalanced', '1', 0],
    ['', '42', 0],
  ];
  await withPool({ path: join(ROOT, 'examples/python-reward/math_boxed.py') }, async (pool) => {
    const out = await pool.score(cases.map(([r, t]) => item(r, t, { data_source: 'math' })));
    assert.deepEqual(
      rewards(out),
      cases.map((c) => c[2]),
    );
    const first = out[0]!;
    assert.ok(first.ok);
    assert.deepEqual(first.metrics, { acc: 1, pred: '42', overall: 1 }, 'acc a metric (bool → 1), pred stored as text');
  });
});

test('the four forms: each gets its keys and its return shape becomes {reward, metrics}', async () => {
  const png = await sharp({ create: { width: 2, height: 2, channels: 3, background: '#f00' } })
    .png()
    .toBuffer();
  const seen = join(dir, 'seen.jsonl');
  const src = `
import json
def log(kind, obj):
    with open(${JSON.stringify(seen)}, "a") as f:
        f.write(json.dumps([kind, obj]) + "\\n")
def verl(data_source, solution_str, ground_truth, extra_info, scale=1.0):
    log("verl", [data_source, solution_str, ground_truth, extra_info])
    if solution_str == "bool":
        return True
    if solution_str == "num":
        return 0.25 * scale
    return {"score": scale * (solution_str == ground_truth), "note": "n"}
def batch(reward_inputs, scale=1.0):
    log("batch", reward_inputs)
    return [{"overall": scale * (x["response"] == x["ground_truth"]), "format": 1.0} for x in reward_inputs]
def sequential(reward_input, scale=1.0):
    log("sequential", reward_input)
    return {"overall": scale * (reward_input["response"] == reward_input["ground_truth"]), "accuracy": 0.5}
def mtrl(data_dict, scale=1.0):
    log("mtrl", data_dict)
    return scale * (data_dict["response"] == data_dict["ground_truth"]), {"acc": data_dict["response"] == data_dict["ground_truth"], "why": "eq"}
def bare(reward_input):
    return 1.0
def short(reward_inputs):
    return [{"overall": 1.0}]
`;
  const path = py('forms.py', src);
  const kwargs = { scale: 2 };
  const extra = { data_source: 'ds', extra_info: { a: 1 }, response_length: 3, images: [png] };
  const read = () => {
    const lines = readFileSync(seen, 'utf8').trim().split('\n');
    rmSync(seen);
    return lines.map((l) => JSON.parse(l) as [string, unknown]);
  };

  await withPool({ path, name: 'verl', form: 'verl', kwargs }, async (pool) => {
    assert.deepEqual(
      rewards(await pool.score([item('7', '7', extra), item('8', '7'), item('bool', ''), item('num', '')])),
      [2, 0, 1, 0.5],
    );
    const calls = read().map((c) => c[1] as [string, string, string, Record<string, unknown>]);
    const [ds, sol, gt, ei] = calls.find((c) => c[1] === '7')!;
    assert.deepEqual([ds, sol, gt, ei.a], ['ds', '7', '7', 1]);
    const images = ei.images as string[];
    assert.equal(images.length, 1);
    assert.deepEqual(readFileSync(images[0]!), png, 'the image reaches the function as a PNG file path');
  });
  await withPool({ path, name: 'batch', form: 'easyr1_batch', kwargs, workers: 1 }, async (pool) => {
    const out = await pool.score([item('7', '7', extra), item('8', '7')]);
    assert.deepEqual(rewards(out), [2, 0]);
    assert.ok(out[0]!.ok && out[0]!.metrics.format === 1 && out[0]!.metrics.overall === 2);
    const calls = read();
    assert.equal(calls.length, 1, 'one call with the whole list');
    const inputs = calls[0]![1] as Array<Record<string, unknown>>;
    assert.equal(inputs.length, 2);
    assert.deepEqual(Object.keys(inputs[0]!).sort(), [
      'data_source',
      'extra_info',
      'ground_truth',
      'images',
      'prompt',
      'response',
      'response_length',
    ]);
    assert.equal(inputs[0]!.response_length, 3);
  });
  await withPool({ path, name: 'sequential', form: 'easyr1_sequential', kwargs }, async (pool) => {
    const out = await pool.score([item('7', '7', extra), item('8', '7')]);
    assert.deepEqual(rewards(out), [2, 0]);
    assert.ok(out[1]!.ok && out[1]!.metrics.accuracy === 0.5);
    assert.equal(read().length, 2, 'one call per input');
  });
  await withPool({ path, name: 'mtrl', form: 'mtrl', kwargs }, async (pool) => {
    const out = await pool.score([item('7', '7', extra), item('8', '7')]);
    assert.deepEqual(rewards(out), [2, 0]);
    assert.ok(out[0]!.ok);
    assert.deepEqual(out[0]!.metrics, { acc: 1, why: 'eq', overall: 2 });
    const d = read()
      .map((c) => c[1] as Record<string, unknown>)
      .find((x) => x.response === '7')!;
    assert.equal(d.response, '7');
    assert.equal(d.data_source, 'ds');
  });
  await withPool({ path, name: 'short', form: 'easyr1_batch', workers: 1 }, async (pool) => {
    const out = await pool.score([item('a', 'a'), item('b', 'b')]);
    for (const o of out) assert.ok(!o.ok && /returned 1 results for 2 inputs/.test(o.reason), JSON.stringify(o));
  });
  // a wrong return shape for the form is a failure saying what was expected
  await withPool({ path, name: 'bare', form: 'easyr1_sequential' }, async (pool) => {
    const [o] = await pool.score([item('x', 'y')]);
    assert.ok(!o!.ok && /expected a dict with 'overall'/.test(o!.reason), JSON.stringify(o));
  });
});

test("an exception's message and last frame reach the failure and the console; bad returns are failures", async () => {
  const path = py(
    'raises.py',
    `def helper(x):\n    return 1 / x\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    if solution_str == "zero":\n        return helper(0)\n    if solution_str == "nan":\n        return float("nan")\n    if solution_str == "str":\n        return "yes"\n    print("scored", solution_str)\n    return 1.0\n`,
  );
  const warned: string[] = [];
  const printed: string[] = [];
  await withPool({ path, warn: (m) => warned.push(m), stderr: (l) => printed.push(l), workers: 1 }, async (pool) => {
    const out = await pool.score([
      item('zero', ''),
      item('zero', ''),
      item('nan', ''),
      item('str', ''),
      item('ok', ''),
    ]);
    assert.equal(
      (out[0] as { reason: string }).reason,
      'python reward function raises.py:compute_score raised ZeroDivisionError: division by zero (at raises.py:2 in helper)',
    );
    assert.match((out[2] as { reason: string }).reason, /the returned value is nan; a reward is a finite number/);
    assert.match((out[3] as { reason: string }).reason, /the returned value is "yes"; expected a number/);
    assert.deepEqual(out[4], { ok: true, reward: 1, metrics: { overall: 1 } });
    assert.equal(warned.filter((w) => w.includes('ZeroDivisionError')).length, 1, 'printed once per distinct message');
    // the workers' stderr is read on its own pipe: give it a moment
    for (let i = 0; i < 100 && !printed.some((l) => l.endsWith('scored ok')); i++)
      await new Promise((r) => setTimeout(r, 20));
  });
  assert.ok(
    printed.some((l) => l.endsWith('scored ok')),
    "the function's print() reaches the console, not the protocol",
  );
});

test('per-call timeout: the call fails with where it was stopped, the worker serves the next call', async () => {
  const path = py(
    'slow.py',
    `import time\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    if solution_str == "spin":\n        while True:\n            pass\n    if solution_str == "sleep":\n        try:\n            time.sleep(60)\n        except Exception:\n            return 5.0\n    return 1.0\n`,
  );
  await withPool({ path, timeoutS: 0.3, workers: 1 }, async (pool) => {
    const t0 = performance.now();
    const out = await pool.score([item('spin', ''), item('sleep', ''), item('fine', '')]);
    assert.ok(performance.now() - t0 < 5000);
    assert.match(
      (out[0] as { reason: string }).reason,
      /^python reward function slow\.py:compute_score did not return within reward\.timeout_s = 0\.3 s \(stopped at slow\.py:[45] in compute_score\)$/,
    );
    assert.ok(!out[1]!.ok, "the timeout is not an Exception the function's own except can swallow");
    assert.deepEqual(out[2], { ok: true, reward: 1, metrics: { overall: 1 } });
  });
});

test('a worker that dies fails its items and is replaced; the pool keeps scoring', async () => {
  const path = py(
    'crash.py',
    `import os\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    if solution_str == "die":\n        os._exit(7)\n    return float(solution_str == ground_truth)\n`,
  );
  const warned: string[] = [];
  await withPool({ path, workers: 1, warn: (m) => warned.push(m) }, async (pool) => {
    const out = await pool.score([item('a', 'a'), item('die', ''), item('b', 'b')]);
    for (const o of out)
      assert.ok(
        !o.ok && /worker for crash\.py:compute_score exited \(code 7\) while scoring; it was replaced/.test(o.reason),
      );
    assert.deepEqual(rewards(await pool.score([item('a', 'a'), item('b', 'c')])), [1, 0]);
    assert.ok(warned.some((w) => w.includes('exited (code 7)')));
  });
});

test('missing interpreter, module, function, or an import error: start fails with one line', async () => {
  const ok = py('fine.py', 'def compute_score(*a):\n    return 1\ndef other(*a):\n    return 0\n');
  const bad = py('bad_import.py', 'import numpy_that_is_not_installed\ndef compute_score(*a):\n    return 1\n');
  const syntax = py('syntax.py', 'def compute_score(:\n');
  const cases: Array<[Partial<ConstructorParameters<typeof PythonRewardPool>[0]> & { path: string }, RegExp]> = [
    [
      { path: ok, python: 'python3-that-does-not-exist' },
      /^reward\.python: interpreter "python3-that-does-not-exist" not found/,
    ],
    [{ path: join(dir, 'nope.py') }, /^reward\.reward_fn_path: file not found: .*nope\.py$/],
    [
      { path: ok, name: 'score' },
      /fine\.py has no function 'score' \(it defines: compute_score, other\); set reward\.reward_fn_name/,
    ],
    [
      { path: bad },
      /importing .*bad_import\.py raised ModuleNotFoundError: No module named 'numpy_that_is_not_installed' \(at bad_import\.py:1 in <module>\)/,
    ],
    [{ path: syntax }, /importing .*syntax\.py raised SyntaxError/],
  ];
  for (const [opts, re] of cases) {
    const pool = new PythonRewardPool({ python: PYTHON, timeoutS: 5, workers: 2, ...quiet, ...opts });
    await assert.rejects(pool.start(), (e: Error) => {
      assert.ok(e instanceof ConfigError, e.message);
      assert.match(e.message, re);
      assert.ok(!e.message.includes('\n'), `one line: ${e.message}`);
      return true;
    });
  }
});

test('config: the Python keys have defaults; reward_fn_form other than verl needs a .py module; reward.python as a path resolves like the other paths', () => {
  const yaml = join(dir, 'sub', 'cfg.yaml');
  mkdirSync(join(dir, 'sub'), { recursive: true });
  writeFileSync(yaml, 'data:\n  task: number_game\nreward:\n  reward_fn_path: score.py\n  python: .venv/bin/python\n');
  const fromFile = loadConfig({ file: yaml, env: {} });
  assert.equal(fromFile.reward.python, join(dir, 'sub', '.venv/bin/python'), 'a path: against the config file');
  assert.equal(fromFile.reward.reward_fn_path, join(dir, 'sub', 'score.py'));
  assert.equal(
    loadConfig({ file: yaml, overrides: ['reward.python=python3.11'], env: {} }).reward.python,
    'python3.11',
    'a name: on PATH',
  );
  const cfg = loadConfig({ overrides: ['data.task=number_game', 'reward.reward_fn_path=score.py'], env: {} });
  assert.equal(cfg.reward.reward_fn_form, 'verl');
  assert.equal(cfg.reward.python, null);
  assert.equal(cfg.reward.reward_fn_name, null);
  loadConfig({
    overrides: ['data.task=number_game', 'reward.reward_fn_path=score.py', 'reward.reward_fn_form=easyr1_batch'],
    env: {},
  });
  assert.throws(
    () =>
      loadConfig({
        overrides: ['data.task=number_game', 'reward.reward_fn_path=score.mjs', 'reward.reward_fn_form=mtrl'],
        env: {},
      }),
    /reward\.reward_fn_form = mtrl applies to a Python reward function/,
  );
});

test('reward_fn_name also names the export of a JS module, called verl-style', async () => {
  const { loadRewardModule, applyRewardFn } = await import('../../../lib/reward-fns/index.ts');
  const f = join(dir, 'named.mjs');
  writeFileSync(f, 'export function my_score(ds, s, gt, extra) { return { score: s === gt ? 1 : 0, ds }; }\n');
  const fn = await loadRewardModule(f, 'my_score');
  assert.deepEqual(
    await applyRewardFn(fn, { prompt: '', response: 'a', ground_truth: 'a', data_source: 'd', kwargs: {} }),
    { ok: true, reward: 1, metrics: { ds: 'd', overall: 1 } },
  );
  await assert.rejects(
    loadRewardModule(f, 'nope'),
    /reward\.reward_fn_name: .*named\.mjs has no exported function "nope" \(it exports my_score\)/,
  );
});
