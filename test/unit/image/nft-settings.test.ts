/**
 * DiffusionNFT's reward normalisation and loss weighting keys (algorithm.image.nft_adv_clip,
 * nft_adv_std, nft_adaptive_weight) reach the update's settings.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { imagePolicySettings } from '../../../lib/pipeline/image-policy.ts';
import { load, problemsOf } from '../config/helpers.ts';

test('nft_adv_clip, nft_adv_std and nft_adaptive_weight reach the image policy settings', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-dit-'));
  try {
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ model_type: 'rlstream_dit' }));
    const base = [`actor.model.path=${dir}`, 'algorithm.policy_loss=diffusion_nft'];
    const paper = imagePolicySettings(load({ overrides: base }));
    assert.deepEqual(paper.nftOptimality, { clip: 5, std: 'global' }, "the defaults are DiffusionNFT's");
    assert.equal(paper.loss.nftAdaptiveWeight, true);
    const plain = imagePolicySettings(
      load({
        overrides: [
          ...base,
          'algorithm.image.nft_adv_clip=1',
          'algorithm.image.nft_adv_std=centred',
          'algorithm.image.nft_adaptive_weight=false',
        ],
      }),
    );
    assert.deepEqual(plain.nftOptimality, { clip: 1, std: 'centred' });
    assert.equal(plain.loss.nftAdaptiveWeight, undefined);
    assert.ok(
      problemsOf(() => load({ overrides: [...base, 'algorithm.image.nft_adv_std=batch'] })).some((p) =>
        p.includes('nft_adv_std'),
      ),
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
