import { renderSet, TRAIN_FONTS, HELDOUT_FONTS } from './glyphs.ts';
import { trainRecogniser } from './recogniser.ts';
let t0 = Date.now();
const tr = await renderSet({ faces: TRAIN_FONTS, perChar: 40, size: 32, seed: 1 });
const ho = await renderSet({ faces: HELDOUT_FONTS, perChar: 9, size: 32, seed: 2 });
console.log('render', Date.now() - t0);
t0 = Date.now();
const r = await trainRecogniser(
  tr,
  { size: 32, hidden: 128, classes: 36 },
  { steps: 600, batch: 64, lr: 2e-3, seed: 3 },
);
console.log(
  'train',
  Date.now() - t0,
  'train acc',
  await r.accuracy(tr.images, tr.labels),
  'heldout',
  await r.accuracy(ho.images, ho.labels),
);
