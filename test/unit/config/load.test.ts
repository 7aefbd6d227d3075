import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  loadConfig,
  loadPipelineSection,
  defaultConfig,
  parseOverride,
  resolveRunId,
} from '../../../lib/config/index.ts';
import { dirname, join, resolve } from 'node:path';
import { ConfigError } from '../../../lib/errors.ts';
import { yamlFile, load, problemsOf, expectOneProblem } from './helpers.ts';

test('precedence: defaults → file → overrides', () => {
  const file = yamlFile('actor:\n  optim:\n    lr: 2.0e-5\n    eps: 1.0e-6\nrollout:\n  n: 4\n');
  const cfg = load({ file, overrides: ['actor.optim.lr=3e-5'] });
  assert.equal(cfg.actor.optim.lr, 3e-5, 'override beats the file');
  assert.equal(cfg.actor.optim.eps, 1e-6, 'file beats the default');
  assert.equal(cfg.rollout.n, 4);
  assert.equal(cfg.actor.optim.weight_decay, 1e-2, 'untouched keys keep their defaults');
  assert.equal(cfg.rollout.temperature, 1.0);
});

test('later overrides win over earlier ones', () => {
  const cfg = load({ overrides: ['rollout.n=4', 'rollout.n=8'] });
  assert.equal(cfg.rollout.n, 8);
});

test('override values are YAML scalars and flow collections', () => {
  const cfg = load({
    overrides: [
      'rollout.n=5',
      'actor.optim.betas=[0.9,0.95]',
      'actor.optim.lr=1e-5',
      'data.shuffle=false',
      'trainer.experiment_name=exp1',
      'reward.reward_fn_kwargs={format_weight: 0.2, tag: x}',
      'trainer.max_steps=~',
      'trainer.logger=[console, tensorboard]',
      'data.train_files=[]',
      "trainer.project_name='007'",
    ],
  });
  assert.equal(cfg.rollout.n, 5);
  assert.equal(typeof cfg.rollout.n, 'number');
  assert.deepEqual(cfg.actor.optim.betas, [0.9, 0.95]);
  assert.equal(cfg.actor.optim.lr, 1e-5);
  assert.equal(cfg.data.shuffle, false);
  assert.equal(cfg.trainer.experiment_name, 'exp1');
  assert.deepEqual(cfg.reward.reward_fn_kwargs, { format_weight: 0.2, tag: 'x' });
  assert.equal(cfg.trainer.max_steps, null);
  assert.deepEqual(cfg.trainer.logger, ['console', 'tensorboard']);
  assert.equal(cfg.trainer.project_name, '007', 'a quoted number stays a string');
});

test('parseOverride: "=" alone gives null; a value may contain "="', () => {
  assert.deepEqual(parseOverride('actor.model.path='), {
    path: ['actor', 'model', 'path'],
    value: null,
    text: 'actor.model.path=',
  });
  const o = parseOverride('reward.reward_fn_kwargs.q=a=b');
  assert.ok(typeof o !== 'string');
  assert.equal(o.value, 'a=b');
});

test('a single string is accepted for train_files/val_files', () => {
  const file = yamlFile(
    'data:\n  train_files: data/train.jsonl\n  val_files: [data/val.jsonl]\nreward:\n  reward_fn: exact_match\n',
  );
  const cfg = loadConfig({ file, env: {} });
  assert.deepEqual(cfg.data.train_files, [join(dirname(file), 'data/train.jsonl')]);
  assert.deepEqual(cfg.data.val_files, [join(dirname(file), 'data/val.jsonl')]);
});

test('a section given by override is merged key by key; a map value is replaced whole', () => {
  const file = yamlFile('actor:\n  optim:\n    eps: 1.0e-6\nreward:\n  reward_fn_kwargs: {a: 1, b: 2}\n');
  const cfg = load({ file, overrides: ['actor.optim={lr: 5e-6}', 'reward.reward_fn_kwargs={c: 3}'] });
  assert.equal(cfg.actor.optim.lr, 5e-6);
  assert.equal(cfg.actor.optim.eps, 1e-6, 'the file value of a sibling key survives');
  assert.deepEqual(cfg.reward.reward_fn_kwargs, { c: 3 });
});

