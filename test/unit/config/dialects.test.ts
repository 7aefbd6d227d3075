/**
 * EasyR1, verl and MTRL configs: each example translates to exactly the config of its native twin
 * (the object loadConfig returns, every key), batch sizes counted in prompts are multiplied by
 * rollout.n, Hydra-style overrides use the dialect's names, not-applicable keys are listed once,
 * and result-changing settings rlstream cannot honour are refused with one line naming the key
 * and its line. Every key of the published example configs (EasyR1 examples/config.yaml, verl
 * ppo_trainer.yaml, MTRL's README config) is known to its table.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { format } from 'prettier';
import { loadConfig, type Config } from '../../../lib/config/index.ts';
import {
  detectDialect,
  formatTranslation,
  getDialect,
  resolveInterpolations,
  translate,
  type Translation,
} from '../../../lib/config/dialects/index.ts';
import { renderDialectDocs } from '../../../lib/config/dialects/docs.ts';
import { yamlFile, problemsOf, expectOneProblem } from './helpers.ts';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '../../..');
const example = (f: string) => join(ROOT, 'examples/dialects', f);

function load(file: string, overrides: string[] = [], seen?: (t: Translation) => void): Config {
  return loadConfig({ file, overrides, env: {}, onWarning: () => undefined, onTranslation: seen ?? (() => undefined) });
}

/** The config minus trainer.run_dir (verl's default_local_dir is set; the twins leave it). */
function comparable(c: Config): Config {
  return { ...c, trainer: { ...c.trainer, run_dir: null } };
}

/** The one problem line of a failing load that contains `fragment` (other problems may be listed too). */
function problemWith(fn: () => unknown, ...fragments: string[]): string {
  const lines = problemsOf(fn).filter((p) => p.includes(fragments[0]));
  assert.equal(lines.length, 1, `expected one problem with ${fragments[0]}`);
  for (const f of fragments) assert.ok(lines[0].includes(f), `problem\n  ${lines[0]}\nlacks\n  ${f}`);
  return lines[0];
}

const EASYR1_TWIN = `
data:
  task: number_game
  task_size: { train: 4096, val: 128 }
  max_prompt_length: 16
  max_response_length: 2
  rollout_batch_size: 128
  seed: 1
algorithm:
  adv_estimator: grpo
  use_kl_loss: true
  use_kl_in_reward: false
  kl_penalty: low_var_kl
  kl_coef: 1.0e-2
  max_try_make_batch: 20
rollout:
  n: 5
  temperature: 1.0
  top_p: 1.0
  val_override: { temperature: 0.6, top_p: 0.95, n: 1, top_k: -1 }
actor:
  model: { d_model: 64, n_layers: 2, n_heads: 4, n_kv_heads: 4, ffn: 128, max_seq_len: 32, tokenizer: alphabet, init_seed: 1, lora: null }
  optim: { lr: 1.0e-3, lr_scheduler: cosine, weight_decay: 1.0e-2, max_grad_norm: 1.0, lr_warmup_ratio: 0 }
  global_batch_size: 80
  micro_batch_size_per_device_for_update: 80
  micro_batch_size_per_device_for_experience: 80
  ppo_epochs: 4
  threads: 1
reward:
  reward_fn: number_game
trainer:
  project_name: examples
  experiment_name: number-game-easyr1
  logger: [console]
  total_epochs: 2
  max_steps: 50
  val_freq: 5
  val_before_train: true
  val_generations_to_log: 3
  save_freq: 25
  save_limit: 2
`;

test('the EasyR1 number game (worker: sections) is the native config with global_batch_size × rollout.n', () => {
  let t: Translation | null = null;
  const a = load(example('easyr1-number-game.yaml'), [], (x) => (t = x));
  const b = load(yamlFile(EASYR1_TWIN));
  assert.deepEqual(comparable(a), comparable(b));
  assert.equal(a.actor.global_batch_size, 16 * 5, 'EasyR1 counts prompts: 16 × n = 80 samples');
  assert.equal(t!.dialect.name, 'easyr1');
  assert.ok(t!.notApplicable.includes('worker.actor.fsdp.enable_full_shard'));
  assert.ok(t!.notApplicable.includes('worker.rollout.tensor_parallel_size'));
  assert.ok(t!.notApplicable.includes('trainer.n_gpus_per_node'));
  assert.equal(new Set(t!.notApplicable).size, t!.notApplicable.length, 'each listed once');
  // every key of the file appears in the printed translation, each once
  const printed = formatTranslation(t!, 'easyr1-number-game.yaml');
  const lines = printed.split('\n').filter((l) => l.includes(' → '));
  assert.equal(lines.filter((l) => l.startsWith('worker.actor.global_batch_size: 16 ')).length, 1);
  assert.match(printed, /worker\.actor\.global_batch_size: 16 +→ actor\.global_batch_size = 80/);
  assert.match(printed, /worker\.actor\.fsdp\.enable_full_shard: true +→ not applicable here/);
  assert.match(printed, /algorithm\.kl_coef: 0\.01 +→ algorithm\.kl_coef = 0\.01/);
});

