import { test } from 'node:test';
import assert from 'node:assert/strict';
import { perturbImage, perturbations, DEFAULT_PERTURB_OPTIONS, type Pixels } from '../../../lib/data/perturb.ts';

function image(width: number, height: number, fill = 200): Pixels {
  const data = new Uint8Array(width * height * 3);
  for (let k = 0; k < data.length; k++) data[k] = ((fill + k * 7) % 251) + 1; // no zero pixels
  return { width, height, data };
}

/** Per 14-px cell: 'black' when every pixel is 0, 'kept' when untouched; anything else fails. */
function cells(orig: Pixels, out: Pixels, P: number): boolean[] {
  const res: boolean[] = [];
  for (let cy = 0; cy < Math.ceil(orig.height / P); cy++) {
    for (let cx = 0; cx < Math.ceil(orig.width / P); cx++) {
      let black = true,
        kept = true;
      for (let y = cy * P; y < Math.min(orig.height, (cy + 1) * P); y++) {
        for (let x = cx * P; x < Math.min(orig.width, (cx + 1) * P); x++) {
          for (let c = 0; c < 3; c++) {
            const k = (y * orig.width + x) * 3 + c;
            if (out.data[k] !== 0) black = false;
            if (out.data[k] !== orig.data[k]) kept = false;
          }
        }
      }
      assert.ok(black !== kept, `cell (${cx}, ${cy}) is wholly blackened or wholly kept`);
      res.push(black);
    }
  }
  return res;
}

test('patch_blackening: whole 14-px cells, the same for the same sample id, others for another; the input is not modified', () => {
  const img = image(112, 56);
  const before = img.data.slice();
  const a = perturbImage('patch_blackening', img, 'run-1/s0');
  assert.deepEqual(img.data, before);
  assert.deepEqual(perturbImage('patch_blackening', img, 'run-1/s0'), a, 'a replay recomputes the same perturbation');
  const ca = cells(img, a, 14);
  assert.equal(ca.length, 8 * 4);
  assert.notDeepEqual(cells(img, perturbImage('patch_blackening', img, 'run-1/s1'), 14), ca);
  assert.notDeepEqual(
    cells(img, perturbImage('patch_blackening', img, 'run-1/s0', 1), 14),
    ca,
    'the second image of a prompt gets its own draw',
  );
});

test('patch_blackening: the fraction of cells blackened is ≈ mask_prob, edge cells included', () => {
  const img = image(100, 45); // edge cells of 2 and 3 pixels
  for (const p of [0.5, 0.2, 0.9]) {
    let black = 0,
      total = 0;
    for (let i = 0; i < 300; i++) {
      const c = cells(
        img,
        perturbImage('patch_blackening', img, `s${i}`, 0, { ...DEFAULT_PERTURB_OPTIONS, mask_prob: p }),
        14,
      );
      black += c.filter(Boolean).length;
      total += c.length;
    }
    // 300 × 32 cells: the binomial sd of the fraction is ≤ 0.003
    assert.ok(Math.abs(black / total - p) < 0.015, `p=${p}: fraction ${black / total}`);
  }
  assert.ok(
    cells(img, perturbImage('patch_blackening', img, 's', 0, { ...DEFAULT_PERTURB_OPTIONS, mask_prob: 0 }), 14).every(
      (b) => !b,
    ),
  );
  assert.ok(
    cells(img, perturbImage('patch_blackening', img, 's', 0, { ...DEFAULT_PERTURB_OPTIONS, mask_prob: 1 }), 14).every(
      (b) => b,
    ),
  );
  // patch_size 28: fewer, larger cells
  assert.equal(
    cells(img, perturbImage('patch_blackening', img, 's', 0, { ...DEFAULT_PERTURB_OPTIONS, patch_size: 28 }), 28)
      .length,
    4 * 2,
  );
});

test('gaussian_noise: zero mean, the configured spread, seeded; blackout is all black', () => {
  const img = image(64, 64, 0);
  img.data.fill(128);
  const a = perturbImage('gaussian_noise', img, 'x', 0, { ...DEFAULT_PERTURB_OPTIONS, noise_std: 0.1 });
  assert.deepEqual(perturbImage('gaussian_noise', img, 'x', 0, { ...DEFAULT_PERTURB_OPTIONS, noise_std: 0.1 }), a);
  let s = 0,
    s2 = 0;
  for (const v of a.data) {
    s += v - 128;
    s2 += (v - 128) ** 2;
  }
  const n = a.data.length,
    mean = s / n,
    sd = Math.sqrt(s2 / n - mean * mean);
  assert.ok(Math.abs(mean) < 0.5, `mean ${mean}`);
  assert.ok(Math.abs(sd - 25.5) < 0.8, `sd ${sd}`);
  assert.ok(perturbImage('blackout', image(28, 28), 'x').data.every((v) => v === 0));
});

test('bad input: unknown names list the valid ones, wrong sizes and options are refused', () => {
  assert.throws(
    () => perturbImage('mask', image(28, 28), 'x'),
    /unknown algorithm\.vppo\.perturbation "mask" — valid: blackout, gaussian_noise, patch_blackening/,
  );
  assert.throws(
    () => perturbImage('blackout', { width: 28, height: 28, data: new Uint8Array(10) }, 'x'),
    /expected 28×28×3/,
  );
  assert.throws(
    () => perturbImage('patch_blackening', image(28, 28), 'x', 0, { ...DEFAULT_PERTURB_OPTIONS, mask_prob: 1.5 }),
    /mask_prob/,
  );
  assert.deepEqual(perturbations.names(), ['blackout', 'gaussian_noise', 'patch_blackening']);
});