test('a map set in the file replaces the default map', () => {
  const file = yamlFile('reward:\n  remote:\n    response_mapping:\n      weights: {score: 1.0}\n');
  const cfg = load({ file });
  assert.deepEqual(cfg.reward.remote.response_mapping.weights, { score: 1.0 });
});

test('unknown key at depth in the file: full path, closest key, file:line:col', () => {
  const file = yamlFile('data:\n  task: number_game\nactor:\n  optim:\n    lrr: 1.0e-5\n');
  const p = expectOneProblem(
    () => loadConfig({ file, env: {} }),
    'unknown key "actor.optim.lrr" — did you mean "actor.optim.lr"?',
  );
  assert.ok(p.startsWith(`${file}:5:5: `), p);
});

test('unknown key in an override: names the override and the corrected full path', () => {
  expectOneProblem(
    () => load({ overrides: ['actor.optim.lrr=1e-5'] }),
    'override "actor.optim.lrr=1e-5"',
    'unknown key "actor.optim.lrr" — did you mean "actor.optim.lr"?',
  );
  expectOneProblem(
    () => load({ overrides: ['actor.optimm.lr=1e-5'] }),
    'unknown key "actor.optimm.lr" — did you mean "actor.optim.lr"?',
  );
});

test('unknown key four levels deep, in a file and in an override', () => {
  const file = yamlFile('data:\n  task: number_game\nreward:\n  remote:\n    breaker:\n      failure_treshold: 3\n');
  expectOneProblem(
    () => loadConfig({ file, env: {} }),
    `${file}:6:7: unknown key "reward.remote.breaker.failure_treshold" — did you mean "reward.remote.breaker.failure_threshold"?`,
  );
  expectOneProblem(
    () => load({ overrides: ['reward.remote.breakr.failure_threshold=3'] }),
    'unknown key "reward.remote.breakr.failure_threshold" — did you mean "reward.remote.breaker.failure_threshold"?',
  );
});

test('unknown section at the top level suggests the section', () => {
  const file = yamlFile('data:\n  task: number_game\npipline:\n  bus: kafka\n');
  expectOneProblem(
    () => loadConfig({ file, env: {} }),
    `${file}:3:1: unknown key "pipline" — did you mean "pipeline"?`,
  );
});

test('unknown key that exists elsewhere points to where it lives', () => {
  expectOneProblem(
    () => load({ overrides: ['actor.lr=1e-5'] }),
    'unknown key "actor.lr" — did you mean "actor.optim.lr"?',
  );
});

test('verl/EasyR1 names that differ say what rlstream calls them', () => {
  expectOneProblem(
    () => load({ overrides: ['trainer.test_freq=5'] }),
    'unknown key "trainer.test_freq" — rlstream calls it trainer.val_freq',
  );
  expectOneProblem(() => load({ overrides: ['algorithm.kl_loss_coef=0.01'] }), 'rlstream calls it algorithm.kl_coef');
});

test('unknown key with nothing close lists the valid keys', () => {
  const p = expectOneProblem(
    () => load({ overrides: ['rollout.zzzzzzzz=1'] }),
    'unknown key "rollout.zzzzzzzz" — valid keys under "rollout": n, temperature',
  );
  assert.ok(p.includes('val_override'));
});

test('an override cannot reach inside a value', () => {
  expectOneProblem(
    () => load({ overrides: ['actor.optim.lr.x=1'] }),
    '"actor.optim.lr" is number > 0, not a section, so it has no key "x"',
  );
});

test('malformed overrides are reported', () => {
  expectOneProblem(() => load({ overrides: ['rollout.n'] }), 'override "rollout.n": expected key.path=value');
  expectOneProblem(() => load({ overrides: ['rollout..n=3'] }), 'is not a key path');
  expectOneProblem(
    () => load({ overrides: ['actor.optim.betas=[0.9,'] }),
    'override "actor.optim.betas=[0.9,": the value is not valid YAML',
  );
});

