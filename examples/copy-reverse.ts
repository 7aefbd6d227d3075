/**
 * Sanity check of the whole training path: a tiny Llama learns to copy or reverse short letter
 * sequences with supervised cross-entropy (loss 'sft'), trained by the in-graph
 * forward/backward/AdamW step. Prints progress; stops at ≥ 99 % held-out token accuracy.
 *
 *   node --import tsx examples/copy-reverse.ts [--steps 600] [--threads 2] [--seed 0]
 *
 * Sequence: BOS, task (C = copy, R = reverse), x₁…x_L, '>', y₁…y_L, EOS with L ∈ [3, 6];
 * the loss and the accuracy cover y₁…y_L and EOS (teacher-forced argmax).
 */
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { modelConfig } from '../lib/model/config.ts';
import { AlphabetTokenizer } from '../lib/model/tokenizer.ts';
import { createTrainer, type TrainBatch } from '../lib/model/train.ts';
import { lrAt } from '../lib/optim/lr-schedule.ts';
import { Rng } from '../lib/util/rng.ts';

const LETTERS = 'abcdefgh';

export interface CopyReverseOptions {
  steps?: number;
  batchSize?: number;
  threads?: number;
  seed?: number;
  /** Stop once held-out token accuracy reaches this (default 0.99). */
  targetAccuracy?: number;
  evalEvery?: number;
  log?: (line: string) => void;
}

export interface CopyReverseResult {
  steps: number;
  accuracy: number;
  history: { step: number; loss: number; accuracy: number }[];
  seconds: number;
}

export function makeCopyReverseBatch(tok: AlphabetTokenizer, B: number, rng: Rng): TrainBatch {
  const T = 2 + 2 * 6 + 2;
  const tokens = new Int32Array(B * T).fill(tok.pad),
    attn = new Float32Array(B * T),
    resp = new Float32Array(B * T);
  for (let r = 0; r < B; r++) {
    const L = 3 + rng.int(4);
    const xs = Array.from({ length: L }, () => LETTERS[rng.int(LETTERS.length)]).join('');
    const reverse = rng.int(2) === 1;
    const ys = reverse ? [...xs].reverse().join('') : xs;
    const ids = [tok.bos, ...tok.encode(`${reverse ? 'R' : 'C'}${xs}>`), ...tok.encode(ys), tok.eos];
    const start = ids.length - L - 1;
    ids.forEach((id, t) => {
      tokens[r * T + t] = id;
      attn[r * T + t] = 1;
      if (t >= start) resp[r * T + t] = 1;
    });
  }
  return { batchSize: B, seqLen: T, tokens, attentionMask: attn, responseMask: resp };
}

export async function trainCopyReverse(o: CopyReverseOptions = {}): Promise<CopyReverseResult> {
  const steps = o.steps ?? 600,
    B = o.batchSize ?? 64,
    seed = o.seed ?? 0,
    target = o.targetAccuracy ?? 0.99,
    evalEvery = o.evalEvery ?? 25;
  const log = o.log ?? (() => undefined);
  const tok = new AlphabetTokenizer(`${LETTERS}CR>`);
  const model = modelConfig({
    hiddenSize: 64,
    intermediateSize: 128,
    numHiddenLayers: 2,
    numAttentionHeads: 4,
    numKeyValueHeads: 2,
    vocabSize: tok.vocabSize,
    maxPositionEmbeddings: 32,
    bosTokenId: tok.bos,
    eosTokenId: tok.eos,
    padTokenId: tok.pad,
  });
  const trainer = createTrainer({
    model,
    loss: { type: 'sft' },
    seed,
    threads: o.threads,
    optim: { weightDecay: 0.01, maxGradNorm: 1 },
  });
  const rng = Rng.fromSeed(`copy-reverse:train:${seed}`);
  const heldOut = makeCopyReverseBatch(tok, 256, Rng.fromSeed(`copy-reverse:eval:${seed}`));
  const sched = { lr: 3e-3, scheduler: 'cosine' as const, warmupSteps: 20, minLrRatio: 0.1 };
  const history: CopyReverseResult['history'] = [];
  const t0 = performance.now();
  let accuracy = (await trainer.evaluate(heldOut)).metrics.token_acc,
    step = 0;
  history.push({ step: 0, loss: NaN, accuracy });
  log(`step    0  held-out acc ${(100 * accuracy).toFixed(2)}% (untrained)`);
  while (step < steps) {
    step++;
    const r = await trainer.step(makeCopyReverseBatch(tok, B, rng), lrAt(sched, step, steps));
    if (step % evalEvery === 0 || step === steps) {
      accuracy = (await trainer.evaluate(heldOut)).metrics.token_acc;
      history.push({ step, loss: r.metrics.sft_loss, accuracy });
      log(
        `step ${String(step).padStart(4)}  loss ${r.metrics.sft_loss.toFixed(4)}  train acc ${(100 * r.metrics.token_acc).toFixed(1)}%  held-out acc ${(100 * accuracy).toFixed(2)}%  ${((performance.now() - t0) / 1000).toFixed(1)} s`,
      );
      if (accuracy >= target) break;
    }
  }
  return { steps: step, accuracy, history, seconds: (performance.now() - t0) / 1000 };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values } = parseArgs({
    options: { steps: { type: 'string' }, threads: { type: 'string' }, seed: { type: 'string' } },
  });
  const res = await trainCopyReverse({
    steps: values.steps ? Number(values.steps) : undefined,
    threads: values.threads ? Number(values.threads) : undefined,
    seed: values.seed ? Number(values.seed) : undefined,
    log: (l) => console.log(l),
  });
  console.log(
    `${res.accuracy >= 0.99 ? 'reached' : 'did NOT reach'} 99 % token accuracy: ${(100 * res.accuracy).toFixed(2)}% after ${res.steps} steps in ${res.seconds.toFixed(1)} s`,
  );
  if (res.accuracy < 0.99) process.exitCode = 1;
}