const MTRL_TWIN = `
data:
  task: number_game_vision
  task_size: { train: 25600, val: 128 }
  min_pixels: 784
  max_pixels: 12544
  image_factor: 28
  limit_images: 1
  max_prompt_length: 40
  max_response_length: 2
  rollout_batch_size: 128
  seed: 1
algorithm:
  adv_estimator: grpo
  use_kl_loss: true
  use_kl_in_reward: false
  kl_penalty: low_var_kl
  kl_coef: 1.0e-2
  kl_type: fixed
  kl_target: 0.1
  kl_horizon: 10000
  entropy_penalty_coef: 0
  vppo: { enable: true, top_p_perception_tokens: 0.2, enable_entropy_filtering: false, top_p_entropy_tokens: 0.2, advantage_scaling_min: 0.8 }
rollout:
  n: 5
  temperature: 1.0
  top_p: 1.0
  top_k: -1
  val_override: { temperature: 0.6, top_p: 0.95, n: 1, top_k: -1 }
actor:
  model:
    d_model: 64
    n_layers: 2
    n_heads: 4
    n_kv_heads: 4
    ffn: 128
    max_seq_len: 48
    tokenizer: alphabet
    init_seed: 1
    lora: null
    vision: { enable: true, depth: 2, hidden_size: 64, intermediate_size: 128, num_heads: 4, patch_size: 14, spatial_merge_size: 2, init_std: 0.3 }
  optim: { lr: 1.0e-3, lr_scheduler: cosine, weight_decay: 1.0e-2, max_grad_norm: 1.0, vision_lr_scale: 0.25, lr_warmup_steps: 0 }
  entropy_coeff: 0.01
  global_batch_size: 80
  micro_batch_size_per_device_for_update: 80
  micro_batch_size_per_device_for_experience: 80
  ppo_epochs: 4
  threads: 2
reward:
  reward_fn: number_game_vision
trainer:
  project_name: examples
  experiment_name: number-game-vision-vppo-mtrl
  logger: [console]
  total_epochs: 1
  max_steps: 200
  val_freq: 5
  val_before_train: true
  val_generations_to_log: 0
  save_freq: 100
  save_limit: 2
`;

test('the MTRL VPPO vision config (divergence_*, perception filtering) is the native VPPO config', () => {
  let t: Translation | null = null;
  const a = load(example('mtrl-vppo-vision.yaml'), [], (x) => (t = x));
  const b = load(yamlFile(MTRL_TWIN));
  assert.deepEqual(comparable(a), comparable(b));
  assert.equal(t!.dialect.name, 'mtrl');
  assert.ok(t!.notApplicable.includes('worker.actor.fsdp.sharding_strategy'));
  // trajectory reweighting off keeps every advantage (α = 1); perception filtering stays on
  const off = load(example('mtrl-vppo-vision.yaml'), ['optimization.enable_trajectory_reweighting=false']);
  assert.equal(off.algorithm.vppo.advantage_scaling_min, 1);
  assert.equal(off.algorithm.vppo.enable, true);
});

const VERL_TWIN = (dir: string) => `
data:
  train_files: [${dir}/train.parquet]
  val_files: [${dir}/test.parquet]
  prompt_key: prompt
  max_prompt_length: 512
  max_response_length: 256
  rollout_batch_size: 256
  val_batch_size: -1
  shuffle: true
  filter_overlong_prompts: true
  image_key: images
  video_key: videos
  chat_template_kwargs: {}
algorithm:
  gamma: 1.0
  lam: 1.0
  adv_estimator: grpo
  norm_adv_by_std_in_grpo: true
  use_kl_in_reward: false
  kl_penalty: kl
  kl_type: fixed
  kl_horizon: 10000
  kl_target: 0.1
  use_kl_loss: true
  kl_coef: 0.001
  kl_loss_type: low_var_kl
rollout:
  n: 5
  temperature: 1.0
  top_k: -1
  top_p: 1
  val_override: { temperature: 0, top_p: 1.0, top_k: -1, n: 1 }
actor:
  model: { enable_gradient_checkpointing: true, lora: null, d_model: 32, n_layers: 1, n_heads: 2, n_kv_heads: 2, ffn: 64, max_seq_len: 1024 }
  optim: { lr: 1.0e-6, lr_warmup_steps: null, lr_warmup_ratio: 0, min_lr_ratio: 0, lr_scheduler: constant, weight_decay: 0.01, max_grad_norm: 1.0 }
  global_batch_size: 320
  micro_batch_size_per_device_for_update: 4
  micro_batch_size_per_device_for_experience: 16
  clip_ratio_low: 0.2
  clip_ratio_high: 0.2
  clip_ratio_dual: 3.0
  loss_agg_mode: token-mean
  entropy_coeff: 0
  ppo_epochs: 1
critic:
  cliprange_value: 0.5
reward:
  reward_fn: gsm8k
trainer:
  total_epochs: 15
  max_steps: null
  project_name: verl_examples
  experiment_name: gsm8k
  logger: [console]
  val_generations_to_log: 0
  save_freq: 10
  find_last_checkpoint: true
  load_checkpoint_path: null
  val_before_train: false
  val_freq: 10
  save_limit: -1
`;