test('bad type: path, expected type, value given and source', () => {
  const file = yamlFile('data:\n  task: number_game\nactor:\n  global_batch_size: five\n');
  expectOneProblem(
    () => loadConfig({ file, env: {} }),
    `${file}:4:3: actor.global_batch_size: expected integer ≥ 1, got "five" (a string)`,
  );
  expectOneProblem(
    () => load({ overrides: ['rollout.n=abc'] }),
    'override "rollout.n=abc": rollout.n: expected integer ≥ 1, got "abc" (a string)',
  );
  expectOneProblem(() => load({ overrides: ['rollout.n=2.5'] }), 'rollout.n: expected integer ≥ 1, got 2.5 (a number)');
  expectOneProblem(() => load({ overrides: ['actor=5'] }), 'actor: expected a mapping (section with keys model, optim');
  expectOneProblem(
    () => load({ overrides: ['actor.optim.betas=[0.9]'] }),
    'actor.optim.betas: expected [number ≥ 0, < 1, number ≥ 0, < 1], got [0.9] (a list)',
  );
});

test('out-of-range numbers name the bound', () => {
  expectOneProblem(() => load({ overrides: ['rollout.n=0'] }), 'rollout.n: must be integer ≥ 1, got 0 (a number)');
  expectOneProblem(() => load({ overrides: ['rollout.top_p=1.5'] }), 'rollout.top_p: must be number > 0, ≤ 1, got 1.5');
  expectOneProblem(
    () => load({ overrides: ['trainer.save_freq=0'] }),
    'trainer.save_freq: 0 (a number) — must be -1 (off) or an integer ≥ 1',
  );
  expectOneProblem(
    () => load({ overrides: ['trainer.experiment_name=a b'] }),
    "trainer.experiment_name: \"a b\" (a string) — may contain only letters, digits, '.', '_' and '-'",
  );
  expectOneProblem(() => load({ overrides: ['data.prompt_key=""'] }), 'data.prompt_key: must not be empty');
});

test('bad enum lists the valid values and the closest one', () => {
  const p = expectOneProblem(
    () => load({ overrides: ['algorithm.adv_estimator=grpoo'] }),
    'algorithm.adv_estimator: "grpoo" (a string) is not one of: gae, grpo, grpo_vectorized',
    'did you mean "grpo"?',
  );
  for (const name of [
    'rloo',
    'reinforce_plus_plus_baseline',
    'remax',
    'opo',
    'gpg',
    'optimal_token_baseline',
    'tir_optimal_token_baseline',
  ])
    assert.ok(p.includes(name), name);
  expectOneProblem(
    () => load({ overrides: ['actor.loss_agg_mode=token_mean'] }),
    'is not one of: token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm',
    'did you mean "token-mean"?',
  );
  expectOneProblem(
    () => load({ overrides: ['pipeline.kafka.acks=2'] }),
    'pipeline.kafka.acks: 2 (a number) is not one of: all, -1, 0, 1',
  );
  expectOneProblem(
    () => load({ overrides: ['reward.remote.request_template={image: picture}'] }),
    'reward.remote.request_template.image: "picture" (a string) is not one of: prompt_text, response_text, ground_truth, image_base64_png, id, step',
  );
});

test('all problems are reported at once, one per line, file positions first in file order', () => {
  const file = yamlFile(
    'data:\n  task: number_game\n  shuffle: maybe\nrollout:\n  nn: 3\nalgorithm:\n  kl_type: sometimes\n',
  );
  let err: unknown;
  try {
    loadConfig({ file, overrides: ['trainer.val_freqq=1'], env: {} });
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof ConfigError);
  const lines = err.message.split('\n');
  assert.equal(lines[0], 'invalid configuration (4 problems):');
  assert.equal(lines.length, 5);
  assert.ok(lines[1].includes(`${file}:3:3: data.shuffle: expected boolean, got "maybe"`), lines[1]);
  assert.ok(lines[2].includes(`${file}:5:3: unknown key "rollout.nn" — did you mean "rollout.n"?`), lines[2]);
  assert.ok(
    lines[3].includes(`${file}:7:3: algorithm.kl_type: "sometimes" (a string) is not one of: fixed, adaptive`),
    lines[3],
  );
  assert.ok(
    lines[4].includes(
      'override "trainer.val_freqq=1": unknown key "trainer.val_freqq" — did you mean "trainer.val_freq"?',
    ),
    lines[4],
  );
  assert.equal(err.retriable, false);
});

test('YAML syntax errors give file:line:col', () => {
  const file = yamlFile('data:\n  task: number_game\n  task: arithmetic\n');
  expectOneProblem(() => loadConfig({ file, env: {} }), `${file}:3:3: YAML syntax error: Map keys must be unique`);
});

