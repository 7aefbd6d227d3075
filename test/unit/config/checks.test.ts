import { test } from 'node:test';
import assert from 'node:assert/strict';
import { dirname, join } from 'node:path';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { loadConfig } from '../../../lib/config/index.ts';
import { actorHasVisionTower, divisorsNear, orList, resumeConfigDiff } from '../../../lib/config/checks.ts';
import { PERTURBATIONS } from '../../../lib/config/schema.ts';
import { perturbations } from '../../../lib/data/perturb.ts';
import { load, expectOneProblem, problemsOf, yamlFile } from './helpers.ts';

test('divisor suggestions are the divisors nearest the current value', () => {
  assert.deepEqual(divisorsNear(40, 16), [8, 10, 20, 40]);
  assert.deepEqual(divisorsNear(16, 3), [1, 2, 4, 8]);
  assert.equal(orList([8, 10, 20, 40]), '8, 10, 20 or 40');
  assert.equal(orList([4]), '4');
});

test('samples per step must be a multiple of actor.global_batch_size', () => {
  expectOneProblem(
    () =>
      load({
        overrides: [
          'data.rollout_batch_size=8',
          'actor.global_batch_size=16',
          'actor.micro_batch_size_per_device_for_experience=8',
        ],
      }),
    'data.rollout_batch_size × rollout.n = 8 × 5 = 40 samples per step is not a multiple of actor.global_batch_size = 16; set actor.global_batch_size to a divisor of 40 such as 8, 10, 20 or 40',
  );
});

test('actor.global_batch_size may not exceed the samples per step', () => {
  expectOneProblem(
    () =>
      load({
        overrides: [
          'data.rollout_batch_size=8',
          'actor.global_batch_size=80',
          'actor.micro_batch_size_per_device_for_experience=8',
        ],
      }),
    'actor.global_batch_size = 80 is larger than the data.rollout_batch_size × rollout.n = 8 × 5 = 40 samples per step; set actor.global_batch_size to a divisor of 40 such as',
  );
});

test('micro batch sizes must divide actor.global_batch_size', () => {
  expectOneProblem(
    () => load({ overrides: ['actor.micro_batch_size_per_device_for_update=3'] }),
    'actor.micro_batch_size_per_device_for_update = 3 does not divide actor.global_batch_size = 128; set actor.micro_batch_size_per_device_for_update to a divisor of 128 such as 1, 2, 4 or 8',
  );
  expectOneProblem(
    () => load({ overrides: ['actor.micro_batch_size_per_device_for_experience=24'] }),
    'actor.micro_batch_size_per_device_for_experience = 24 does not divide actor.global_batch_size = 128; set actor.micro_batch_size_per_device_for_experience to a divisor of 128 such as 8, 16, 32 or 64',
  );
});

test('clip_ratio_dual must be > 1', () => {
  expectOneProblem(
    () => load({ overrides: ['actor.clip_ratio_dual=1'] }),
    'actor.clip_ratio_dual = 1 must be greater than 1',
    'set actor.clip_ratio_dual to e.g. 3.0',
  );
  assert.equal(load({ overrides: ['actor.clip_ratio_dual=1.5'] }).actor.clip_ratio_dual, 1.5);
});

test('gae needs the critic', () => {
  expectOneProblem(
    () => load({ overrides: ['algorithm.adv_estimator=gae', 'critic.enable=false'] }),
    'algorithm.adv_estimator = gae needs a value function, but critic.enable = false; set critic.enable=true (or leave it unset)',
  );
});

test('a critic without gae is a warning', () => {
  const warnings: string[] = [];
  load({ overrides: ['critic.enable=true'] }, warnings);
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /critic.enable = true but algorithm.adv_estimator = grpo does not use values/);
});

