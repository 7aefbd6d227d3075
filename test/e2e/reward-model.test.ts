/**
 * reward.type: model inside a training run: a value model built for the run's tokenizer (the tiny
 * number-game run's alphabet tokenizer) exported as an ONNX sequence scorer scores every
 * trajectory on its own token ids (prompt ids ⧺ response ids). The stored rewards equal what the
 * exported model gives for the stored ids, run here directly through onnxruntime-node, one
 * sequence at a time without padding.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import * as ort from 'onnxruntime-node';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { initWeights, saveCheckpoint, ByteTokenizer } from '../../lib/model/index.ts';
import { tokenizerFor, criticModelConfig } from '../../lib/pipeline/policy.ts';
import { exportValueSequenceScorer } from '../../lib/reward/value-scorer-export.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const RUN_ID = 'reward-model-test';
const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const dir = join(ROOT, 'test/.tmp', `reward-model-${process.pid}`);
after(() => rmSync(dir, { recursive: true, force: true }));

interface Row {
  id: string;
  prompt_tokens: number[];
  response_tokens: number[];
  prompt_text: string;
  reward: number | null;
  reward_details: Record<string, number> | null;
  reward_failure: string | null;
}

async function scoreAlone(session: ort.InferenceSession, ids: number[]): Promise<number> {
  const T = ids.length;
  const out = await session.run({
    input_ids: new ort.Tensor(
      'int64',
      BigInt64Array.from(ids, (x) => BigInt(x)),
      [1, T],
    ),
    attention_mask: new ort.Tensor('int64', new BigInt64Array(T).fill(1n), [1, T]),
  });
  return Number((out.score.data as Float32Array)[0]);
}

test(
  "reward.type = model: a 2-step run is rewarded by the exported scorer on the trajectories' own token ids",
  { timeout: 300_000 },
  async () => {
    mkdirSync(dir, { recursive: true });
    const runDir = join(dir, 'run');
    const base = [`trainer.run_dir=${runDir}`, `pipeline.run_id=${RUN_ID}`, 'trainer.max_steps=2'];
    // a value model over the run's own tokenizer (alphabet) and length, exported as a sequence scorer
    const tok = tokenizerFor(loadConfig({ file: CONFIG, overrides: base }));
    const vcfg = criticModelConfig(loadConfig({ file: CONFIG, overrides: base }), tok);
    assert.equal(vcfg.vocabSize, tok.vocabSize);
    const ck = join(dir, 'value-model');
    await saveCheckpoint(ck, vcfg, initWeights(vcfg, 7, { std: 0.5 }));
    const rm = join(dir, 'rm.onnx');
    await exportValueSequenceScorer(ck, rm);

    const cfg = loadConfig({
      file: CONFIG,
      overrides: [
        ...base,
        'reward.type=model',
        `reward.model.path=${rm}`,
        'reward.model.transform=sigmoid',
        'reward.model.scale=2',
      ],
    });
    const out = await trainEmbedded(cfg, silentLogger(RUN_ID));
    assert.equal(out.status, 'completed', out.message);

    const store = await openStore({ kind: 'pglite', dir: join(runDir, 'db') });
    let rows: Row[];
    try {
      rows = (
        await sql<Row>`select id, prompt_tokens, response_tokens, prompt_text, reward, reward_details, reward_failure
      from trajectories where run_id = ${RUN_ID} and kind = 'train' order by step, prompt_index, sample_index`.execute(
          store.database.db,
        )
      ).rows;
    } finally {
      await store.close();
    }
    assert.equal(rows.length, 2 * 4 * 4, 'every sample of 2 steps × 4 prompts × 4 responses is stored');

    const session = await ort.InferenceSession.create(rm, { intraOpNumThreads: 1 });
    try {
      const bytes = new ByteTokenizer();
      const distinct = new Set<string>();
      for (const r of rows) {
        assert.equal(r.reward_failure, null, `${r.id}: ${r.reward_failure}`);
        const ids = [...r.prompt_tokens, ...r.response_tokens];
        // the run's ids are the alphabet tokenizer's, not the text's bytes (what the byte tokenizer would feed)
        assert.notDeepEqual(
          r.prompt_tokens,
          Array.from(bytes.encode(r.prompt_text)),
          `${r.id}: prompt ids are the run tokenizer's`,
        );
        const raw = await scoreAlone(session, ids);
        const want = 2 / (1 + Math.exp(-raw));
        assert.ok(
          r.reward !== null && Math.abs(r.reward - want) < 1e-5,
          `${r.id}: reward ${r.reward} ≠ 2·sigmoid(${raw}) = ${want} for ids [${ids}]`,
        );
        assert.ok(
          Math.abs(r.reward_details!.score_raw - raw) < 1e-5,
          `${r.id}: score_raw ${r.reward_details!.score_raw} vs ${raw}`,
        );
        distinct.add(r.reward.toFixed(5));
      }
      assert.ok(distinct.size > 1, 'rewards differ between trajectories');
    } finally {
      await session.release();
    }
  },
);
