/**
 * Vision-language policy (lib/model/vision.ts) at the size of a from-scratch number-game policy
 * (decoder d_model 64, 2 layers; tower depth 2, width 64, 4 heads, patch 14, 2×2 merge): what the
 * images cost per batch of 8 rows on the CPU, each row with one image of `side`×`side` pixels
 * ((side/14)² patches, a quarter as many decoder tokens), against the same rows text-only
 * (placeholders left as plain tokens). Scoring (one forward), a training gradient (forward +
 * backward through the tower), and sampling 16 tokens for 2 prompts × 4 samples (the tower runs
 * once per prompt, in the prefill). Median of a few runs; no goal.
 *
 * `run()` returns the rows for bench/run.ts; `node --import tsx bench/vision.ts` prints the table.
 */
import { pathToFileURL } from 'node:url';
import { modelConfig } from '../lib/model/config.ts';
import { initWeights } from '../lib/model/init.ts';
import { Sampler } from '../lib/model/sample.ts';
import { Scorer } from '../lib/model/score.ts';
import { Trainer } from '../lib/model/train.ts';
import { expandImagePads, type ImagePixels } from '../lib/model/vision.ts';

export interface Row {
  name: string;
  value: number;
  unit: string;
  goal?: number | string;
  better?: 'higher' | 'lower';
}

async function medianMs(reps: number, f: () => Promise<unknown>): Promise<number> {
  await f(); // warm-up (session build)
  const ts: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    await f();
    ts.push(performance.now() - t0);
  }
  ts.sort((a, b) => a - b);
  return ts[Math.floor(ts.length / 2)]!;
}

const V = 259; // byte tokenizer, then the three vision ids
const vlm = modelConfig({
  hiddenSize: 64,
  intermediateSize: 256,
  numHiddenLayers: 2,
  numAttentionHeads: 4,
  numKeyValueHeads: 4,
  vocabSize: V + 3,
  maxPositionEmbeddings: 1024,
  bosTokenId: 257,
  eosTokenId: 258,
  padTokenId: 256,
  tieWordEmbeddings: true,
  vision: {
    depth: 2,
    hiddenSize: 64,
    intermediateSize: 256,
    numHeads: 4,
    outHiddenSize: 64,
    patchSize: 14,
    imageTokenId: V,
    visionStartTokenId: V + 1,
    visionEndTokenId: V + 2,
  },
});

function image(side: number, seed: number): ImagePixels {
  return {
    width: side,
    height: side,
    data: Uint8Array.from({ length: side * side * 3 }, (_, i) => (i * 31 + seed * 97) % 251),
  };
}

export async function run(): Promise<Row[]> {
  const rows: Row[] = [];
  const w = initWeights(vlm, 1);
  const text = Array.from({ length: 24 }, (_, i) => 40 + (i % 50));
  for (const side of [224, 448]) {
    const imgs = Array.from({ length: 8 }, (_, i) => image(side, i));
    const prompts = imgs.map((im) => expandImagePads(vlm, [257, V + 1, V, V + 2, ...text], [im]));
    const plain = prompts.map((p) => p.map((t) => (t === V ? 60 : t))); // same length, no image
    const tokens = (side / 14) ** 2 / 4;
    const label = `vision: 8 rows × one ${side}² image (${(side / 14) ** 2} patches → ${tokens} tokens)`;
    const scorer = new Scorer(vlm, { threads: 2 });
    const response = Array.from({ length: 16 }, (_, i) => 70 + i);
    const withImg = await medianMs(3, () =>
      scorer.score(
        w,
        prompts.map((p, i) => ({ prompt: p, response, images: [imgs[i]] })),
        { entropy: false },
      ),
    );
    const without = await medianMs(3, () =>
      scorer.score(
        w,
        plain.map((p) => ({ prompt: p, response })),
        { entropy: false },
      ),
    );
    rows.push({ name: `${label}: score 16 tokens, with images`, value: Number(withImg.toFixed(1)), unit: 'ms' });
    rows.push({
      name: `${label}: score 16 tokens, same rows text-only`,
      value: Number(without.toFixed(1)),
      unit: 'ms',
    });
    const T = prompts[0].length + 16,
      B = 8;
    const batchTokens = new Int32Array(B * T),
      resp = new Float32Array(B * T);
    prompts.forEach((p, r) => {
      p.forEach((t, k) => {
        batchTokens[r * T + k] = t;
      });
      response.forEach((t, k) => {
        batchTokens[r * T + p.length + k] = t;
        resp[r * T + p.length + k] = 1;
      });
    });
    const trainer = new Trainer({ model: vlm, loss: { type: 'sft' }, weights: w, threads: 2 });
    const grad = await medianMs(3, () =>
      trainer.computeGradients({
        batchSize: B,
        seqLen: T,
        tokens: batchTokens,
        responseMask: resp,
        images: imgs.map((im) => [im]),
      }),
    );
    rows.push({ name: `${label}: training gradient (tower trained)`, value: Number(grad.toFixed(1)), unit: 'ms' });
    const sampler = new Sampler(vlm, { threads: 2 });
    const reqs = Array.from({ length: 8 }, (_, i) => ({ id: `s${i}`, prompt: prompts[i % 2], images: [imgs[i % 2]] }));
    const gen = await medianMs(3, () => sampler.generate(w, reqs, { maxNewTokens: 16, eosTokenIds: [] }));
    rows.push({ name: `${label}: sample 16 tokens, 2 prompts × 4`, value: Number(gen.toFixed(1)), unit: 'ms' });
  }
  return rows;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  for (const r of await run()) console.log(`${r.name.padEnd(96)} ${String(r.value).padStart(10)} ${r.unit}`);
}