test('group estimators need rollout.n ≥ 2', () => {
  for (const est of ['grpo', 'rloo', 'grpo_passk']) {
    expectOneProblem(
      () => load({ overrides: [`algorithm.adv_estimator=${est}`, 'rollout.n=1', 'data.rollout_batch_size=128'] }),
      `algorithm.adv_estimator = ${est} compares the rollout.n responses to each prompt, but rollout.n = 1`,
      'set rollout.n to 2 or more',
    );
  }
  assert.equal(
    load({ overrides: ['algorithm.adv_estimator=remax', 'rollout.n=1', 'data.rollout_batch_size=128'] }).rollout.n,
    1,
  );
});

test('kafka needs brokers, in host:port form', () => {
  expectOneProblem(
    () => load({ overrides: ['pipeline.bus=kafka'] }),
    'pipeline.bus = kafka needs pipeline.brokers; set pipeline.brokers=[host:9092]',
  );
  expectOneProblem(
    () => load({ overrides: ['pipeline.bus=kafka', 'pipeline.brokers=[localhost]'] }),
    'pipeline.brokers: "localhost" is not host:port',
  );
  assert.deepEqual(
    load({ overrides: ['pipeline.bus=kafka', 'pipeline.brokers=[a:9092, "[::1]:9093"]'] }).pipeline.brokers,
    ['a:9092', '[::1]:9093'],
  );
});

test('kafka client settings are consistent', () => {
  const k = ['pipeline.bus=kafka', 'pipeline.brokers=[a:9092]'];
  expectOneProblem(
    () => load({ overrides: [...k, 'pipeline.kafka.acks=1'] }),
    'pipeline.kafka.idempotent = true requires pipeline.kafka.acks = all, got 1',
  );
  expectOneProblem(
    () => load({ overrides: [...k, 'pipeline.kafka.heartbeat_interval_ms=6000'] }),
    'pipeline.kafka.heartbeat_interval_ms = 6000 must be below pipeline.kafka.session_timeout_ms = 6000; set heartbeat_interval_ms to at most 2000',
  );
  const warnings: string[] = [];
  load({ overrides: [...k, 'rollout.replicas=3'] }, warnings);
  assert.deepEqual(warnings, [
    'rollout.replicas = 3 exceeds pipeline.partitions = 1: only 1 replica(s) receive prompts; set pipeline.partitions ≥ 3',
  ]);
});

test('postgres needs a postgres:// database_url', () => {
  expectOneProblem(
    () => load({ overrides: ['pipeline.store=postgres'] }),
    'pipeline.store = postgres needs pipeline.database_url; set it to postgres://user:password@host:5432/db',
  );
  const p = expectOneProblem(
    () => load({ overrides: ['pipeline.store=postgres', 'pipeline.database_url=mysql://root:topsecret@h/db'] }),
    'is not a postgres:// or postgresql:// URL',
  );
  assert.ok(!p.includes('topsecret'), p);
});

test('a stage lease over PostgreSQL outlasts two heartbeats', () => {
  const pg = ['pipeline.store=postgres', 'pipeline.database_url=postgres://u@h/db'];
  expectOneProblem(
    () => load({ overrides: [...pg, 'pipeline.heartbeat_seconds=10', 'pipeline.lease_seconds=15'] }),
    'pipeline.lease_seconds = 15 must be at least twice pipeline.heartbeat_seconds = 10 (one late heartbeat must not make a live run look stale); set lease_seconds to 20 or more',
  );
  assert.equal(
    load({ overrides: [...pg, 'pipeline.heartbeat_seconds=0.2', 'pipeline.lease_seconds=0.8'] }).pipeline.lease_seconds,
    0.8,
  );
  // the resume check lets both change (they give no stored state a meaning)
  assert.deepEqual(
    resumeConfigDiff(
      JSON.parse(JSON.stringify(load({ overrides: pg }))),
      load({ overrides: [...pg, 'pipeline.lease_seconds=60'] }),
    ),
    { safe: [], unsafe: [] },
  );
});