test('the file must be a mapping; a missing file is named', () => {
  expectOneProblem(
    () => loadConfig({ file: yamlFile('- a\n- b\n'), env: {} }),
    'the top level must be a mapping of sections',
  );
  assert.throws(
    () => loadConfig({ file: '/nonexistent/run.yaml', env: {} }),
    (e: unknown) => e instanceof ConfigError && e.message === 'config file not found: /nonexistent/run.yaml',
  );
});

test('an empty file is the defaults', () => {
  const cfg = loadConfig({ file: yamlFile(''), overrides: ['data.task=arithmetic'], env: {} });
  assert.equal(cfg.rollout.n, 5);
  assert.equal(cfg.data.task, 'arithmetic');
});

test('DISABLE_RL_REWARD_MODEL=true sets reward.remote.enabled = false, even over the file', () => {
  const remote = ['reward.type=remote', 'reward.remote.urls=[http://localhost:8001]', 'reward.remote.enabled=true'];
  assert.equal(load({ overrides: remote }).reward.remote.enabled, true);
  const off = load({ overrides: remote, env: { DISABLE_RL_REWARD_MODEL: 'true' } });
  assert.equal(off.reward.remote.enabled, false);
  assert.equal(off.reward.reward_fn, 'number_game', 'rewards then come from the function (derived from data.task)');
  assert.equal(load({ overrides: remote, env: { DISABLE_RL_REWARD_MODEL: 'false' } }).reward.remote.enabled, true);
  assert.equal(load({ overrides: remote, env: { DISABLE_RL_REWARD_MODEL: '1' } }).reward.remote.enabled, false);
  expectOneProblem(
    () => load({ overrides: remote, env: { DISABLE_RL_REWARD_MODEL: 'maybe' } }),
    'DISABLE_RL_REWARD_MODEL="maybe" is not a boolean; set it to true or false',
  );
});

test('DISABLE_RL_REWARD_MODEL without a reward function says what to set', () => {
  const file = yamlFile(
    'data:\n  train_files: [t.jsonl]\n  val_files: [v.jsonl]\nreward:\n  type: remote\n  remote:\n    host: localhost\n    count: 2\n',
  );
  assert.equal(loadConfig({ file, env: {} }).reward.remote.enabled, true);
  expectOneProblem(
    () => loadConfig({ file, env: { DISABLE_RL_REWARD_MODEL: 'true' } }),
    'reward.remote.enabled = false (DISABLE_RL_REWARD_MODEL=true',
    'set reward.reward_fn (built-in:',
    'or reward.reward_fn_path',
  );
});

test('derived defaults are filled by the loader', () => {
  const cfg = load({ overrides: ['trainer.experiment_name=e1', 'rollout.top_k=20', 'algorithm.kl_penalty=kl'] });
  assert.equal(cfg.trainer.run_dir, 'runs/e1');
  assert.equal(cfg.pipeline.run_id, resolveRunId(cfg));
  assert.match(cfg.pipeline.run_id!, /^rlstream-e1-[0-9a-f]{8}$/);
  assert.equal(cfg.algorithm.kl_loss_type, 'kl');
  assert.equal(cfg.critic.enable, false);
  assert.equal(cfg.critic.ppo_epochs, 1);
  assert.equal(cfg.rollout.val_override.top_k, 20);
  assert.equal(cfg.reward.remote.enabled, false);
  assert.equal(cfg.reward.reward_fn, 'number_game');
  assert.equal(cfg.algorithm.overlong.max_length, 512);
  const gae = load({ overrides: ['algorithm.adv_estimator=gae'] });
  assert.equal(gae.critic.enable, true);
  const set = load({
    overrides: ['trainer.run_dir=/data/run', 'pipeline.run_id=my-run', 'algorithm.kl_loss_type=mse'],
  });
  assert.equal(set.trainer.run_dir, '/data/run');
  assert.equal(set.pipeline.run_id, 'my-run');
  assert.equal(set.algorithm.kl_loss_type, 'mse');
});