test('the verl GSM8K config with Hydra overrides is the native config (ppo_mini_batch_size × n, interpolations resolved)', () => {
  const dir = '/data/gsm8k';
  const fresh = [
    // a fresh tiny model instead of a model directory: rlstream keys pass through under actor_rollout_ref.model
    'actor_rollout_ref.model.path=null',
    '+actor_rollout_ref.model.d_model=32',
    'actor_rollout_ref.model.n_layers=1',
    'actor_rollout_ref.model.n_heads=2',
    'actor_rollout_ref.model.n_kv_heads=2',
    'actor_rollout_ref.model.ffn=64',
  ];
  const a = load(example('verl-gsm8k.yaml'), [
    `data.train_files=${dir}/train.parquet`,
    `data.val_files=${dir}/test.parquet`,
    ...fresh,
  ]);
  const b = load(yamlFile(VERL_TWIN(dir)));
  assert.deepEqual(comparable(a), comparable(b));
  assert.equal(a.actor.global_batch_size, 64 * 5);
  // the checkpoint directory came from an interpolation of two trainer keys; as every path in a
  // config file, it resolves against the file's directory
  assert.equal(a.trainer.run_dir, join(dirname(example('verl-gsm8k.yaml')), 'checkpoints/verl_examples/gsm8k'));
  // overrides in verl's names change the source keys: n=8 makes the mini-batch 64 × 8 samples
  const n8 = load(example('verl-gsm8k.yaml'), ['actor_rollout_ref.rollout.n=8', ...fresh]);
  assert.equal(n8.actor.global_batch_size, 64 * 8);
  assert.equal(n8.rollout.n, 8);
});

test('data files: a comma-separated string is a list (file keys against its directory, overrides against the cwd); ~ is home', () => {
  const f = yamlFile(
    'data: { train_files: "a.jsonl, b.jsonl" }\nreward: { reward_fn: exact_match }\ntrainer: { val_before_train: false }\n',
  );
  const c = load(f);
  assert.deepEqual(c.data.train_files, [join(dirname(f), 'a.jsonl'), join(dirname(f), 'b.jsonl')]);
  const o = load(f, ['data.val_files=x.parquet,y.parquet']);
  assert.deepEqual(o.data.val_files, [join(process.cwd(), 'x.parquet'), join(process.cwd(), 'y.parquet')]);
  const v = load(example('verl-gsm8k.yaml'), ['data.train_files=[~/d/a.parquet,~/d/b.parquet]']);
  assert.ok(v.data.train_files.every((p) => !p.includes('~') && p.endsWith('.parquet')));
});

test('reward functions map onto reward_fn_path / reward_fn_name / reward_fn_form in each dialect', () => {
  const tr = (name: string, doc: unknown) => translate(getDialect(name), doc as Record<string, unknown>);
  const e = tr('easyr1', { worker: { reward: { reward_function: './math.py:compute_score' } } });
  assert.deepEqual(e.config.reward, {
    reward_fn_path: './math.py',
    reward_fn_name: 'compute_score',
    reward_fn_form: 'easyr1_batch',
  });
  const s = tr('easyr1', { worker: { reward: { reward_type: 'sequential', score_function: 'r.py:score' } } });
  assert.deepEqual(s.config.reward, {
    reward_fn_path: 'r.py',
    reward_fn_name: 'score',
    reward_fn_form: 'easyr1_sequential',
  });
  const v = tr('verl', { custom_reward_function: { path: 'gsm8k.py', name: 'my_score' } });
  assert.deepEqual(v.config.reward, { reward_fn_path: 'gsm8k.py', reward_fn_name: 'my_score', reward_fn_form: 'verl' });
  const m = tr('mtrl', { worker: { reward: { reward_type: 'function', reward_fn_path: 'reward.py' } } });
  assert.deepEqual(m.config.reward, {
    reward_fn_path: 'reward.py',
    reward_fn_name: 'reward_function',
    reward_fn_form: 'mtrl',
  });
  // and they validate as rlstream's reward keys (the path against the file's directory)
  const f = yamlFile(
    'data: { task: number_game }\nworker:\n  rollout: { n: 2 }\n  actor: { global_batch_size: 2, micro_batch_size_per_device_for_experience: 4 }\n  reward: { reward_function: ./score.py:my_score, reward_type: sequential }\n',
  );
  const c = load(f);
  assert.deepEqual(
    [c.reward.reward_fn_path, c.reward.reward_fn_name, c.reward.reward_fn_form],
    [join(dirname(f), 'score.py'), 'my_score', 'easyr1_sequential'],
  );
  // a JS module runs as rlstream calls one: only the path
  const j = tr('verl', { custom_reward_function: { path: 'score.mjs', name: 'compute_score' } });
  assert.deepEqual(j.config.reward, { reward_fn_path: 'score.mjs' });
});