test('confluent framing needs the schema registry', () => {
  expectOneProblem(
    () => load({ overrides: ['pipeline.schema_wire_format=confluent'] }),
    'pipeline.schema_wire_format = confluent needs pipeline.schema_registry_url',
  );
});

test('validation needs validation data', () => {
  const file = yamlFile('data:\n  train_files: [t.jsonl]\nreward:\n  reward_fn: exact_match\n');
  expectOneProblem(
    () => loadConfig({ file, env: {} }),
    'trainer.val_before_train = true needs validation data, but there is none; set data.val_files, or turn validation off with trainer.val_before_train=false',
  );
  expectOneProblem(
    () => loadConfig({ file, overrides: ['trainer.val_before_train=false', 'trainer.val_freq=5'], env: {} }),
    'trainer.val_freq = 5 needs validation data',
    'trainer.val_freq=-1',
  );
  assert.equal(loadConfig({ file, overrides: ['trainer.val_before_train=false'], env: {} }).trainer.val_freq, -1);
  expectOneProblem(
    () => load({ overrides: ['data.task_size.val=0'] }),
    'needs validation data',
    'set data.task_size.val to 1 or more',
  );
});

test('training data is required unless val_only', () => {
  expectOneProblem(
    () => loadConfig({ overrides: ['reward.reward_fn=exact_match', 'trainer.val_before_train=false'], env: {} }),
    'no training data: set data.train_files (JSONL or parquet files) or data.task',
  );
  const cfg = loadConfig({
    overrides: ['trainer.val_only=true', 'data.val_files=v.jsonl', 'reward.reward_fn=exact_match'],
    env: {},
  });
  assert.equal(cfg.trainer.val_only, true);
});

test('data.task: known names only, not together with files', () => {
  expectOneProblem(
    () => load({ overrides: ['data.task=number_gam'] }),
    'data.task = "number_gam" is not a built-in task (valid: arithmetic, guess_number, number_game, number_game_vision) — did you mean "number_game"?',
  );
  expectOneProblem(
    () => load({ overrides: ['data.train_files=[t.jsonl]'] }),
    'data.task = "number_game" generates its own rows, but data.train_files is also set; remove data.train_files or unset data.task',
  );
});

test('prompt + response must fit the model', () => {
  expectOneProblem(
    () => load({ overrides: ['data.max_response_length=600'] }),
    'data.max_prompt_length + data.max_response_length = 512 + 600 = 1112 exceeds actor.model.max_seq_len = 1024; set actor.model.max_seq_len to at least 1112',
  );
  expectOneProblem(
    () => load({ overrides: ['algorithm.adv_estimator=gae', 'critic.model.max_seq_len=512'] }),
    'exceeds critic.model.max_seq_len = 512; set critic.model.max_seq_len to at least 1024',
  );
});

test('model heads: divide d_model, even head size, kv heads divide heads', () => {
  expectOneProblem(
    () => load({ overrides: ['actor.model.n_heads=5', 'actor.model.n_kv_heads=5'] }),
    'actor.model.d_model = 64 is not a multiple of actor.model.n_heads = 5; set actor.model.n_heads to 2, 4, 8 or 16',
  );
  expectOneProblem(
    () => load({ overrides: ['actor.model.d_model=48', 'actor.model.n_heads=16', 'actor.model.n_kv_heads=4'] }),
    'actor.model: the head size d_model / n_heads = 48 / 16 = 3 must be even for rotary embeddings; set actor.model.n_heads to',
  );
  expectOneProblem(
    () => load({ overrides: ['actor.model.n_kv_heads=3'] }),
    'actor.model.n_kv_heads = 3 does not divide actor.model.n_heads = 4; set actor.model.n_kv_heads to a divisor of 4 such as',
  );
});

