/**
 * The glyphs example's recogniser: an MLP on the S×S pixels (S² → H → GELU → H → GELU → K),
 * trained here by cross-entropy (Adam, in the graph builder) on jittered renders of the training
 * faces, exported as a self-contained ONNX model (weights as initializers; input `image`
 * [B, 1, S, S] in [−1, 1], output `probs` [B, K]).
 * Reward of a generated image for the requested character c: ocr_confidence = p(c | image);
 * vlm_score = cleanliness = mean over pixels of |x| (1 = every pixel pure black or white).
 */
import { GraphBuilder, type Var } from '../../lib/onnx/builder.ts';
import { gelu, linear, tokenLogprobEntropy } from '../../lib/onnx/nn.ts';
import { createSession, tensor } from '../../lib/onnx/runtime.ts';
import { Rng } from '../../lib/util/rng.ts';
import type { InferenceSession } from 'onnxruntime-node';

export interface RecogniserShape {
  size: number;
  hidden: number;
  classes: number;
}

const names = ['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias', 'out.weight', 'out.bias'];
function shapes(s: RecogniserShape): number[][] {
  const D = s.size * s.size,
    H = s.hidden;
  return [[H, D], [H], [H, H], [H], [s.classes, H], [s.classes]];
}

function logits(b: GraphBuilder, s: RecogniserShape, x: Var, p: Var[]): Var {
  const flat = b.reshape(x, ['B', s.size * s.size]);
  const h1 = gelu(b, linear(b, flat, p[0], p[1]));
  const h2 = gelu(b, linear(b, h1, p[2], p[3]));
  return linear(b, h2, p[4], p[5]);
}

export class Recogniser {
  private session: InferenceSession | null = null;
  constructor(
    readonly shape: RecogniserShape,
    readonly weights: Float32Array[],
  ) {}

  /** The self-contained ONNX model. */
  toOnnx(): Uint8Array {
    const b = new GraphBuilder({ name: 'glyph_recogniser' });
    const x = b.input('image', 'float32', ['B', 1, this.shape.size, this.shape.size]);
    const p = shapes(this.shape).map((sh, i) => b.initializer(names[i], this.weights[i], sh));
    b.output(b.softmax(logits(b, this.shape, x, p), -1), 'probs');
    return b.toBytes();
  }

  /** Class probabilities [B, K] of flat images [B, S·S]. */
  async probs(images: Float32Array): Promise<Float32Array> {
    this.session ??= await createSession(this.toOnnx(), { threads: 1 });
    const px = this.shape.size * this.shape.size;
    const B = images.length / px;
    const out = await this.session.run({ image: tensor('float32', images, [B, 1, this.shape.size, this.shape.size]) });
    return out.probs.data as Float32Array;
  }

  /** ocr_confidence (p of the requested class), vlm_score (cleanliness) and whether the argmax is right, per image. */
  async score(
    images: Float32Array,
    cls: number[],
  ): Promise<{ ocr_confidence: number; vlm_score: number; correct: boolean }[]> {
    const p = await this.probs(images);
    const K = this.shape.classes,
      px = this.shape.size * this.shape.size;
    return cls.map((c, i) => {
      const row = p.subarray(i * K, (i + 1) * K);
      let arg = 0;
      for (let k = 1; k < K; k++) if (row[k] > row[arg]) arg = k;
      let clean = 0;
      for (let j = i * px; j < (i + 1) * px; j++) clean += Math.min(1, Math.abs(images[j]));
      return { ocr_confidence: row[c], vlm_score: clean / px, correct: arg === c };
    });
  }

  /** Accuracy on a labelled set. */
  async accuracy(images: Float32Array, labels: number[]): Promise<number> {
    const s = await this.score(images, labels);
    return s.filter((r) => r.correct).length / s.length;
  }
}

/** Trains a recogniser by cross-entropy with Adam (minibatches drawn from `seed`). */
export async function trainRecogniser(
  data: { images: Float32Array; labels: number[] },
  shape: RecogniserShape,
  opts: { steps: number; batch: number; lr: number; seed: number | string; noise?: number },
): Promise<Recogniser> {
  const rng = Rng.fromSeed(opts.seed);
  const sh = shapes(shape);
  const w = sh.map((s) => {
    const n = s.reduce((a, b) => a * b, 1);
    const bound = s.length === 2 ? 1 / Math.sqrt(s[1]) : 0;
    return Float32Array.from({ length: n }, () => (rng.next() * 2 - 1) * bound);
  });
  const b = new GraphBuilder({ name: 'glyph_recogniser_train' });
  const x = b.input('image', 'float32', ['B', 1, shape.size, shape.size]);
  const y = b.input('label', 'int64', ['B']);
  const p = sh.map((s, i) => b.input(names[i], 'float32', s));
  const { logprob } = tokenLogprobEntropy(b, logits(b, shape, x, p), y, { entropy: false });
  const loss = b.neg(b.reduceMean(logprob, [0]));
  b.output(loss, 'loss');
  b.grad(loss, p).forEach((g, i) => b.output(g, `grad.${names[i]}`));
  const sess = await createSession(b.toBytes(), { threads: 2 });
  const m = w.map((a) => new Float32Array(a.length)),
    v = w.map((a) => new Float32Array(a.length));
  const px = shape.size * shape.size,
    n = data.labels.length;
  for (let step = 1; step <= opts.steps; step++) {
    const idx = Array.from({ length: opts.batch }, () => rng.int(n));
    const xb = new Float32Array(opts.batch * px);
    // pixel noise makes the recogniser read shapes rather than exact render values
    idx.forEach((k, i) => {
      for (let j = 0; j < px; j++)
        xb[i * px + j] = data.images[k * px + j] + (opts.noise ?? 0.3) * (rng.next() * 2 - 1);
    });
    const feeds: Record<string, ReturnType<typeof tensor>> = {
      image: tensor('float32', xb, [opts.batch, 1, shape.size, shape.size]),
      label: tensor(
        'int64',
        idx.map((k) => data.labels[k]),
        [opts.batch],
      ),
    };
    names.forEach((nm, i) => (feeds[nm] = tensor('float32', w[i], sh[i])));
    const out = await sess.run(feeds);
    const bc1 = 1 - 0.9 ** step,
      bc2 = 1 - 0.999 ** step;
    names.forEach((nm, i) => {
      const g = out[`grad.${nm}`].data as Float32Array;
      const wi = w[i],
        mi = m[i],
        vi = v[i];
      for (let j = 0; j < wi.length; j++) {
        mi[j] = 0.9 * mi[j] + 0.1 * g[j];
        vi[j] = 0.999 * vi[j] + 0.001 * g[j] * g[j];
        wi[j] -= (opts.lr * mi[j]) / bc1 / (Math.sqrt(vi[j] / bc2) + 1e-8);
      }
    });
  }
  return new Recogniser(shape, w);
}