test('resolveRunId is deterministic and depends on both names', () => {
  const a = defaultConfig();
  const id = resolveRunId({ trainer: a.trainer, pipeline: { ...a.pipeline, run_id: null } });
  assert.equal(id, resolveRunId({ trainer: { ...a.trainer }, pipeline: { ...a.pipeline, run_id: null } }));
  const other = resolveRunId({
    trainer: { ...a.trainer, experiment_name: 'x' },
    pipeline: { ...a.pipeline, run_id: null },
  });
  assert.notEqual(id, other);
  // names whose dashes would make them read alike still get different ids
  const ab = resolveRunId({
    trainer: { ...a.trainer, project_name: 'a-b', experiment_name: 'c' },
    pipeline: { ...a.pipeline, run_id: null },
  });
  const bc = resolveRunId({
    trainer: { ...a.trainer, project_name: 'a', experiment_name: 'b-c' },
    pipeline: { ...a.pipeline, run_id: null },
  });
  assert.notEqual(ab, bc);
});

test('a secret given with the wrong type is not echoed', () => {
  const problems = problemsOf(() =>
    load({ overrides: ['pipeline.store=postgres', 'pipeline.database_url=[postgres://u:hunter2@h/db]'] }),
  );
  assert.ok(
    problems.some((p) =>
      p.includes('pipeline.database_url: expected string or null, got ["postgres://u:***@h/db"] (a list)'),
    ),
    problems.join('\n'),
  );
  assert.ok(!problems.join('\n').includes('hunter2'));
});

test('loadPipelineSection: the pipeline.* overrides over their defaults, other keys ignored, typos and bad values refused with the path', () => {
  const p = loadPipelineSection([
    'data.task=nonsense',
    'pipeline.store=postgres',
    'pipeline.database_url=postgres://u:pw@h/db',
    'trainer.max_steps=oops',
  ]);
  assert.equal(p.store, 'postgres');
  assert.equal(p.database_url, 'postgres://u:pw@h/db');
  assert.equal(p.bus, defaultConfig().pipeline.bus);
  const typo = problemsOf(() => loadPipelineSection(['pipeline.databse_url=postgres://h/db']));
  assert.ok(
    typo.some((x) => x.includes('pipeline.databse_url') && x.includes('pipeline.database_url')),
    typo.join('\n'),
  );
  const bad = problemsOf(() => loadPipelineSection(['pipeline.store=mysql']));
  assert.ok(
    bad.some((x) => x.includes('pipeline.store')),
    bad.join('\n'),
  );
});

test('paths in the config file resolve against its directory; overrides against the working directory', () => {
  const file = yamlFile(
    [
      'data:',
      '  train_files: [data/train.jsonl, /abs/t.jsonl]',
      '  val_files: data/val.jsonl',
      'reward:',
      '  reward_fn_path: ./reward.ts',
      'actor:',
      '  model: { path: ../models/base }',
      'trainer:',
      '  run_dir: runs/mine',
      '',
    ].join('\n'),
  );
  const here = dirname(file);
  const cfg = loadConfig({ env: {}, onWarning: () => undefined, file, overrides: ['data.task=~'] });
  assert.deepEqual(cfg.data.train_files, [join(here, 'data/train.jsonl'), '/abs/t.jsonl']);
  assert.deepEqual(cfg.data.val_files, [join(here, 'data/val.jsonl')]);
  assert.equal(cfg.reward.reward_fn_path, join(here, 'reward.ts'));
  assert.equal(cfg.actor.model.path, resolve(here, '../models/base'));
  assert.equal(cfg.trainer.run_dir, join(here, 'runs/mine'), 'run_dir resolves like every other path in the file');
  const over = loadConfig({
    env: {},
    onWarning: () => undefined,
    file,
    overrides: ['reward.reward_fn_path=my/reward.ts', 'data.val_files=[v.jsonl]'],
  });
  assert.equal(
    over.reward.reward_fn_path,
    resolve('my/reward.ts'),
    'an override resolves against the working directory',
  );
  assert.deepEqual(over.data.val_files, [resolve('v.jsonl')]);
  const runDir = loadConfig({ env: {}, onWarning: () => undefined, file, overrides: ['trainer.run_dir=out/r'] });
  assert.equal(runDir.trainer.run_dir, resolve('out/r'), 'run_dir given on the command line: the working directory');
  assert.deepEqual(over.data.train_files, [join(here, 'data/train.jsonl'), '/abs/t.jsonl']);
});