test('alphabet tokenizer needs characters, each once', () => {
  expectOneProblem(
    () =>
      loadConfig({
        overrides: [
          'data.train_files=t.jsonl',
          'data.val_files=v.jsonl',
          'reward.reward_fn=exact_match',
          'actor.model.tokenizer=alphabet',
        ],
        env: {},
      }),
    'actor.model.tokenizer = alphabet needs the characters: set actor.model.alphabet',
  );
  assert.equal(
    load({ overrides: ['actor.model.tokenizer=alphabet'] }).actor.model.alphabet,
    '0123456789 :',
    'data.task supplies the alphabet',
  );
  expectOneProblem(
    () => load({ overrides: ['actor.model.tokenizer=alphabet', 'actor.model.alphabet=abca'] }),
    'actor.model.alphabet repeats "a"',
  );
});

test('online filtering bounds', () => {
  expectOneProblem(
    () =>
      load({ overrides: ['algorithm.online_filtering=true', 'algorithm.filter_low=0.9', 'algorithm.filter_high=0.5'] }),
    'algorithm.filter_low = 0.9 must be below algorithm.filter_high = 0.5',
  );
});

test('overlong shaping needs a buffer that fits', () => {
  expectOneProblem(
    () => load({ overrides: ['algorithm.overlong.enable=true'] }),
    'algorithm.overlong.buffer_length = 0 must be between 1 and algorithm.overlong.max_length − 1 = 511',
  );
  expectOneProblem(
    () =>
      load({
        overrides: [
          'algorithm.overlong.enable=true',
          'algorithm.overlong.buffer_length=64',
          'algorithm.overlong.max_length=1000',
        ],
      }),
    'algorithm.overlong.max_length = 1000 exceeds data.max_response_length = 512',
  );
});

test('KL settings that do not do what they say are warnings', () => {
  const w1: string[] = [];
  load({ overrides: ['algorithm.use_kl_in_reward=true'] }, w1);
  assert.equal(w1.length, 1);
  assert.match(w1[0], /penalised twice/);
  const w2: string[] = [];
  load({ overrides: ['algorithm.kl_type=adaptive'] }, w2);
  assert.equal(w2.length, 1);
  assert.match(w2[0], /kl_type = adaptive only adapts the in-reward KL coefficient/);
});

test('function rewards: one of reward_fn / reward_fn_path, known names', () => {
  const files = ['data.train_files=t.jsonl', 'data.val_files=v.jsonl'];
  expectOneProblem(
    () => loadConfig({ overrides: files, env: {} }),
    'reward.type = function needs a reward function: set reward.reward_fn (built-in: arithmetic, exact_match, format, gsm8k, number_game, number_game_vision) or reward.reward_fn_path',
  );
  expectOneProblem(
    () => loadConfig({ overrides: [...files, 'reward.reward_fn=exact_matc'], env: {} }),
    'unknown reward.reward_fn "exact_matc" (valid: arithmetic, exact_match, format, gsm8k, number_game, number_game_vision, or set reward.reward_fn_path to your module) — did you mean "exact_match"?',
  );
  expectOneProblem(
    () => loadConfig({ overrides: [...files, 'reward.reward_fn=exact_match', 'reward.reward_fn_path=r.ts'], env: {} }),
    'reward.reward_fn and reward.reward_fn_path are both set; keep one',
  );
  assert.equal(loadConfig({ overrides: [...files, 'reward.reward_fn_path=r.ts'], env: {} }).reward.reward_fn, null);
});

