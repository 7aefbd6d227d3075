import { test } from 'node:test';
import assert from 'node:assert/strict';
import { loadConfig } from '../../../lib/config/index.ts';
import { problemsOf } from './helpers.ts';

const sft = (...overrides: string[]) => loadConfig({ overrides, command: 'sft', env: {}, onWarning: () => undefined });

test('rlstream sft checks only its own keys: no reward function or rollout batch arithmetic is needed', () => {
  const cfg = sft(
    'data.train_files=rows.jsonl',
    'actor.global_batch_size=24',
    'actor.micro_batch_size_per_device_for_update=8',
  );
  assert.equal(cfg.sft.max_length, 1024);
  assert.deepEqual(
    [cfg.sft.prompt_key, cfg.sft.response_key, cfg.sft.messages_key, cfg.sft.packing, cfg.sft.epochs],
    ['prompt', 'response', 'messages', false, 1],
  );
  // the same config is refused by train (no reward function, 512 × 5 not a multiple of 24)
  assert.ok(
    problemsOf(() =>
      loadConfig({
        overrides: [
          'data.train_files=rows.jsonl',
          'actor.global_batch_size=24',
          'actor.micro_batch_size_per_device_for_update=8',
        ],
        env: {},
      }),
    ).length >= 2,
  );
});

test('rlstream sft: one line per problem, naming the key and what to change', () => {
  assert.deepEqual(
    problemsOf(() => sft()),
    [
      'rlstream sft needs training rows: set data.train_files (JSONL or parquet; prompt + response fields, or messages)',
    ],
  );
  assert.deepEqual(
    problemsOf(() => sft('data.task=arithmetic')),
    [
      'rlstream sft reads rows with a response (data.train_files), but data.task = "arithmetic" generates prompts without one; unset data.task and set data.train_files',
      'rlstream sft needs training rows: set data.train_files (JSONL or parquet; prompt + response fields, or messages)',
    ],
  );
  assert.deepEqual(
    problemsOf(() => sft('data.train_files=a.jsonl', 'actor.micro_batch_size_per_device_for_update=3')),
    [
      'actor.micro_batch_size_per_device_for_update = 3 does not divide actor.global_batch_size = 128; set it to a divisor of 128 such as 1, 2, 4 or 8',
    ],
  );
  assert.deepEqual(
    problemsOf(() => sft('data.train_files=a.jsonl', 'sft.max_length=2048')),
    [
      'sft.max_length = 2048 exceeds actor.model.max_seq_len = 1024; set actor.model.max_seq_len to at least 2048 or lower sft.max_length',
    ],
  );
  assert.match(problemsOf(() => sft('data.train_files=a.jsonl', 'sft.pakcing=true'))[0], /sft\.pakcing/);
  // LoRA: as for train, a base to adapt, rank and target modules one line each
  assert.deepEqual(
    problemsOf(() => sft('data.train_files=a.jsonl', 'actor.model.lora={rank: 8}')),
    [
      'actor.model.lora needs actor.model.path: the base model directory the adapters are trained on (LoRA on a randomly initialised model has nothing to adapt)',
    ],
  );
  assert.deepEqual(
    problemsOf(() =>
      sft(
        'data.train_files=a.jsonl',
        'actor.model.path=models/base',
        'actor.model.lora={rank: 0, target_modules: [q_proj, qkv]}',
      ),
    ),
    [
      'actor.model.lora.rank must be an integer ≥ 1 (the adapter width r), got 0; remove actor.model.lora to train every weight',
    ],
  );
  assert.deepEqual(
    problemsOf(() =>
      sft(
        'data.train_files=a.jsonl',
        'actor.model.path=models/base',
        'actor.model.lora={rank: 4, target_modules: [q_proj, qkv]}',
      ),
    ),
    [
      'actor.model.lora.target_modules: "qkv" matches no module of the model; valid module names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (or all-linear)',
    ],
  );
});