test('KL: EasyR1 use_kl_loss false is the in-reward penalty; disable_kl turns both off; MTRL names them divergence_*', () => {
  const tr = (name: string, doc: unknown) => translate(getDialect(name), doc as Record<string, unknown>).config;
  assert.deepEqual(
    (tr('easyr1', { algorithm: { use_kl_loss: false } }).algorithm as Record<string, unknown>).use_kl_in_reward,
    true,
  );
  const off = tr('easyr1', { algorithm: { use_kl_loss: true, disable_kl: true } }).algorithm as Record<string, unknown>;
  assert.deepEqual([off.use_kl_loss, off.use_kl_in_reward], [false, false]);
  const m = tr('mtrl', { optimization: { divergence_coef: 0.05, divergence_type: 'adaptive', divergence_target: 6 } })
    .algorithm as Record<string, unknown>;
  assert.deepEqual([m.kl_coef, m.kl_type, m.kl_target, m.use_kl_in_reward], [0.05, 'adaptive', 6, true]);
  // verl: one coefficient for both; different ones are refused
  const v = translate(getDialect('verl'), {
    actor_rollout_ref: { actor: { use_kl_loss: true, kl_loss_coef: 0.01 } },
    algorithm: { use_kl_in_reward: true, kl_ctrl: { kl_coef: 0.02 } },
  });
  assert.equal(v.problems.length, 1);
  assert.match(v.problems[0].text, /^algorithm\.kl_ctrl\.kl_coef: .*one KL coefficient/);
});

test('LoRA and schedulers in each dialect; qlora, LoRA dropout and a Hugging Face reward model are refused with one line', () => {
  const tr = (name: string, text: string) => translate(getDialect(name), parseYaml(text) as Record<string, unknown>);
  const e = tr(
    'easyr1',
    'worker: { actor: { model: { lora: { rank: 8, alpha: 16, target_modules: "q_proj,v_proj" } } } }',
  );
  assert.deepEqual((e.config.actor as { model: unknown }).model, {
    lora: { rank: 8, alpha: 16, target_modules: ['q_proj', 'v_proj'] },
  });
  const mtrlLora = (extra: string) =>
    `dataset: { task: number_game }\nworker:\n  rollout: { n: 2 }\n  actor:\n    model: { peft_type: lora, lora_rank: 4, lora_alpha: 8, lora_target_modules: [q_proj]${extra} }\n    optim: { lr_scheduler_type: constant_with_warmup, warmup_steps: 3 }\n`;
  const m = tr('mtrl', mtrlLora(''));
  const actor = m.config.actor as { model: unknown; optim: unknown };
  assert.deepEqual(actor.model, { lora: { rank: 4, alpha: 8, target_modules: ['q_proj'] } });
  assert.deepEqual(actor.optim, { lr_scheduler: 'constant', lr_warmup_steps: 3 });
  const f = yamlFile(mtrlLora(', lora_dropout: 0.05'));
  problemWith(() => load(f), 'MTRL worker.actor.model.lora_dropout', `${f}:5:`, 'LoRA dropout is not implemented');
  const q = yamlFile(mtrlLora('').replace('peft_type: lora', 'peft_type: qlora'));
  problemWith(() => load(q), 'MTRL worker.actor.model.peft_type', 'QLoRA');
  const verlRm = yamlFile('data: { task: number_game }\nreward_model:\n  enable: true\n');
  problemWith(() => load(verlRm), 'verl reward_model.enable', `${verlRm}:3:3:`, 'Hugging Face reward model');
  const v = tr(
    'verl',
    'actor_rollout_ref:\n  model: { lora_rank: 16, lora_alpha: 32, target_modules: all-linear }\n  actor: { optim: { warmup_style: cosine, lr_warmup_steps_ratio: 0.1, min_lr_ratio: 0.1 } }\n',
  );
  const va = v.config.actor as { model: { lora: unknown }; optim: Record<string, unknown> };
  assert.deepEqual(va.model.lora, { rank: 16, alpha: 32, target_modules: 'all-linear' });
  assert.deepEqual([va.optim.lr_scheduler, va.optim.lr_warmup_ratio, va.optim.min_lr_ratio], ['cosine', 0.1, 0.1]);
});

test('unknown dialect keys, greedy training rollouts and a critic batch of its own are refused, each naming its line', () => {
  const f = yamlFile(
    [
      'data: { task: number_game, train_batch_size: 8 }',
      'actor_rollout_ref:',
      '  actor: { ppo_mini_batch_size: 4, made_up_key: 1 }',
      '  rollout: { n: 2, do_sample: false }',
      'critic: { ppo_mini_batch_size: 2 }',
      '',
    ].join('\n'),
  );
  const problems = problemsOf(() => load(f));
  assert.equal(problems.length, 3, problems.join('\n'));
  assert.match(problems[0], /\.yaml:3:\d+: verl actor_rollout_ref\.actor\.made_up_key: unknown verl key; remove it/);
  assert.match(problems[1], /\.yaml:4:\d+: verl actor_rollout_ref\.rollout\.do_sample: greedy training rollouts/);
  assert.match(problems[2], /\.yaml:5:\d+: verl critic\.ppo_mini_batch_size: 2 differs/);
  // a typo gets the closest key of the dialect (its own keys, or rlstream's under a mapped prefix)
  const t = translate(getDialect('easyr1'), { worker: { actor: { global_batchsize: 4 }, rollout: { temprature: 1 } } });
  assert.deepEqual(
    t.problems.map((p) => p.text),
    [
      'worker.actor.global_batchsize: unknown EasyR1 key — did you mean "worker.actor.global_batch_size"?',
      'worker.rollout.temprature: unknown EasyR1 key — did you mean "worker.rollout.temperature"?',
    ],
  );
});

