import { test } from 'node:test';
import assert from 'node:assert/strict';
import { redactSecrets, resumeConfigDiff, resumeConfigProblem } from '../../../lib/config/index.ts';
import { load } from './helpers.ts';

const stored = (overrides: string[] = []) => JSON.parse(JSON.stringify(redactSecrets(load({ overrides })))) as unknown;

test('resume with the same config, or with only run length / logging changes, is accepted', () => {
  const diff = resumeConfigDiff(
    stored(),
    load({
      overrides: [
        'trainer.total_epochs=3',
        'trainer.max_steps=40',
        'trainer.val_freq=5',
        'actor.threads=1',
        'trainer.resume_with_changed_config=true',
      ],
    }),
  );
  assert.deepEqual(diff, { safe: [], unsafe: [] });
  assert.equal(resumeConfigProblem('r', diff, false), null);
});

test('a changed lr is refused unless trainer.resume_with_changed_config=true', () => {
  const diff = resumeConfigDiff(stored(), load({ overrides: ['actor.optim.lr=3e-4'] }));
  assert.deepEqual(diff, { safe: ['actor.optim.lr'], unsafe: [] });
  assert.match(
    resumeConfigProblem('r1', diff, false)!,
    /^run r1 was started with another config: actor\.optim\.lr differs from the run's stored config; add trainer\.resume_with_changed_config=true/,
  );
  assert.equal(resumeConfigProblem('r1', diff, true), null);
});

test('rollout.n and data.rollout_batch_size change what the stored state means: refused either way, listed', () => {
  const diff = resumeConfigDiff(
    stored(),
    load({ overrides: ['rollout.n=8', 'data.rollout_batch_size=64', 'actor.optim.lr=3e-4', 'data.seed=9'] }),
  );
  assert.deepEqual(diff, { safe: ['actor.optim.lr'], unsafe: ['data.rollout_batch_size', 'data.seed', 'rollout.n'] });
  const msg = resumeConfigProblem('r2', diff, true)!;
  assert.match(msg, /data\.rollout_batch_size, data\.seed, rollout\.n change what the stored state means/);
  assert.doesNotMatch(msg, /actor\.optim\.lr/);
  assert.match(resumeConfigProblem('r2', diff, false)!, /actor\.optim\.lr differs/);
});

test('keys added to the schema after a run started are no change when they hold their default or are derived', () => {
  const old = stored() as { actor: { model: Record<string, unknown> }; algorithm: Record<string, unknown> };
  delete old.actor.model.kind;
  delete old.algorithm.image;
  assert.deepEqual(resumeConfigDiff(old, load()), { safe: [], unsafe: [] });
  // a new key given a non-default value on resume is a change
  const diff = resumeConfigDiff(old, load({ overrides: ['algorithm.image.steps=3'] }));
  assert.deepEqual(diff, { safe: ['algorithm.image.steps'], unsafe: [] });
});
