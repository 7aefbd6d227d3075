/** An image policy's model directory round trip, and `rlstream generate --image-out` from it (same seed, same PNG). */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import sharp from 'sharp';
import { ditConfig, initDitWeights } from '../../../lib/image/dit.ts';
import { isDitDir, loadDit, saveDit } from '../../../lib/image/checkpoint.ts';
import { generateCommand } from '../../../app/cli/commands/generate.ts';
import { tempDir } from '../../../devkit/torch-ref.ts';

test('rlstream generate --image-out samples an image policy directory', async () => {
  const tmp = tempDir('rlstream-dit-gen-');
  try {
    const config = ditConfig({
      numClasses: 2,
      imageSize: 8,
      patchSize: 2,
      hidden: 8,
      depth: 1,
      heads: 2,
      timeFreqs: 4,
    });
    const dir = join(tmp.dir, 'model');
    const weights = initDitWeights(config, 1, { zeroInit: false });
    saveDit(dir, { config, classNames: ['A', 'B'], weights });
    assert.ok(isDitDir(dir));
    const back = loadDit(dir);
    assert.deepEqual(back.config, config);
    assert.deepEqual(back.weights.get('pos_embed'), weights.get('pos_embed'));
    const out = (n: string) => join(tmp.dir, n);
    assert.equal(
      await generateCommand.run([dir, '--prompt', 'B', '--image-out', out('a.png'), '--seed', '3', '--steps', '4']),
      0,
    );
    assert.equal(
      await generateCommand.run([dir, '--prompt', 'B', '--image-out', out('b.png'), '--seed', '3', '--steps', '4']),
      0,
    );
    assert.deepEqual(readFileSync(out('a.png')), readFileSync(out('b.png')));
    const meta = await sharp(readFileSync(out('a.png'))).metadata();
    assert.deepEqual([meta.width, meta.height, meta.format], [8, 8, 'png']);
    await assert.rejects(
      generateCommand.run([dir, '--prompt', 'Z', '--image-out', out('c.png')]),
      /not one of this image model's prompts: A, B/,
    );
    await assert.rejects(generateCommand.run([dir, '--prompt', 'A']), /give --image-out PATH/);
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ model_type: 'rlstream_dit', image_size: 8 }));
    assert.throws(() => loadDit(dir), /channels must be a number/);
  } finally {
    tmp.cleanup();
  }
});