test('remote rewards: endpoints, URLs, ports, backoff, mapping', () => {
  const r = ['reward.type=remote'];
  expectOneProblem(
    () => load({ overrides: r }),
    'reward.type = remote needs server endpoints: set reward.remote.urls=[http://host:port, …] or reward.remote.host',
  );
  expectOneProblem(
    () => load({ overrides: [...r, 'reward.remote.urls=[http://a:1]', 'reward.remote.host=a'] }),
    'reward.remote.urls and reward.remote.host are both set',
  );
  expectOneProblem(
    () => load({ overrides: [...r, 'reward.remote.urls=[ftp://a:1]'] }),
    'reward.remote.urls: "ftp://a:1" is not an http:// or https:// URL',
  );
  expectOneProblem(
    () =>
      load({ overrides: [...r, 'reward.remote.host=a', 'reward.remote.start_port=65535', 'reward.remote.count=2'] }),
    'reward.remote.start_port + count − 1 = 65536 exceeds port 65535',
  );
  const ok = [...r, 'reward.remote.host=a'];
  expectOneProblem(
    () => load({ overrides: [...ok, 'reward.remote.backoff_initial_ms=20000'] }),
    'reward.remote.backoff_initial_ms = 20000 exceeds reward.remote.backoff_max_ms = 10000',
  );
  expectOneProblem(
    () => load({ overrides: [...ok, 'reward.remote.response_mapping.weights={}'] }),
    'reward.remote.response_mapping.weights is empty',
  );
  expectOneProblem(
    () => load({ overrides: [...ok, 'reward.remote.response_mapping.range=[1, 0]'] }),
    'reward.remote.response_mapping.range = [1, 0] must have low < high',
  );
  expectOneProblem(
    () => load({ overrides: [...ok, 'reward.remote.request_template={}'] }),
    'reward.remote.request_template is empty',
  );
  const cfg = load({ overrides: [...ok, 'reward.remote.request_template={img: image_base64_png, q: prompt_text}'] });
  assert.deepEqual(cfg.reward.remote.request_template, { img: 'image_base64_png', q: 'prompt_text' });
  assert.equal(cfg.reward.remote.enabled, true);
});

test('remote auth token: only the variable name is configured; a missing variable is a warning', () => {
  const o = ['reward.type=remote', 'reward.remote.host=a', 'reward.remote.auth_token_env=RM_TOKEN'];
  const w: string[] = [];
  load({ overrides: o }, w);
  assert.equal(w.length, 1);
  assert.match(w[0], /reward.remote.auth_token_env = RM_TOKEN, but that environment variable is not set/);
  const w2: string[] = [];
  load({ overrides: o, env: { RM_TOKEN: 'x' } }, w2);
  assert.deepEqual(w2, []);
  expectOneProblem(
    () => load({ overrides: ['reward.remote.auth_token_env=not a name'] }),
    'reward.remote.auth_token_env: "not a name" (a string) — must be an environment variable name',
  );
});

test('reward model needs its path', () => {
  expectOneProblem(() => load({ overrides: ['reward.type=model'] }), 'reward.type = model needs reward.model.path');
});

test('cross-field problems are reported together', () => {
  const problems = problemsOf(() =>
    load({ overrides: ['pipeline.bus=kafka', 'pipeline.store=postgres', 'actor.clip_ratio_dual=0.5'] }),
  );
  assert.equal(problems.length, 3);
});

test('full KL is refused as the KL loss and as the in-reward penalty (the pipeline carries per-token log-probs only)', () => {
  expectOneProblem(
    () => load({ overrides: ['algorithm.kl_penalty=full'] }),
    'algorithm.kl_loss_type = full (it defaults to algorithm.kl_penalty) cannot be the KL loss',
    'use low_var_kl (k3), kl (k1), abs or mse (k2)',
  );
  expectOneProblem(
    () => load({ overrides: ['algorithm.kl_loss_type=full'] }),
    'algorithm.kl_loss_type = full (it defaults to algorithm.kl_penalty) cannot be the KL loss',
  );
  expectOneProblem(
    () =>
      load({
        overrides: ['algorithm.use_kl_loss=false', 'algorithm.use_kl_in_reward=true', 'algorithm.kl_penalty=full'],
      }),
    'algorithm.kl_penalty = full cannot be the in-reward KL penalty',
  );
  // full as the penalty is fine when a KL loss of another type is used and there is no in-reward KL
  assert.equal(
    load({ overrides: ['algorithm.kl_penalty=full', 'algorithm.kl_loss_type=low_var_kl'] }).algorithm.kl_penalty,
    'full',
  );
});

