/**
 * The update stage's state bookkeeping around a commit (lib/pipeline/update-commit.ts): what a
 * committed step changes in the saved state, and which versions a prune keeps besides retention.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { noteCommitted, versionsKept } from '../../../lib/pipeline/update-commit.ts';
import type { UpdateState } from '../../../lib/pipeline/update-start.ts';

test('noteCommitted: the step becomes the version, its start offsets go, later steps keep theirs', () => {
  const st: UpdateState = {
    version: 2,
    optimizerSteps: 6,
    stepStarts: { '3': { 'u/0': 10 }, '4': { 'u/0': 14 } },
    versionSha: { '1': 'a', '2': 'b' },
  };
  noteCommitted(st, 3, false, 'c');
  assert.equal(st.version, 3);
  assert.deepEqual(st.stepStarts, { '4': { 'u/0': 14 } });
  assert.deepEqual(st.versionSha, { '1': 'a', '2': 'b', '3': 'c' });
});

test('noteCommitted: a checkpoint starts the list of re-trainable versions again', () => {
  const st: UpdateState = { version: 3, optimizerSteps: 8, versionSha: { '3': 'c' } };
  noteCommitted(st, 4, true, 'd');
  assert.equal(st.version, 4);
  assert.deepEqual(st.versionSha, {});
  noteCommitted(st, 5, false, 'e');
  assert.deepEqual(st.versionSha, { '5': 'e' });
});

test('versionsKept: versions in use, plus the start of a run started from a checkpoint', () => {
  assert.deepEqual(versionsKept({}, [4, 5]), [4, 5]);
  assert.deepEqual(versionsKept({ startedAt: { step: 20, optimizerSteps: 40 } }, [25]), [25, 20]);
});
