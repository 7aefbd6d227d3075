/**
 * Causal attention by query blocks (llama.ts causalBlocks, the trainer's and scorers' default from
 * QUERY_BLOCKS_MIN_T tokens a row): block i attends only the keys up to its last query, so the
 * all-masked score blocks are never computed. Reference vs fast: trainer gradients, metrics and
 * evaluate log-probs with the blocks must equal those of one block (queryBlocks: 1) to float
 * rounding — grouped-query and multi-head attention, left padding, a row length that does not
 * divide into equal blocks, gradient checkpointing. (test/int/model/parity.test.ts checks the
 * blocked graphs against PyTorch.)
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { GraphBuilder } from '../../../lib/onnx/builder.ts';
import { modelConfig } from '../../../lib/model/config.ts';
import {
  causalBias,
  causalBlocks,
  queryBlocksFor,
  QUERY_BLOCKS,
  QUERY_BLOCKS_MIN_T,
} from '../../../lib/model/llama.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { createTrainer, type TrainBatch } from '../../../lib/model/train.ts';
import { Rng } from '../../../lib/util/rng.ts';

const base = {
  modelType: 'qwen2' as const,
  attentionBias: true,
  tieWordEmbeddings: true,
  hiddenSize: 32,
  intermediateSize: 48,
  numHiddenLayers: 2,
  numAttentionHeads: 4,
  vocabSize: 37,
  maxPositionEmbeddings: 512,
  bosTokenId: 1,
  eosTokenId: 2,
  padTokenId: 0,
};

/**
 * 3 rows of T = 258 (blocks of 64 / 65 rows): row 1 left-padded by 70 (past the first block), row 2
 * right-padded by 30; `short`: a 4th row of 2 real tokens (alone in a micro-batch it is trimmed to 2).
 */
function batch(short = false): TrainBatch {
  const rng = Rng.fromSeed('query-blocks');
  const B = short ? 4 : 3,
    T = 258,
    n = B * T;
  const real = (i: number) => {
    const r = Math.floor(i / T),
      t = i % T;
    return !(r === 1 && t < 70) && !(r === 2 && t >= T - 30) && !(r === 3 && t >= 2);
  };
  return {
    batchSize: B,
    seqLen: T,
    attentionMask: Float32Array.from({ length: n }, (_, i) => (real(i) ? 1 : 0)),
    responseMask: Float32Array.from({ length: n }, (_, i) =>
      real(i) && (i % T >= 100 || (Math.floor(i / T) === 3 && i % T >= 1)) ? 1 : 0,
    ),
    tokens: Int32Array.from({ length: n }, (_, i) => (real(i) ? 3 + rng.int(34) : 0)),
    advantages: Float32Array.from({ length: n }, () => rng.next() * 2 - 1),
    oldLogprobs: Float32Array.from({ length: n }, () => -3.6 + 0.4 * rng.next()),
  };
}

function maxRel(a: Float32Array, b: Float32Array): number {
  let d = 0,
    s = 0;
  for (let i = 0; i < a.length; i++) {
    d = Math.max(d, Math.abs(a[i] - b[i]));
    s = Math.max(s, Math.abs(a[i]));
  }
  assert.ok(s > 0, 'an all-zero tensor tests nothing');
  return d / s;
}

describe('causal attention by query blocks', () => {
  it(`queryBlocksFor: ${QUERY_BLOCKS} blocks from ${QUERY_BLOCKS_MIN_T} tokens a row, one below; never more blocks than rows`, () => {
    assert.equal(queryBlocksFor(QUERY_BLOCKS_MIN_T - 1), 1);
    assert.equal(queryBlocksFor(QUERY_BLOCKS_MIN_T), QUERY_BLOCKS);
    assert.equal(queryBlocksFor(4096, 1), 1);
    assert.equal(queryBlocksFor(300, 8), 8);
    assert.equal(queryBlocksFor(300, 400), 1);
  });

  it("causalBlocks: one named row count per block, keys up to the block's last query; refuses n < 2 and a KV-cache bias", () => {
    const b = new GraphBuilder();
    const mask = b.input('mask', 'float32', ['B', 'T']);
    const bias = causalBias(b, mask, 'T');
    const blocks = causalBlocks(b, bias, 'T', 3);
    assert.deepEqual(
      blocks.map((x) => x.rows),
      ['T_q3_0', 'T_q3_1', 'T_q3_2'],
    );
    assert.deepEqual(
      blocks.map((x) => String(x.keys)),
      ['T_q3_0', 'T_q3_0+T_q3_1', 'T_q3_0+T_q3_1+T_q3_2'],
    );
    assert.deepEqual(blocks[1].bias.shape, ['B', 1, 'T_q3_1', 'T_q3_0+T_q3_1']);
    assert.throws(() => causalBlocks(b, bias, 'T', 1), /n ≥ 2/);
    assert.throws(() => causalBlocks(b, b.input('past_bias', 'float32', ['B', 1, 'T', 'S']), 'T', 2), /no KV cache/);
  });

  const cases = [
    ['grouped-query attention', 2, false, false],
    ['multi-head attention', 4, false, false],
    ['grouped-query attention, gradient checkpointing', 2, true, false],
    [
      'micro-batches of one row, one of them trimmed to 2 tokens (each micro-batch picks its own block count)',
      2,
      false,
      true,
    ],
  ] as const;
  for (const [name, kvh, ckpt, short] of cases) {
    it(`${name}: gradients, metrics and evaluate log-probs equal one block's`, async () => {
      const model = modelConfig({ ...base, numKeyValueHeads: kvh });
      const run = async (queryBlocks: number) => {
        const tr = createTrainer({
          model,
          loss: { type: 'policy', entropyCoeff: 0.01 },
          threads: 2,
          seed: 3,
          cache: new SessionCache(),
          queryBlocks,
          ...(ckpt ? { gradientCheckpointing: true } : {}),
          ...(short ? { microBatchSize: 1 } : {}),
        });
        const g = await tr.computeGradients(batch(short));
        const e = await tr.evaluate(batch(short));
        return { g, e };
      };
      const one = await run(1),
        four = await run(QUERY_BLOCKS);
      for (const [k, x] of one.g.grads)
        assert.ok(maxRel(x, four.g.grads.get(k)!) < 2e-5, `${k}: ${maxRel(x, four.g.grads.get(k)!)}`);
      for (const [k, v] of Object.entries(one.g.metrics))
        assert.ok(Math.abs(v - four.g.metrics[k]) <= 1e-5 * (1 + Math.abs(v)), `${k}: ${v} vs ${four.g.metrics[k]}`);
      assert.ok(maxRel(one.e.perToken, four.e.perToken) < 1e-5, 'evaluate log-probs');
    });
  }
});