test('VPPO is refused with a text-only actor, saying why, and accepted with a vision tower', () => {
  expectOneProblem(
    () => load({ overrides: ['data.task=number_game_vision', 'algorithm.vppo.enable=true'] }),
    'algorithm.vppo.enable = true needs a vision-language actor',
    'a freshly initialised actor is text-only',
    'set algorithm.vppo.enable=false',
  );
  const dir = mkdtempSync(join(tmpdir(), 'vppo-vlm-'));
  try {
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ model_type: 'qwen2' }));
    expectOneProblem(
      () =>
        load({ overrides: ['data.task=number_game_vision', 'algorithm.vppo.enable=true', `actor.model.path=${dir}`] }),
      `${dir}/config.json has no vision_config`,
    );
    assert.equal(actorHasVisionTower(load({ overrides: [`actor.model.path=${dir}`] }).actor.model), false);
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ model_type: 'qwen2', vision_config: { depth: 2 } }));
    // the base config's task is the text-only number game
    expectOneProblem(
      () => load({ overrides: ['algorithm.vppo.enable=true', `actor.model.path=${dir}`] }),
      'data.task = number_game makes text-only prompts; use a vision task (number_game_vision)',
    );
    expectOneProblem(
      () =>
        load({
          overrides: [
            'data.task=number_game_vision',
            'data.limit_images=0',
            'algorithm.vppo.enable=true',
            `actor.model.path=${dir}`,
          ],
        }),
      'data.limit_images = 0 allows none',
    );
    const cfg = load({
      overrides: ['data.task=number_game_vision', 'algorithm.vppo.enable=true', `actor.model.path=${dir}`],
    });
    assert.equal(cfg.algorithm.vppo.enable, true);
    assert.equal(actorHasVisionTower(cfg.actor.model), true);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  // a fresh policy: the actor.model.vision section always exists (defaults); only enable makes a tower
  assert.equal(actorHasVisionTower(load({}).actor.model), false);
  const fresh = load({
    overrides: [
      'data.task=number_game_vision',
      'algorithm.vppo.enable=true',
      'actor.model.vision.enable=true',
      'data.image_factor=28',
    ],
  });
  assert.equal(actorHasVisionTower(fresh.actor.model), true);
});

test('algorithm.vppo.perturbation lists exactly the perturbation registry', () => {
  assert.deepEqual([...PERTURBATIONS].sort(), perturbations.names());
  expectOneProblem(() => load({ overrides: ['algorithm.vppo.perturbation=mask'] }), 'algorithm.vppo.perturbation');
});

test('image sizing: min_pixels may not exceed max_pixels, max_pixels holds one grid cell; image_dir resolves like the data files; kernels are named', () => {
  expectOneProblem(
    () => load({ overrides: ['data.min_pixels=5000', 'data.max_pixels=4000'] }),
    'data.min_pixels = 5000 is over data.max_pixels = 4000; images are resized to a pixel count between them',
  );
  expectOneProblem(
    () => load({ overrides: ['data.min_pixels=100', 'data.max_pixels=500'] }),
    'data.max_pixels = 500 is under one 28×28 patch cell (data.image_factor); raise it',
  );
  const file = yamlFile(
    'data:\n  train_files: [t.jsonl]\n  image_dir: pics\n  image_resample: lanczos3\nreward:\n  reward_fn: exact_match\ntrainer:\n  val_before_train: false\n',
  );
  const cfg = loadConfig({ file, env: {} });
  assert.equal(cfg.data.image_dir, join(dirname(file), 'pics'));
  assert.deepEqual(
    [cfg.data.image_resample, cfg.data.limit_images, cfg.data.min_pixels, cfg.data.max_pixels, cfg.data.image_factor],
    ['lanczos3', 1, 262144, 4194304, 28],
  );
  assert.throws(() => load({ overrides: ['data.image_resample=cubic'] }), /data\.image_resample.*bicubic/);
});

