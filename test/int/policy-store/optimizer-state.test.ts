/**
 * Uses the shared test database (RLSTREAM_TEST_PG_URL): this file runs alone (@runs-alone).
 * Policy versions hold weights only; the AdamW state is written at checkpoint steps as its own
 * artifact (lib/pipeline/run-versions.ts putOptimizer) and linked into the checkpoint directory
 * (lib/pipeline/checkpoints.ts writeCheckpointDir), from which a resume loads weights and moments
 * together; pruning keeps an optimizer state only while its checkpoint is kept.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openDatabase } from '../../../lib/db/database.ts';
import { FilesystemPolicyStore } from '../../../lib/policy-store/index.ts';
import { RunVersions } from '../../../lib/pipeline/run-versions.ts';
import { datasetPosition, TRAINER_STATE_FORMAT, writeCheckpointDir } from '../../../lib/pipeline/checkpoints.ts';
import {
  initWeights,
  loadCheckpoint,
  modelConfig,
  type OptimizerState,
  type Weights,
} from '../../../lib/model/index.ts';
import { PG_URL } from '../../../devkit/pipeline-procs.ts';
import { uniqueRunId } from '../../support/store-fixtures.ts';
import { TINY_ONE_LAYER } from '../../support/tiny-models.ts';

const model = modelConfig(TINY_ONE_LAYER);

function moments(w: Weights, step: number): OptimizerState {
  const scaled = (k: number) => new Map([...w].map(([n, a]) => [n, a.map((x) => x * k)]));
  return { step, expAvg: scaled(0.5), expAvgSq: scaled(0.25) };
}

for (const policyDtype of ['f32', 'bf16'] as const)
  test(`a policy version (${policyDtype}) has no optimizer file; a checkpoint step stores it apart and the checkpoint holds both`, async () => {
    const db = await openDatabase({ kind: 'postgres', url: PG_URL });
    const runDir = mkdtempSync(join(tmpdir(), 'rl-optim-'));
    const runId = uniqueRunId('optim');
    try {
      const store = new FilesystemPolicyStore(runDir, runId, db.db);
      const versions = new RunVersions(
        store,
        { runId, runDir, store: null as never },
        { lora: null, assetsFrom: null, db: db.db, policyDtype },
      );
      const w = initWeights(model, 3);
      for (const v of [0, 1, 2]) await versions.put('policy', v, model, w, { metadata: { policy_version: String(v) } });
      for (const v of [0, 1, 2]) {
        assert.deepEqual(
          readdirSync(store.writeDir('policy', v)).filter((f) => f.endsWith('.safetensors')),
          ['model.safetensors'],
          `policy v${v} holds the weights only`,
        );
        assert.ok(!(await store.files('policy', v)).some((f) => f.name === 'optimizer.safetensors'));
      }
      const opt = moments(w, 7);
      await versions.putOptimizer('optimizer', 2, model, opt, w);
      assert.deepEqual(
        (await store.files('optimizer', 2)).map((f) => f.name),
        ['optimizer.safetensors'],
      );
      const ck = await writeCheckpointDir(
        runDir,
        {
          format: TRAINER_STATE_FORMAT,
          run_id: runId,
          step: 2,
          policy_version: 2,
          sha256: (await versions.record(2, 0)).sha256,
          dataset_position: datasetPosition({ trainSize: 8, rolloutBatchSize: 4, shuffle: false, seed: 1 }, 2),
          consumed_offsets: {},
          rng_state: {},
          kl_ctl_state: {},
          lr_state: { optimizer_steps: 7 },
        },
        store.writeDir('policy', 2),
        store.writeDir('policy', 0),
        null,
        { actor: store.writeDir('optimizer', 2), critic: null },
      );
      const back = await loadCheckpoint(join(ck, 'actor'), { optimizer: true });
      assert.equal(back.optimizer!.step, 7);
      // the trainer resumes from the f32 weights, also when the version holds their bf16 rounding
      for (const [n, a] of w) assert.deepEqual(back.weights.get(n), a, n);
      const stored = await loadCheckpoint(join(ck, 'actor'), { optimizer: false });
      assert.equal(stored.config.storedDtype, policyDtype === 'bf16' ? 'bfloat16' : undefined);
      for (const [n, a] of opt.expAvgSq) assert.deepEqual(back.optimizer!.expAvgSq.get(n), a, n);
      assert.ok(!existsSync(join(ck, 'reference', 'optimizer.safetensors')));

      // pruning: the optimizer state goes with its checkpoint, a version by the version rule
      await versions.putOptimizer('optimizer', 1, model, moments(w, 3), w);
      await versions.prune({ newest: 2, maxStaleness: 0, checkpointSteps: [2], keepExtra: 0 }, db.db);
      assert.deepEqual(await store.versions('optimizer'), [2]);
      assert.deepEqual(await store.versions('policy'), [0, 1, 2]);
    } finally {
      await db.close();
      rmSync(runDir, { recursive: true, force: true });
    }
  });