test('the dialect is recognised by its sections or named; an unknown name lists the valid ones', () => {
  assert.equal(detectDialect({ worker: {}, data: {} })?.name, 'easyr1');
  assert.equal(detectDialect({ worker: {}, optimization: {} })?.name, 'mtrl');
  assert.equal(detectDialect({ actor_rollout_ref: {} })?.name, 'verl');
  assert.equal(detectDialect({ data: {}, actor: {} }), null);
  // a verl file with only sections rlstream shares (data, algorithm, trainer) needs --dialect
  const f = yamlFile('data: { task: number_game, train_batch_size: 8 }\n');
  expectOneProblem(() => load(f), 'data.train_batch_size', 'data.rollout_batch_size');
  const c = loadConfig({
    file: f,
    dialect: 'verl',
    overrides: [
      'actor_rollout_ref.actor.ppo_mini_batch_size=4',
      'actor_rollout_ref.rollout.n=2',
      'actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4',
    ],
    env: {},
    onWarning: () => undefined,
  });
  assert.deepEqual([c.data.rollout_batch_size, c.actor.global_batch_size], [8, 8]);
  assert.throws(() => getDialect('trl'), /unknown config dialect "trl"; valid dialects: mtrl, verl, easyr1/);
});

test('not-applicable keys go to the warning sink as one line when no translation callback is given', () => {
  const warnings: string[] = [];
  loadConfig({ file: example('easyr1-number-game.yaml'), env: {}, onWarning: (w) => warnings.push(w) });
  const na = warnings.filter((w) => w.includes('not applicable here'));
  assert.equal(na.length, 1);
  assert.match(
    na[0],
    /^EasyR1 config: not applicable here .*: data\.filter_overlong_prompts_workers, worker\.actor\.padding_free/,
  );
});

test('algorithm.vppo.enable_entropy_filtering without algorithm.vppo.enable is refused (it would do nothing)', () => {
  expectOneProblem(
    () =>
      loadConfig({
        overrides: ['data.task=number_game', 'algorithm.vppo.enable_entropy_filtering=true'],
        env: {},
        onWarning: () => undefined,
      }),
    'algorithm.vppo.enable_entropy_filtering = true has no effect without algorithm.vppo.enable',
  );
  // MTRL entropy filtering on a text policy: the same line
  const f = yamlFile(
    'dataset: { task: number_game }\noptimization: { enable_entropy_filtering: true }\nworker: { rollout: { n: 2 }, actor: { global_batch_size: 2 } }\n',
  );
  problemWith(() => load(f), 'enable_entropy_filtering = true has no effect');
});

