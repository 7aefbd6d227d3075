/**
 * The image policy's training graph: DiT forward → loss → backward → global-norm clip → AdamW, in
 * one ONNX graph (one `session.run` per step), or `grad` mode (loss, metrics and packed gradients).
 * Convention: x_t = (1 − t)·x₀ + t·ε (rectified flow, t = 1 noise), target velocity u = ε − x₀;
 * sampling integrates dx/dt = v from t = 1 to 0. Every per-image mean is over its C·S·S pixels.
 *
 * Losses (`IMAGE_LOSSES`), per image, averaged over the batch B:
 *  - `flow_matching` (SFT; Lipman et al. 2023, Liu et al. 2023): ‖v_θ(x_t, t, c) − u‖² (pixel mean).
 *    Inputs x0, noise [B, C, S, S], t [B], cls [B].
 *  - `flow_grpo` (Liu et al. 2025, arXiv 2505.05470, eq. 9–12): one denoising step x_t → x_s
 *    (s < t) of the SDE sampler (sde.ts) with mean μ_θ = x_t·(1 + σ²(s−t)/(2t)) + v_θ·(1 + σ²(1−t)/(2t))·(s−t)
 *    and std σ√(t−s); log p = pixel-mean of the Gaussian log-density of x_s; ratio r = e^{log p − log p_old};
 *    loss = −min(r·A, clip(r, 1 − ε_lo, 1 + ε_hi)·A) + β·pixel-mean(μ_θ − μ_ref)²/(2σ²(t−s)).
 *    Inputs x_t, x_next, t, t_next, sigma, cls, old_log_probs, advantages [B], ref_mean (β > 0).
 *  - `diffusion_nft` (Zheng et al. 2025, arXiv 2509.16117, eq. 8): from a clean generation x₀ and
 *    its optimality r ∈ [0, 1], with the sampling policy's velocity v_old (no gradient):
 *    v⁺ = (1 − β)·v_old + β·v_θ, v⁻ = (1 + β)·v_old − β·v_θ;
 *    loss = r·‖v⁺ − u‖² + (1 − r)·‖v⁻ − u‖². Inputs x0, noise, t, cls, v_old, nft_r [B].
 *    With `nftAdaptiveWeight` each term is the paper's adaptively weighted x₀ error instead:
 *    ‖v± − u‖² → t²·‖v± − u‖² / sg(max(t·|v± − u|‾, 1e-5)) (sg: no gradient; |·|‾ the pixel mean).
 * With `lora` (lib/image/lora.ts) the adapters are inputs too and the gradients, the clip norm and
 * AdamW are theirs only; the base weights are inputs without gradients.
 * With `cfgScale` w ≠ 1 both RL losses train the guided velocity v_∅ + w·(v_c − v_∅) in place of
 * v_θ (Ho & Salimans 2022; Flow-GRPO trains SD3.5 with CFG this way): the DiT runs twice on the
 * batch, once with the prompt's class and once with the null class, and the gradient reaches both.
 */
import { GraphBuilder, type Var } from '../onnx/builder.ts';
import { numel } from '../onnx/dims.ts';
import { declareDitParams, ditForward, ditParamSpecs, type DitConfig } from './dit.ts';
import { ditLoraScale, ditLoraSpecs, type DitLora } from './lora.ts';

export const IMAGE_LOSSES = ['flow_matching', 'flow_grpo', 'diffusion_nft'] as const;
/** The RL losses of an image policy: its values of algorithm.policy_loss. */
export const IMAGE_RL_LOSSES = [
  'flow_grpo',
  'diffusion_nft',
] as const satisfies readonly (typeof IMAGE_LOSSES)[number][];
export type ImageLossName = (typeof IMAGE_LOSSES)[number];