test('actor.model.lora: rank 0 and a target that matches no module are one line naming the key', () => {
  expectOneProblem(
    () => load({ overrides: ['actor.model.lora={rank: 16, alpha: 32}'] }),
    'actor.model.lora needs actor.model.path',
  );
  expectOneProblem(
    () => load({ overrides: ['actor.model.lora={rank: 0}', 'actor.model.path=/models/base'] }),
    'actor.model.lora.rank must be an integer ≥ 1',
  );
  const p = expectOneProblem(
    () =>
      load({
        overrides: ['actor.model.lora={rank: 8, target_modules: [q_proj, lm_head]}', 'actor.model.path=/models/base'],
      }),
    'actor.model.lora.target_modules: "lm_head" matches no module',
    'valid module names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj',
  );
  assert.ok(!p.includes('\n'));
  expectOneProblem(
    () => load({ overrides: ['actor.model.lora={rank: 8, dropout: 0.1}', 'actor.model.path=/models/base'] }),
    'actor.model.lora.dropout must be 0',
  );
  expectOneProblem(
    () => load({ overrides: ['actor.model.lora={rank: 8}', 'actor.model.path=/models/base', 'policy.dtype=bf16'] }),
    'actor.model.lora with policy.dtype = bf16 is not supported',
  );
});

test('policy.dtype: f32 by default, bf16 loads, anything else lists the valid dtypes', () => {
  assert.equal(load({}).policy.dtype, 'f32');
  assert.equal(load({ overrides: ['policy.dtype=bf16'] }).policy.dtype, 'bf16');
  assert.throws(() => load({ overrides: ['policy.dtype=fp16'] }), /policy\.dtype.*f32.*bf16/);
});

test('rollout.engine = openai needs engine URLs; the URLs and the correction keys load', () => {
  expectOneProblem(
    () => load({ overrides: ['rollout.engine=openai'] }),
    'rollout.engine = openai needs rollout.openai.urls',
  );
  const cfg = load({
    overrides: [
      'rollout.engine=openai',
      'rollout.openai.urls=[http://127.0.0.1:8000, http://127.0.0.1:8001]',
      'algorithm.rollout_correction.mode=mis',
    ],
  });
  assert.deepEqual(cfg.rollout.openai.urls, ['http://127.0.0.1:8000', 'http://127.0.0.1:8001']);
  assert.equal(cfg.algorithm.rollout_correction.mode, 'mis');
  expectOneProblem(() => load({ overrides: ['rollout.engine=vllm'] }), 'rollout.engine');
});

test('an image policy: the kind follows the model directory, its losses and estimator are checked, a language policy refuses the image losses', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-dit-'));
  try {
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ model_type: 'rlstream_dit' }));
    const cfg = load({ overrides: [`actor.model.path=${dir}`, 'algorithm.policy_loss=diffusion_nft'] });
    assert.equal(cfg.actor.model.kind, 'image', 'a model_type rlstream_dit directory is an image policy');
    assert.equal(load().actor.model.kind, 'language');
    expectOneProblem(
      () => load({ overrides: [`actor.model.path=${dir}`] }),
      'algorithm.policy_loss = vanilla is a language loss; an image policy trains with flow_grpo or diffusion_nft',
    );
    expectOneProblem(
      () =>
        load({
          overrides: [`actor.model.path=${dir}`, 'algorithm.policy_loss=flow_grpo', 'algorithm.image.noise_level=0'],
        }),
      'flow_grpo needs SDE samples',
    );
    expectOneProblem(
      () => load({ overrides: ['algorithm.policy_loss=flow_grpo'] }),
      'algorithm.policy_loss = flow_grpo trains an image policy, but the policy is a language model',
    );
    expectOneProblem(
      () => load({ overrides: ['actor.model.kind=image', 'algorithm.policy_loss=flow_grpo'] }),
      'actor.model.kind = image needs actor.model.path',
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