/** Every key of the published example configs (their layout and key names; the values are this test's). */
const PUBLISHED_KEYS: Record<string, string> = {
  easyr1: `
data: { train_files: d@train, val_files: d@test, prompt_key: problem, answer_key: answer, image_key: images, video_key: videos,
  image_dir: null, video_fps: 2.0, max_prompt_length: 64, max_response_length: 64, rollout_batch_size: 8, mini_rollout_batch_size: null,
  val_batch_size: 16, format_prompt: null, override_chat_template: null, shuffle: true, seed: 1, min_pixels: 262144,
  max_pixels: 4194304, filter_overlong_prompts: true }
algorithm: { adv_estimator: grpo, disable_kl: false, use_kl_loss: true, kl_penalty: low_var_kl, kl_coef: 1.0e-2, online_filtering: false,
  filter_key: overall, filter_low: 0.01, filter_high: 0.99 }
worker:
  actor:
    global_batch_size: 8
    micro_batch_size_per_device_for_update: 1
    micro_batch_size_per_device_for_experience: 2
    max_grad_norm: 1.0
    padding_free: true
    dynamic_batching: true
    ulysses_size: 1
    model: { model_path: null, enable_gradient_checkpointing: true, trust_remote_code: false, freeze_vision_tower: false,
      lora: { rank: 0, alpha: 64, target_modules: all-linear, exclude_modules: .*visual.* } }
    optim: { lr: 1.0e-6, weight_decay: 1.0e-2, strategy: adamw, lr_warmup_ratio: 0.0 }
    fsdp: { enable_full_shard: true, enable_cpu_offload: false, enable_rank0_init: true }
    offload: { offload_params: true, offload_optimizer: true }
  rollout: { n: 5, temperature: 1.0, top_p: 1.0, limit_images: 0, gpu_memory_utilization: 0.6, enforce_eager: false,
    enable_chunked_prefill: false, tensor_parallel_size: 2, disable_tqdm: false, val_override_config: { temperature: 0.6, top_p: 0.95, n: 1 } }
  ref:
    fsdp: { enable_full_shard: true, enable_cpu_offload: true, enable_rank0_init: true }
    offload: { offload_params: false }
  reward: { reward_function: ./reward.mjs:compute_score }
trainer: { total_epochs: 15, max_steps: null, project_name: easy_r1, experiment_name: qwen2_5_7b_math_grpo, logger: [file, wandb],
  nnodes: 1, n_gpus_per_node: 8, max_try_make_batch: 20, val_freq: 5, val_before_train: true, val_only: false,
  val_generations_to_log: 3, save_freq: 5, save_limit: 3, save_model_only: false, save_checkpoint_path: null,
  load_checkpoint_path: null, find_last_checkpoint: true }
`,
  mtrl: `
dataset: { train_files: data/train.jsonl, val_files: data/val.jsonl, prompt_key: prompt, answer_key: answer, image_key: images,
  video_key: videos, image_dir: data/images, video_fps: 2.0, min_pixels: 262144, max_pixels: 4194304, max_prompt_length: 512,
  max_response_length: 512, rollout_batch_size: 256, val_batch_size: 64, shuffle: true, seed: 42, filter_overlong_prompts: true }
training: { total_epochs: 10, project_name: mtrl_training, experiment_name: qwen2_vl_7b, logger: [console, wandb], nnodes: 1,
  n_gpus_per_node: 8, save_freq: 500, val_freq: 100, load_checkpoint_path: null, find_last_checkpoint: true, val_only: false,
  val_before_train: true }
optimization: { gamma: 1.0, lam: 0.95, advantage_estimator: gae, disable_divergence: false, use_divergence_loss: false,
  divergence_penalty: kl, divergence_coef: 0.01, divergence_type: adaptive, divergence_target: 6.0, divergence_horizon: 10000.0,
  online_filtering: false, filter_key: overall, filter_low: 0.01, filter_high: 0.99, enable_entropy_filtering: true,
  top_p_entropy_tokens: 0.2, enable_perception_filtering: true, top_p_perception_tokens: 0.2,
  enable_trajectory_reweighting: true, trajectory_scaling_min: 0.8, use_entropy_penalty: false, entropy_penalty_coef: 0.06 }
worker:
  hybrid_engine: true
  actor:
    model: { model_path: null, trust_remote_code: true, enable_gradient_checkpointing: true, peft_type: lora, lora_rank: 8,
      lora_alpha: 16, lora_dropout: 0, lora_target_modules: [q_proj, v_proj] }
    optim: { lr: 5.0e-7, weight_decay: 0.01, warmup_steps: 10, lr_scheduler_type: constant_with_warmup, betas: [0.9, 0.95] }
    fsdp: { sharding_strategy: FULL_SHARD, mixed_precision_dtype: bf16, cpu_offload: false }
    offload: { offload_params: true, offload_optimizer: true }
    global_batch_size: 256
    micro_batch_size_per_device_for_update: 2
    micro_batch_size_per_device_for_experience: 8
    ppo_epochs: 1
    clip_ratio_low: 0.2
    clip_ratio_high: 0.3
    clip_ratio_dual: 3.0
    max_grad_norm: 1.0
    padding_free: true
    dynamic_batching: true
    ulysses_size: 1
    use_torch_compile: true
  rollout: { name: vllm, gpu_memory_utilization: 0.4, temperature: 1.0, top_p: 1.0, top_k: -1, max_new_tokens: 512,
    tensor_parallel_size: 1, enable_prefix_caching: false }
  reward: { reward_type: function, reward_fn_path: reward.mjs, num_cpus: 4 }
`,
  verl: `
data: { tokenizer: null, train_files: ~/data/gsm8k/train.parquet, val_files: ~/data/gsm8k/test.parquet, prompt_key: prompt,
  reward_fn_key: data_source, max_prompt_length: 64, max_response_length: 64, train_batch_size: 8, val_batch_size: null,
  return_raw_input_ids: false, return_raw_chat: false, shuffle: true, filter_overlong_prompts: false,
  filter_overlong_prompts_workers: 1, truncation: error, image_key: images, video_key: videos, custom_cls: { path: null, name: null } }
actor_rollout_ref:
  hybrid_engine: true
  model: { path: null, external_lib: null, override_config: {}, enable_gradient_checkpointing: true, use_remove_padding: false,
    use_liger: false, return_last_hidden_state: false, use_fused_loss: false }
  actor:
    strategy: fsdp
    ppo_mini_batch_size: 8
    ppo_micro_batch_size: null
    ppo_micro_batch_size_per_gpu: null
    use_dynamic_bsz: false
    ppo_max_token_len_per_gpu: 16384
    grad_clip: 1.0
    clip_ratio: 0.2
    clip_ratio_low: 0.2
    clip_ratio_high: 0.2
    clip_ratio_c: 3.0
    loss_agg_mode: token-mean
    entropy_coeff: 0
    use_kl_loss: false
    use_torch_compile: true
    kl_loss_coef: 0.001
    kl_loss_type: low_var_kl
    ppo_epochs: 1
    shuffle: false
    ulysses_sequence_parallel_size: 1
    checkpoint: { contents: [model, optimizer, extra] }
    optim: { lr: 1e-6, lr_warmup_steps: -1, lr_warmup_steps_ratio: 0., min_lr_ratio: null, warmup_style: constant,
      total_training_steps: -1, weight_decay: 0.01 }
    fsdp_config: { wrap_policy: { min_num_params: 0 }, param_offload: false, optimizer_offload: false, offload_policy: false,
      reshard_after_forward: true, fsdp_size: -1 }
  ref:
    strategy: fsdp
    fsdp_config: { param_offload: false, reshard_after_forward: true, wrap_policy: { min_num_params: 0 } }
    use_torch_compile: \${actor_rollout_ref.actor.use_torch_compile}
    log_prob_micro_batch_size: null
    log_prob_micro_batch_size_per_gpu: null
    log_prob_use_dynamic_bsz: \${actor_rollout_ref.actor.use_dynamic_bsz}
    log_prob_max_token_len_per_gpu: \${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}
    ulysses_sequence_parallel_size: \${actor_rollout_ref.actor.ulysses_sequence_parallel_size}
  rollout:
    name: vllm
    mode: sync
    chat_scheduler: null
    temperature: 1.0
    top_k: -1
    top_p: 1
    use_fire_sampling: false
    prompt_length: \${data.max_prompt_length}
    response_length: \${data.max_response_length}
    dtype: bfloat16
    gpu_memory_utilization: 0.5
    ignore_eos: false
    enforce_eager: true
    free_cache_engine: true
    load_format: dummy_dtensor
    tensor_model_parallel_size: 2
    max_num_batched_tokens: 8192
    max_model_len: null
    max_num_seqs: 1024
    log_prob_micro_batch_size: null
    log_prob_micro_batch_size_per_gpu: null
    log_prob_use_dynamic_bsz: \${actor_rollout_ref.actor.use_dynamic_bsz}
    log_prob_max_token_len_per_gpu: \${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}
    disable_log_stats: true
    enable_chunked_prefill: true
    do_sample: true
    n: 2
    engine_kwargs: { swap_space: null }
    val_kwargs: { top_k: -1, top_p: 1.0, temperature: 0, n: 1, do_sample: false }
    multi_turn: { enable: false, max_turns: null, tool_config_path: null, format: chatml }
critic:
  rollout_n: \${actor_rollout_ref.rollout.n}
  strategy: fsdp
  optim: { lr: 1e-5, lr_warmup_steps_ratio: 0., min_lr_ratio: null, warmup_style: constant, total_training_steps: -1, weight_decay: 0.01 }
  model: { path: null, tokenizer_path: null, override_config: {}, external_lib: '\${actor_rollout_ref.model.external_lib}',
    enable_gradient_checkpointing: true, use_remove_padding: false,
    fsdp_config: { param_offload: false, optimizer_offload: false, offload_policy: false, reshard_after_forward: true,
      wrap_policy: { min_num_params: 0 }, fsdp_size: -1 } }
  ppo_mini_batch_size: \${actor_rollout_ref.actor.ppo_mini_batch_size}
  ppo_micro_batch_size: null
  ppo_micro_batch_size_per_gpu: null
  forward_micro_batch_size: \${critic.ppo_micro_batch_size}
  forward_micro_batch_size_per_gpu: \${critic.ppo_micro_batch_size_per_gpu}
  use_dynamic_bsz: \${actor_rollout_ref.actor.use_dynamic_bsz}
  ppo_max_token_len_per_gpu: 32768
  forward_max_token_len_per_gpu: \${critic.ppo_max_token_len_per_gpu}
  ulysses_sequence_parallel_size: 1
  ppo_epochs: \${actor_rollout_ref.actor.ppo_epochs}
  shuffle: \${actor_rollout_ref.actor.shuffle}
  grad_clip: 1.0
  cliprange_value: 0.5
  checkpoint: { contents: [model, optimizer, extra] }
reward_model:
  enable: false
  strategy: fsdp
  model: { input_tokenizer: '\${actor_rollout_ref.model.path}', path: ~/models/rm, external_lib: null, use_remove_padding: false,
    fsdp_config: { wrap_policy: { min_num_params: 0 }, param_offload: false, reshard_after_forward: true, fsdp_size: -1 } }
  micro_batch_size: null
  micro_batch_size_per_gpu: null
  max_length: null
  ulysses_sequence_parallel_size: 1
  use_dynamic_bsz: \${critic.use_dynamic_bsz}
  forward_max_token_len_per_gpu: \${critic.forward_max_token_len_per_gpu}
  reward_manager: naive
  launch_reward_fn_async: false
custom_reward_function: { path: reward.mjs, name: compute_score }
algorithm: { gamma: 1.0, lam: 1.0, adv_estimator: grpo, norm_adv_by_std_in_grpo: true, use_kl_in_reward: false, kl_penalty: kl,
  kl_ctrl: { type: fixed, kl_coef: 0.001, horizon: 10000, target_kl: 0.1 } }
trainer: { balance_batch: true, total_epochs: 30, total_training_steps: null, project_name: verl_examples, experiment_name: gsm8k,
  logger: [console, wandb], log_val_generations: 0, rollout_data_dir: null, validation_data_dir: null, nnodes: 1,
  n_gpus_per_node: 8, save_freq: -1, resume_mode: auto, resume_from_path: null, val_before_train: true, test_freq: -1,
  critic_warmup: 0, default_hdfs_dir: null, del_local_ckpt_after_load: false,
  default_local_dir: 'checkpoints/\${trainer.project_name}/\${trainer.experiment_name}', max_actor_ckpt_to_keep: null,
  max_critic_ckpt_to_keep: null, ray_wait_register_center_timeout: 300 }
ray_init: { num_cpus: null }
`,
};