export interface ImageLossConfig {
  name: ImageLossName;
  /** flow_grpo: clip range of the ratio (1 − clipLow, 1 + clipHigh). */
  clipLow?: number;
  clipHigh?: number;
  /** flow_grpo: KL coefficient β (0 = no reference model). */
  klCoef?: number;
  /** diffusion_nft: β, the step of the implicit positive/negative policies. */
  nftBeta?: number;
  /**
   * diffusion_nft: the paper's adaptive weighting. Each term is the x₀-prediction error
   * x̂₀ − x₀ = t·(u − v±) (x̂₀ = x_t − t·v±) in squared pixel mean, divided by its own pixel-mean
   * absolute value (no gradient, at least 1e-5): t²·‖v± − u‖² / max(t·|v± − u|‾, 1e-5).
   */
  nftAdaptiveWeight?: boolean;
  /**
   * flow_grpo, diffusion_nft: classifier-free guidance scale w of the velocity the loss trains,
   * v = v_θ(x, t, ∅) + w·(v_θ(x, t, c) − v_θ(x, t, ∅)) (both halves from the same weights, ∅ the
   * null class numClasses); 1 or absent: the conditional velocity v_θ(x, t, c).
   */
  cfgScale?: number;
}

export interface ImageOptim {
  betas: [number, number];
  eps: number;
  weightDecay: number;
  maxGradNorm: number | null;
}

export interface ImageTrainGraphSpec {
  dit: DitConfig;
  loss: ImageLossConfig;
  optim: ImageOptim;
  mode: 'grad' | 'step';
  gradientCheckpointing?: boolean;
  /** LoRA (lib/image/lora.ts): the adapters are the trained parameters, the base weights frozen inputs. */
  lora?: DitLora | null;
}

/** Names of the `metrics` output's entries (batch means). */
export const IMAGE_METRICS: Record<ImageLossName, string[]> = {
  flow_matching: ['loss'],
  flow_grpo: ['loss', 'kl', 'clipfrac', 'log_prob'],
  diffusion_nft: ['loss', 'pos_mse', 'neg_mse'],
};

/** Which batch inputs each loss reads (besides the parameters). */
export function imageLossInputs(loss: ImageLossConfig): string[] {
  switch (loss.name) {
    case 'flow_matching':
      return ['x0', 'noise', 't', 'cls'];
    case 'flow_grpo':
      return [
        'x_t',
        'x_next',
        't',
        't_next',
        'sigma',
        'cls',
        'old_log_probs',
        'advantages',
        ...((loss.klCoef ?? 0) > 0 ? ['ref_mean'] : []),
      ];
    case 'diffusion_nft':
      return ['x0', 'noise', 't', 'cls', 'v_old', 'nft_r'];
  }
}

/** Per-image pixel mean of x [B, C, S, S] → [B]. */
function pixMean(b: GraphBuilder, x: Var): Var {
  return b.reduceMean(x, [1, 2, 3]);
}

/** Flow-GRPO's SDE step mean μ(x_t, v) and std σ√(t − s) (see the header; sde.ts has the sampler's copy). */
export function sdeStepGraph(
  b: GraphBuilder,
  xt: Var,
  v: Var,
  t: Var,
  tNext: Var,
  sigma: Var,
): { mean: Var; std: Var } {
  const c4 = (z: Var) => b.unsqueeze(z, [1, 2, 3]);
  const dt = b.sub(tNext, t); // [B], < 0
  const s2 = b.mul(sigma, sigma);
  const kx = b.add(b.div(b.mul(s2, dt), b.mul(t, 2)), 1);
  const kv = b.mul(b.add(b.div(b.mul(s2, b.sub(1, t)), b.mul(t, 2)), 1), dt);
  const mean = b.add(b.mul(xt, c4(kx)), b.mul(v, c4(kv)));
  return { mean, std: b.mul(sigma, b.sqrt(b.neg(dt))) };
}

export interface ImageTrainGraph {
  builder: GraphBuilder;
  metricNames: string[];
  batchInputs: string[];
}

