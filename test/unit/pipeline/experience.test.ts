/**
 * actor.micro_batch_size_per_device_for_experience reaches the forward passes that make
 * experience (reference/old log-probs in the advantage and update stages, values): at most that
 * many rows per session.run. (That the result does not depend on it: test/e2e/estimators.test.ts.)
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadConfig } from '../../../lib/config/index.ts';
import {
  experienceScorerOptions,
  policyModelConfig,
  samplerOptions,
  tokenizerFor,
} from '../../../lib/pipeline/policy.ts';
import { forEachBucket } from '../../../lib/model/score.ts';

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));

test('micro_batch_size_per_device_for_experience bounds the rows of each experience forward pass', async () => {
  assert.equal(
    experienceScorerOptions(
      loadConfig({ file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'), overrides: ['actor.device=cuda'] }),
    ).device,
    'cuda',
    'actor.device reaches the experience sessions',
  );
  for (const mb of [1, 4, 8]) {
    const cfg = loadConfig({
      file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
      overrides: [`actor.micro_batch_size_per_device_for_experience=${mb}`],
    });
    const opts = experienceScorerOptions(cfg);
    assert.deepEqual(opts, { threads: cfg.actor.threads, device: cfg.actor.device, maxBatchSize: mb });
    const reqs = Array.from({ length: 10 }, (_, i) => ({
      prompt: [1, 2, 3],
      response: Array.from({ length: 1 + (i % 3) }, () => 4),
    }));
    const sizes: number[] = [];
    await forEachBucket(policyModelConfig(cfg, tokenizerFor(cfg)), reqs, opts, async (batch) => {
      sizes.push(batch.length);
    });
    assert.equal(
      sizes.reduce((a, b) => a + b, 0),
      10,
      'every request scored once',
    );
    assert.ok(
      sizes.every((n) => n <= mb),
      `batches of at most ${mb}: ${sizes.join(',')}`,
    );
    assert.equal(sizes.length, Math.ceil(10 / mb));
  }
});

test('samplerOptions: rollout.batch_size (null: 64) rows on rollout.device, falling back to actor.device', () => {
  const tiny = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
  const plain = loadConfig({ file: tiny, overrides: ['rollout.batch_size=null'] });
  assert.deepEqual(samplerOptions(plain), { threads: plain.actor.threads, device: 'cpu', maxBatchSize: 64 });
  assert.equal(samplerOptions(loadConfig({ file: tiny, overrides: ['actor.device=webgpu'] })).device, 'webgpu');
  const split = loadConfig({
    file: tiny,
    overrides: ['actor.device=webgpu', 'rollout.device=cpu', 'rollout.batch_size=8'],
  });
  assert.deepEqual(
    [samplerOptions(split).device, samplerOptions(split).maxBatchSize, experienceScorerOptions(split).device],
    ['cpu', 8, 'webgpu'],
  );
});