test("every key of EasyR1's, verl's and MTRL's published example configs is known to its table", () => {
  for (const [name, text] of Object.entries(PUBLISHED_KEYS)) {
    const doc = parseYaml(text) as Record<string, unknown>;
    assert.equal(detectDialect(doc)?.name, name);
    assert.deepEqual(resolveInterpolations(doc), []);
    const t = translate(getDialect(name), doc);
    assert.deepEqual(
      t.problems.map((p) => p.text),
      [],
      `${name}: every key is translated, not applicable, or refused for a reason`,
    );
    // the translation is complete: each leaf key of the document is one entry (or under one)
    const leaves: string[] = [];
    const walk = (o: unknown, p: string[]) => {
      if (o !== null && typeof o === 'object' && !Array.isArray(o) && Object.keys(o).length > 0)
        for (const [k, v] of Object.entries(o)) walk(v, [...p, k]);
      else leaves.push(p.join('.'));
    };
    walk(doc, []);
    for (const leaf of leaves)
      assert.ok(
        t.entries.some((e) => leaf === e.from || leaf.startsWith(`${e.from}.`)),
        `${name}: ${leaf} has an entry in the translation`,
      );
    // and the whole config loads (a fresh model instead of the published model directories: no
    // LoRA or VPPO, which need one)
    const noModelDir: Record<string, string[]> = {
      mtrl: [
        'worker.actor.model.peft_type=null',
        'optimization.enable_perception_filtering=false',
        'optimization.enable_entropy_filtering=false',
        'optimization.enable_trajectory_reweighting=false',
      ],
    };
    const c = load(yamlFile(text), noModelDir[name] ?? []);
    assert.ok(c.actor.global_batch_size > 0);
  }
});