export function buildImageTrainGraph(spec: ImageTrainGraphSpec): ImageTrainGraph {
  const { dit: c, loss, optim } = spec;
  const b = new GraphBuilder({ name: `image_${loss.name}_${spec.mode}`, float: 'float32' });
  const img = ['B', c.channels, c.imageSize, c.imageSize];
  const names = imageLossInputs(loss);
  const inp = new Map<string, Var>();
  for (const n of names)
    inp.set(
      n,
      b.input(
        n,
        n === 'cls' ? 'int64' : 'float32',
        ['t', 't_next', 'sigma', 'cls', 'old_log_probs', 'advantages', 'nft_r'].includes(n) ? ['B'] : img,
      ),
    );
  const I = (n: string) => inp.get(n)!;
  const p = declareDitParams(b, c);
  // the trained parameters: every weight, or (LoRA) the adapters
  const specs = spec.lora ? ditLoraSpecs(c, spec.lora) : ditParamSpecs(c);
  if (spec.lora) for (const s of specs) p.set(s.name, b.input(s.name, b.float, s.shape));
  const guide = loss.name === 'flow_matching' ? 1 : (loss.cfgScale ?? 1);
  const v = (x: Var, t: Var): Var => {
    const fwd = (cls: Var) =>
      ditForward(b, c, p, x, t, cls, {
        checkpoint: spec.gradientCheckpointing,
        ...(spec.lora ? { loraScale: ditLoraScale(spec.lora) } : {}),
      });
    const vc = fwd(I('cls'));
    if (guide === 1) return vc;
    const nullCls = b.add(b.mul(I('cls'), b.const(0, 'int64')), b.const(c.numClasses, 'int64'));
    const vn = fwd(nullCls);
    return b.add(vn, b.mul(b.sub(vc, vn), guide));
  };
  const c4 = (z: Var) => b.unsqueeze(z, [1, 2, 3]);
  let lossVar: Var;
  const metrics: Var[] = [];
  if (loss.name === 'flow_matching' || loss.name === 'diffusion_nft') {
    const x0 = I('x0'),
      eps = I('noise'),
      t = I('t');
    const xt = b.add(b.mul(x0, c4(b.sub(1, t))), b.mul(eps, c4(t)));
    const u = b.sub(eps, x0);
    const vt = v(xt, t);
    if (loss.name === 'flow_matching') {
      lossVar = b.reduceMean(pixMean(b, b.square(b.sub(vt, u))), [0]);
      metrics.push(lossVar);
    } else {
      const beta = loss.nftBeta ?? 1;
      const vOld = I('v_old'),
        r = I('nft_r');
      const vPos = b.add(b.mul(vOld, 1 - beta), b.mul(vt, beta));
      const vNeg = b.sub(b.mul(vOld, 1 + beta), b.mul(vt, beta));
      const term = (vv: Var): Var => {
        if (!loss.nftAdaptiveWeight) return pixMean(b, b.square(b.sub(vv, u)));
        // x̂₀ − x₀ = t·(u − v): squared error over the (constant) mean absolute error
        const e = b.mul(b.sub(u, vv), c4(t));
        return b.div(pixMean(b, b.square(e)), b.stopGradient(b.max(pixMean(b, b.abs(e)), 1e-5)));
      };
      const pos = term(vPos);
      const neg = term(vNeg);
      lossVar = b.reduceMean(b.add(b.mul(r, pos), b.mul(b.sub(1, r), neg)), [0]);
      metrics.push(lossVar, b.reduceMean(pos, [0]), b.reduceMean(neg, [0]));
    }
  } else {
    const t = I('t');
    const { mean, std } = sdeStepGraph(b, I('x_t'), v(I('x_t'), t), t, I('t_next'), I('sigma'));
    const logp = gaussianLogProbGraph(b, I('x_next'), mean, std);
    const adv = I('advantages');
    const ratio = b.exp(b.sub(logp, I('old_log_probs')));
    const lo = 1 - (loss.clipLow ?? 1e-4),
      hi = 1 + (loss.clipHigh ?? 1e-4);
    const clipped = b.min(b.max(ratio, lo), hi);
    const pg = b.neg(b.min(b.mul(ratio, adv), b.mul(clipped, adv)));
    const beta = loss.klCoef ?? 0;
    let kl: Var = b.mul(b.reduceSum(logp, [0]), 0);
    let per = pg;
    if (beta > 0) {
      const klB = b.div(pixMean(b, b.square(b.sub(mean, I('ref_mean')))), b.mul(b.square(std), 2));
      per = b.add(pg, b.mul(klB, beta));
      kl = b.reduceMean(klB, [0]);
    }
    lossVar = b.reduceMean(per, [0]);
    const clipfrac = b.reduceMean(b.cast(b.or(b.less(ratio, lo), b.greater(ratio, hi)), 'float32'), [0]);
    metrics.push(lossVar, kl, b.stopGradient(clipfrac), b.reduceMean(logp, [0]));
  }
  b.output(
    b.concat(
      metrics.map((m) => b.reshape(b.stopGradient(m), [1])),
      0,
    ),
    'metrics',
  );
  const pv = specs.map((s) => p.get(s.name)!);
  const grads = b.grad(lossVar, pv);
  const pack = (vs: Var[]) =>
    b.concat(
      vs.map((x) => b.reshape(x, [numel(x.shape)])),
      0,
    );
  if (spec.mode === 'grad') {
    b.output(pack(grads), 'grad.packed');
    return { builder: b, metricNames: IMAGE_METRICS[loss.name], batchInputs: names };
  }
  b.scope('optim', () => {
    const sq = grads.map((g) =>
      b.reduceSum(
        b.mul(g, g),
        g.shape.map((_, i) => i),
      ),
    );
    const norm = b.sqrt(sq.slice(1).reduce((a, s) => b.add(a, s), sq[0]));
    b.output(norm, 'grad_norm');
    const coef = optim.maxGradNorm === null ? null : b.min(b.div(optim.maxGradNorm, b.add(norm, 1e-6)), 1);
    const stepSize = b.input('adam_step_size', 'float32', []);
    const bc2Sqrt = b.input('adam_bc2_sqrt', 'float32', []);
    const decay = b.input('adam_decay', 'float32', []);
    const [b1, b2] = optim.betas;
    const W: Var[] = [],
      M: Var[] = [],
      V: Var[] = [];
    specs.forEach((s, i) => {
      const g = coef ? b.mul(grads[i], coef) : grads[i];
      const m = b.input(`${s.name}.exp_avg`, 'float32', s.shape);
      const vv = b.input(`${s.name}.exp_avg_sq`, 'float32', s.shape);
      const m2 = b.add(b.mul(m, b1), b.mul(g, 1 - b1));
      const v2 = b.add(b.mul(vv, b2), b.mul(b.mul(g, g), 1 - b2));
      const upd = b.mul(b.div(m2, b.add(b.div(b.sqrt(v2), bc2Sqrt), optim.eps)), stepSize);
      const w = optim.weightDecay !== 0 ? b.mul(pv[i], decay) : pv[i];
      W.push(b.sub(w, upd));
      M.push(m2);
      V.push(v2);
    });
    b.output(pack([...W, ...M, ...V]), 'new.packed');
  });
  return { builder: b, metricNames: IMAGE_METRICS[loss.name], batchInputs: names };
}

/** Pixel-mean Gaussian log-density of x under N(mean, std²) per image: [B] (Flow-GRPO averages over pixels). */
export function gaussianLogProbGraph(b: GraphBuilder, x: Var, mean: Var, std: Var): Var {
  const s = b.unsqueeze(std, [1, 2, 3]);
  const z = b.div(b.sub(x, mean), s);
  const lp = b.sub(b.mul(b.square(z), -0.5), b.add(b.log(s), 0.5 * Math.log(2 * Math.PI)));
  return pixMean(b, lp);
}
