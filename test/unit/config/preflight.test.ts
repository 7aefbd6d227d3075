/** The checks before a run starts (lib/config/preflight.ts): one line per problem, naming the key. */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig } from '../../../lib/config/index.ts';
import { modelDirProblems, preflightProblems } from '../../../lib/config/preflight.ts';

const tmp = mkdtempSync(join(tmpdir(), 'rl-preflight-'));
after(() => rmSync(tmp, { recursive: true, force: true }));

test('a model directory: missing, without weights, with a missing shard, complete', () => {
  assert.match(
    modelDirProblems('actor.model.path', join(tmp, 'none'))[0],
    /^actor\.model\.path: .*none does not exist$/,
  );
  const m = join(tmp, 'm');
  mkdirSync(m);
  assert.deepEqual(
    modelDirProblems('k', m).map((l) => l.replace(m, 'M')),
    [
      'k: M has no config.json (not a model directory, or a partial copy)',
      'k: M has neither model.safetensors nor model.safetensors.index.json (the weights are missing)',
    ],
  );
  writeFileSync(join(m, 'config.json'), '{}');
  writeFileSync(
    join(m, 'model.safetensors.index.json'),
    JSON.stringify({ weight_map: { a: 'model-1.safetensors', b: 'model-2.safetensors' } }),
  );
  writeFileSync(join(m, 'model-1.safetensors'), Buffer.alloc(16));
  const [one] = modelDirProblems('k', m);
  assert.match(one, /lacks 1 of the shards model\.safetensors\.index\.json names: model-2\.safetensors/);
  writeFileSync(join(m, 'model-2.safetensors'), Buffer.alloc(16));
  assert.deepEqual(modelDirProblems('k', m), []);
});

test('data files, a reward module that does not load, a run directory under a file: one line each', async () => {
  const reward = join(tmp, 'reward.mjs');
  writeFileSync(reward, 'export const notAReward = 1;\n');
  writeFileSync(join(tmp, 'a-file'), 'x');
  const cfg = loadConfig({
    env: {},
    onWarning: () => undefined,
    overrides: [
      'data.task=null',
      'actor.model.tokenizer=byte',
      'trainer.val_before_train=false',
      `data.train_files=[${join(tmp, 'train.parquet')}]`,
      `reward.reward_fn_path=${reward}`,
      `trainer.run_dir=${join(tmp, 'a-file', 'run')}`,
    ],
  });
  const problems = await preflightProblems(cfg);
  assert.equal(problems.length, 3, problems.join('\n'));
  assert.match(problems[0], /^data\.train_files: .*train\.parquet does not exist$/);
  assert.match(problems[1], /^reward\.reward_fn_path: .*reward\.mjs must export a function/);
  assert.match(problems[2], /^trainer\.run_dir: .*a-file is a file, not a directory$/);
  writeFileSync(join(tmp, 'train.parquet'), 'PAR1');
  const fixed = join(tmp, 'reward-fixed.mjs'); // (a module is imported once per process)
  writeFileSync(fixed, 'export default () => 1;\n');
  const ok = loadConfig({
    env: {},
    onWarning: () => undefined,
    overrides: [
      'data.task=null',
      'actor.model.tokenizer=byte',
      'trainer.val_before_train=false',
      `data.train_files=[${join(tmp, 'train.parquet')}]`,
      `reward.reward_fn_path=${fixed}`,
      `trainer.run_dir=${join(tmp, 'runs', 'r')}`,
    ],
  });
  assert.deepEqual(await preflightProblems(ok), []);
});
