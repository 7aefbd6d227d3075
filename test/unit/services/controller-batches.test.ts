/**
 * The controller's prompt batches and validation rows (services/controller/logic.ts): training
 * and validation sampling, the prompts' image rows, a round's stored metrics and generations.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { loadConfig } from '../../../lib/config/index.ts';
import type { PromptRow } from '../../../lib/pipeline/data.ts';
import { controllerEvent, promptBatch, valRoundRows, type ValRound } from '../../../services/controller/logic.ts';

const cfg = loadConfig({
  file: join(import.meta.dirname, '../../../examples/number-game.yaml'),
  overrides: ['rollout.val_override.temperature=0', 'rollout.val_override.n=1'],
});
const png = Buffer.from([1, 2, 3]);
const row = (i: number, images = 0): PromptRow => ({
  index: i,
  prompt: `p${i}`,
  answer: String(i),
  images: Array.from({ length: images }, (_, k) => ({ hash: `h${i}${k}`, width: 2, height: 3, png })),
  promptIds: Int32Array.from([i]),
  source: 'f:1',
  ...(i === 1 ? { dataSource: 'own', extraInfo: '{"a":1}' } : {}),
});
const data = { train: [row(0, 2), row(1)], val: [row(0), row(1)], dataSource: 'number_game' };

test('a training batch: training sampling and n, one group per ref with its row, its images as rows', () => {
  const { batch, images } = promptBatch(cfg, 'r', data, { kind: 'train', step: 3, epoch: 0, attempt: 1, version: 2 }, [
    { promptIndex: 5, datasetIndex: 0 },
  ]);
  assert.equal(batch.kind, 'train');
  assert.deepEqual([batch.step, batch.policy_version, batch.attempt], [3, 2, 1]);
  assert.equal(batch.sampling.temperature, cfg.rollout.temperature);
  assert.equal(batch.sampling.max_new_tokens, cfg.data.max_response_length);
  assert.equal(batch.groups[0].n, cfg.rollout.n);
  assert.equal(batch.groups[0].data_source, 'number_game');
  assert.equal(batch.groups[0].extra_info, '{}');
  assert.deepEqual(
    images.map((x) => [x.runId, x.hash]),
    [
      ['r', 'h00'],
      ['r', 'h01'],
    ],
  );
});

test("a validation batch: val_override sampling and n; a row's own data_source and extra_info", () => {
  const refs = [
    { promptIndex: 0, datasetIndex: 0 },
    { promptIndex: 1, datasetIndex: 1 },
  ];
  const { batch, images } = promptBatch(
    cfg,
    'r',
    data,
    { kind: 'val', step: 4, epoch: 0, attempt: 0, version: 4 },
    refs,
  );
  assert.equal(batch.sampling.temperature, 0);
  assert.deepEqual(
    batch.groups.map((g) => [g.n, g.data_source, g.extra_info]),
    [
      [1, 'number_game', '{}'],
      [1, 'own', '{"a":1}'],
    ],
  );
  assert.deepEqual(images, []);
  const again = promptBatch(cfg, 'r', data, { kind: 'val', step: 4, epoch: 0, attempt: 0, version: 4 }, refs);
  assert.equal(again.batch.id, batch.id, 'ids are deterministic');
});

test("a round's rows: finite metrics only, at the version evaluated; its generations", () => {
  const round: ValRound = {
    groups: ['g'],
    rewardSum: 1,
    accSum: 1,
    n: 1,
    failures: 0,
    gens: [{ idx: 0, prompt: 'q', response: 'a', gt: '1', reward: 1, failure: null }],
  } as ValRound;
  const r = valRoundRows('r', 5, { 'val/accuracy': 1, 'val/reward_score': Number.NaN }, round);
  assert.deepEqual(r.metrics, [{ runId: 'r', step: 5, name: 'val/accuracy', value: 1, stage: 'controller' }]);
  assert.deepEqual(r.generations, [
    { runId: 'r', step: 5, idx: 0, prompt: 'q', response: 'a', groundTruth: '1', reward: 1, rewardFailure: null },
  ]);
  const e = controllerEvent('r', 'val_round_done', 5, 5, { round: 5, groups: 1, samples: 1, failures: 0 }, 9, '5');
  assert.equal(e.id, controllerEvent('r', 'val_round_done', 5, 5, e.val_round_done, 10, '5').id, 'one id per detail');
  assert.equal(e.time_ms, 9);
});
