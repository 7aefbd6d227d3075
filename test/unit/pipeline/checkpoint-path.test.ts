/**
 * trainer.load_checkpoint_path (lib/pipeline/checkpoints.ts, readCheckpointPath): where the
 * critic of a checkpoint is found — its critic/ directory, or for a checkpoint written before
 * checkpoints carried one, the source run's <run_dir>/critic/vNNNNNN — and none for a run
 * without a critic or a plain model directory; and what interrupted writes leave behind is removed.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  readCheckpointPath,
  checkpointDir,
  TRAINER_STATE_FILE,
  TRAINER_STATE_FORMAT,
  removeTempCheckpoints,
} from '../../../lib/pipeline/checkpoints.ts';
import { criticDir } from '../../../lib/pipeline/policy.ts';

const root = mkdtempSync(join(tmpdir(), 'rlstream-ckpath-'));
after(() => rmSync(root, { recursive: true, force: true }));

function file(path: string, text = 'x'): void {
  mkdirSync(join(path, '..'), { recursive: true });
  writeFileSync(path, text);
}
function checkpoint(runDir: string, step: number, withCritic: boolean): string {
  const dir = checkpointDir(runDir, step);
  file(join(dir, 'actor', 'model.safetensors'));
  file(join(dir, 'reference', 'model.safetensors'));
  if (withCritic) file(join(dir, 'critic', 'model.safetensors'));
  file(
    join(dir, TRAINER_STATE_FILE),
    JSON.stringify({ format: TRAINER_STATE_FORMAT, step, dataset_position: { step } }),
  );
  return dir;
}

test('the critic of a checkpoint: its critic/ directory', () => {
  const dir = checkpoint(join(root, 'a'), 4, true);
  assert.equal(readCheckpointPath(dir).criticDir, join(dir, 'critic'));
});

test("an older checkpoint without critic/: the source run's critic version of that step", () => {
  const run = join(root, 'b');
  const dir = checkpoint(run, 6, false);
  assert.equal(readCheckpointPath(dir).criticDir, null, 'no critic version 6 in the run directory');
  file(join(criticDir(run, 6), 'model.safetensors'));
  file(join(criticDir(run, 4), 'model.safetensors'));
  assert.equal(readCheckpointPath(dir).criticDir, criticDir(run, 6));
});

test('a plain model directory has no critic', () => {
  const dir = join(root, 'plain');
  file(join(dir, 'model.safetensors'));
  assert.deepEqual(readCheckpointPath(dir), { actorDir: dir, referenceDir: null, state: null, criticDir: null });
});

test('removeTempCheckpoints removes the temporary directories of interrupted writes of every stored kind, nothing else', async () => {
  const run = join(root, 'temps');
  const temps = [
    'checkpoints/.global_step_8.tmp-123-abcd0123',
    'policy/.v000003.tmp-123-abcd0123',
    'optimizer/.v000008.tmp-456-0123abcd',
    'critic-optimizer/.v000008.tmp-456-0123abcd',
    'ema/.v000002.tmp-9-ffffffff',
  ].map((d) => join(run, d));
  const kept = [
    'checkpoints/global_step_6',
    'policy/v000003',
    'optimizer/v000006',
    'critic/v000003',
    'optimizer/.other',
  ].map((d) => join(run, d));
  for (const d of [...temps, ...kept]) mkdirSync(d, { recursive: true });
  assert.deepEqual((await removeTempCheckpoints(run)).map((d) => join(run, d)).sort(), [...temps].sort());
  for (const d of temps) assert.equal(existsSync(d), false, d);
  for (const d of kept) assert.ok(existsSync(d), d);
});
