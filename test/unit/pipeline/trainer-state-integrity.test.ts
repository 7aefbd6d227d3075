/**
 * trainer_state.json carries the sha256 of its own fields (`state_sha256`): a checkpoint whose
 * state was edited (optimizer_steps 600 → 200) or damaged is refused by
 * `trainer.load_checkpoint_path` with a message naming the file, as a damaged weights file is;
 * the untouched one, and the same bytes reformatted, are accepted.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  datasetPosition,
  readCheckpointPath,
  trainerStateSha256,
  writeCheckpointDir,
  TRAINER_STATE_FILE,
  TRAINER_STATE_FORMAT,
  type TrainerState,
} from '../../../lib/pipeline/checkpoints.ts';

const root = mkdtempSync(join(tmpdir(), 'rlstream-tsint-'));
after(() => rmSync(root, { recursive: true, force: true }));

async function checkpoint(name: string): Promise<string> {
  const run = join(root, name);
  for (const d of ['actor', 'reference']) {
    mkdirSync(join(run, d), { recursive: true });
    writeFileSync(join(run, d, 'model.safetensors'), `weights of ${d}`);
    writeFileSync(join(run, d, 'config.json'), '{}');
  }
  const state: TrainerState = {
    format: TRAINER_STATE_FORMAT,
    run_id: 'r',
    step: 6,
    policy_version: 6,
    sha256: 'a'.repeat(64),
    dataset_position: datasetPosition({ trainSize: 16, rolloutBatchSize: 4, shuffle: true, seed: 1 }, 6),
    consumed_offsets: { 'rl.r.update_groups/0': 24 },
    rng_state: { data_seed: 1 },
    kl_ctl_state: { kl_coef: 0.001 },
    lr_state: { lr: 1e-6, optimizer_steps: 600, total_optimizer_steps: 1000 },
  };
  return writeCheckpointDir(run, state, join(run, 'actor'), join(run, 'reference'));
}

test('an untouched trainer_state.json is accepted, and records its own sha256', async () => {
  const dir = await checkpoint('ok');
  const { state } = readCheckpointPath(dir);
  assert.match(state!.state_sha256 ?? '', /^[0-9a-f]{64}$/);
  assert.equal(trainerStateSha256(state!), state!.state_sha256);
  // whitespace and key order are not the state: reformatted, it is still the same state
  const file = join(dir, TRAINER_STATE_FILE);
  const parsed = JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown>;
  const reversed = Object.fromEntries(Object.entries(parsed).reverse());
  writeFileSync(file, JSON.stringify(reversed));
  assert.equal(readCheckpointPath(dir).state!.lr_state.optimizer_steps, 600);
});

test('an edited trainer_state.json (optimizer_steps 600 → 200) is refused, naming the file', async () => {
  const dir = await checkpoint('edited');
  const file = join(dir, TRAINER_STATE_FILE);
  writeFileSync(file, readFileSync(file, 'utf8').replace('"optimizer_steps": 600', '"optimizer_steps": 200'));
  assert.match(readFileSync(file, 'utf8'), /"optimizer_steps": 200/);
  assert.throws(
    () => readCheckpointPath(dir),
    (e: Error) => e.message.includes(file) && /edited or is damaged/.test(e.message),
  );
});

test('a damaged dataset position or offset is refused too', async () => {
  const dir = await checkpoint('damaged');
  const file = join(dir, TRAINER_STATE_FILE);
  writeFileSync(file, readFileSync(file, 'utf8').replace('"rl.r.update_groups/0": 24', '"rl.r.update_groups/0": 4'));
  assert.throws(() => readCheckpointPath(dir), /edited or is damaged/);
});