test('docs/dialects.md is generated from the tables and current', async () => {
  const want = await format(renderDialectDocs(), { parser: 'markdown', printWidth: 120, proseWrap: 'preserve' });
  assert.equal(
    readFileSync(join(ROOT, 'docs/dialects.md'), 'utf8'),
    want,
    'docs/dialects.md is stale: node --import tsx scripts/gen-dialect-docs.ts',
  );
});

test('rlstream config --print-translation prints each key of the file once, then the resolved config', async () => {
  const { configCommand } = await import('../../../app/cli/commands/config.ts');
  const out: string[] = [];
  const err: string[] = [];
  const write = process.stdout.write.bind(process.stdout);
  const error = console.error;
  process.stdout.write = ((s: string) => (out.push(String(s)), true)) as typeof process.stdout.write;
  console.error = (...a: unknown[]) => void err.push(a.join(' '));
  try {
    const file = example('mtrl-vppo-vision.yaml');
    assert.equal(
      await configCommand.run([
        file,
        '--print-translation',
        'worker.rollout.n=4',
        'worker.actor.micro_batch_size_per_device_for_update=16',
        'worker.actor.micro_batch_size_per_device_for_experience=16',
      ]),
      0,
    );
    assert.equal(await configCommand.run([file, '--dialect', 'mtrl']), 0);
  } finally {
    process.stdout.write = write;
    console.error = error;
  }
  const text = out.join('');
  assert.match(text, /^# MTRL config .*mtrl-vppo-vision\.yaml → rlstream/);
  assert.match(text, /\nworker\.actor\.global_batch_size: 16 +→ actor\.global_batch_size = 64 /);
  assert.match(text, /\noptimization\.divergence_coef: 0\.01 +→ algorithm\.kl_coef = 0\.01\n/);
  assert.match(text, /\nworker\.rollout\.tensor_parallel_size: 1 +→ not applicable here\n/);
  assert.match(text, /\ntraining\.val_generations_to_log: 0 +→ trainer\.val_generations_to_log = 0 \(MTRL default\)\n/);
  assert.match(text, /# resolved configuration/);
  // without --print-translation: the not-applicable keys once, on stderr
  assert.equal(err.filter((l) => l.includes('not applicable here')).length, 1);
});
