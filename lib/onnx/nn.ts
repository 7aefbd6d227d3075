/**
 * Composite neural-net ops with hand-written backward rules next to their forward rules
 * (recorded with `b.customVjp`, so the backward graph is as small as a framework's fused kernel).
 * Shapes in comments: N rows (tokens), D features, V vocabulary.
 */
import { GraphBuilder, GraphError, Var, dimEq, fmtShape } from './builder.ts';

/** y = x Wᵀ (+ bias) for x [N, in], W [out, in] (torch Linear layout), as one Gemm. */
export function linear(b: GraphBuilder, x: Var, w: Var, bias?: Var | null): Var {
  if (x.rank !== 2) throw new GraphError(`linear: input ${x.name} must be 2-D [N, in], got ${fmtShape(x.shape)}`);
  return b.gemm(x, w, { transB: true, c: bias ?? undefined });
}

/**
 * RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm): y = x · rsqrt(mean(x², -1) + eps) · w.
 * x [..., D], w [D]. Backward: with x̂ = x·r, gx̂ = g·w: gx = r·(gx̂ − x̂·mean(gx̂·x̂)), gw = Σ g·x̂.
 */
export function rmsNorm(b: GraphBuilder, x: Var, w: Var, eps: number): Var {
  const D = x.shape[x.rank - 1];
  if (w.rank !== 1 || !dimEq(w.shape[0], D))
    throw new GraphError(
      `rmsNorm: weight ${w.name} ${fmtShape(w.shape)} does not match last dim of ${x.name} ${fmtShape(x.shape)}`,
    );
  const { y, xhat, r } = b.scope('rmsnorm', () => {
    const ms = b.stopGradient(b.reduceMean(b.mul(x, x), [-1], true));
    const r = b.stopGradient(b.reciprocal(b.sqrt(b.add(ms, eps))));
    const xhat = b.stopGradient(b.mul(x, r));
    const y = b.stopGradient(b.mul(xhat, w));
    return { y, xhat, r };
  });
  b.customVjp([x, w], [y], ([g]) => {
    const gxh = b.mul(g!, w);
    const dot = b.reduceMean(b.mul(gxh, xhat), [-1], true);
    const gx = b.mul(r, b.sub(gxh, b.mul(xhat, dot)));
    const gw = b.sumTo(b.mul(g!, xhat), w.shape);
    return [gx, gw];
  });
  return y;
}

/** SiLU x·σ(x); backward g·σ·(1 + x·(1 − σ)). */
export function silu(b: GraphBuilder, x: Var): Var {
  const { y, s } = b.scope('silu', () => {
    const s = b.stopGradient(b.sigmoid(x));
    return { y: b.stopGradient(b.mul(x, s)), s };
  });
  b.customVjp([x], [y], ([g]) => [b.mul(g!, b.mul(s, b.add(b.mul(x, b.sub(1, s)), 1)))]);
  return y;
}

/** SwiGLU gate: silu(gate) · up, with one fused backward. */
export function swiglu(b: GraphBuilder, gate: Var, up: Var): Var {
  const { y, s, sg } = b.scope('swiglu', () => {
    const s = b.stopGradient(b.sigmoid(gate));
    const sg = b.stopGradient(b.mul(gate, s));
    return { y: b.stopGradient(b.mul(sg, up)), s, sg };
  });
  b.customVjp([gate, up], [y], ([g]) => {
    const gUp = b.mul(g!, sg);
    const gGate = b.mul(b.mul(g!, up), b.mul(s, b.add(b.mul(gate, b.sub(1, s)), 1)));
    return [gGate, gUp];
  });
  return y;
}

/**
 * Rotary position embedding, HF rotate_half convention (Su et al. 2021): for x [..., hd] with
 * halves (x₁, x₂): y = x·cos + (−x₂, x₁)·sin. cos/sin broadcast to x. Backward:
 * gx = g·cos + rotᵀ(g·sin) with rotᵀ(z₁, z₂) = (z₂, −z₁).
 */
export function rope(b: GraphBuilder, x: Var, cos: Var, sin: Var): Var {
  const hd = x.shape[x.rank - 1];
  if (typeof hd !== 'number' || hd % 2 !== 0)
    throw new GraphError(`rope: head dim of ${x.name} ${fmtShape(x.shape)} must be a static even number`);
  const half = hd / 2;
  const y = b.scope('rope', () => {
    const [x1, x2] = b.split(x, -1, [half, half]);
    const rot = b.concat([b.neg(x2), x1], -1);
    return b.stopGradient(b.add(b.mul(x, cos), b.mul(rot, sin)));
  });
  b.customVjp([x, null, null], [y], ([g]) => {
    const gs = b.mul(g!, sin);
    const [z1, z2] = b.split(gs, -1, [half, half]);
    return [b.add(b.mul(g!, cos), b.concat([z2, b.neg(z1)], -1)), null, null];
  });
  return y;
}

/**
 * Per-token log-prob of `targets` and entropy of softmax(logits), logits [N, V], targets [N]
 * (int64). lp = z_t − lse(z); H = lse(z) − Σ p·z. Backward (one fused rule):
 * dz = g_lp·(onehot(t) − p) − g_H·p·(log p + H).
 */
export function tokenLogprobEntropy(
  b: GraphBuilder,
  logits: Var,
  targets: Var,
  opts: { entropy?: boolean } = {},
): { logprob: Var; entropy: Var | null } {
  if (logits.rank !== 2 || targets.rank !== 1 || !dimEq(logits.shape[0], targets.shape[0]))
    throw new GraphError(
      `tokenLogprobEntropy: need logits [N, V] and targets [N], got ${fmtShape(logits.shape)} and ${fmtShape(targets.shape)}`,
    );
  if (targets.dtype !== 'int64') throw new GraphError(`tokenLogprobEntropy: targets ${targets.name} must be int64`);
  const wantEnt = opts.entropy ?? true;
  const N = logits.shape[0],
    V = logits.shape[1];
  const { logprob, entropy, lsm, p, tcol } = b.scope('logprob', () => {
    const lsm = b.stopGradient(b.logSoftmax(logits, -1));
    const tcol = b.unsqueeze(targets, [1]);
    const logprob = b.stopGradient(b.squeeze(b.gatherElements(lsm, tcol, 1), [1]));
    let entropy: Var | null = null,
      p: Var | null = null;
    if (wantEnt) {
      p = b.stopGradient(b.exp(lsm));
      entropy = b.stopGradient(b.neg(b.reduceSum(b.mul(p, lsm), [1])));
    }
    return { logprob, entropy, lsm, p, tcol };
  });
  const outs = entropy ? [logprob, entropy] : [logprob];
  b.customVjp([logits, null], outs, ([gLp, gEnt]) => {
    const P = p ?? b.exp(lsm);
    let dz: Var | null = null;
    if (gLp) {
      const onehot = b.cast(b.equal(tcol, b.unsqueeze(b.range(V), [0])), logits.dtype);
      const gcol = b.unsqueeze(gLp, [1]);
      dz = b.mul(gcol, b.sub(onehot, P));
    }
    if (gEnt && entropy) {
      const t = b.mul(b.neg(b.unsqueeze(gEnt, [1])), b.mul(P, b.add(lsm, b.unsqueeze(entropy, [1]))));
      dz = dz ? b.add(dz, t) : t;
    }
    return [dz ?? b.zeros([N, V], logits.dtype), null];
  });
  return { logprob, entropy };
}

/**
 * Embedding lookup table[ids] for table [V, D], ids [...] (int64). Backward: for V ≤
 * `oneHotMaxVocab` the table gradient is one Gemm onehot(ids)ᵀ·g (fast, deterministic, threads
 * safe); above it a ScatterElements(add) (never ScatterND, which loses duplicates with threads).
 */
export function embedding(b: GraphBuilder, table: Var, ids: Var, opts: { oneHotMaxVocab?: number } = {}): Var {
  if (table.rank !== 2)
    throw new GraphError(`embedding: table ${table.name} must be [V, D], got ${fmtShape(table.shape)}`);
  const V = table.shape[0],
    D = table.shape[1];
  if (typeof V !== 'number' || V > (opts.oneHotMaxVocab ?? 4096)) return b.gather(table, ids);
  const y = b.stopGradient(b.gather(table, ids));
  b.customVjp([table, null], [y], ([g]) => {
    const n = ids.shape.reduce<number | string>((p, d) => (p === 1 ? d : `${p}*${d}`), 1);
    const flatIds = b.reshape(ids, [n]);
    const onehot = b.cast(b.equal(b.unsqueeze(b.range(V), [1]), b.unsqueeze(flatIds, [0])), table.dtype); // [V, n]
    return [b.gemm(onehot, b.reshape(g!, [n, D])), null];
  });
  return y;
}

export interface ChunkedHeadOptions {
  /** Also compute the entropy (default true). */
  entropy?: boolean;
  /** Logits are divided by this (a number or a float scalar input); default 1. */
  temperature?: number | Var;
  /** Vocabulary rows per chunk (default 8192): the largest logits tensor that exists is [N, chunk]. */
  chunk?: number;
  /** Also output whether each target is a maximum of its row (SFT accuracy; bool [N]). */
  correct?: boolean;
  /**
   * Additive logit bias [V] (−1e9 at ids sampling never emits), added before the
   * temperature, as the sampler does (decode-graph.ts logitBiasOf); a constant, so no gradient.
   */
  logitBias?: Float32Array | null;
}

/** Near-equal vocabulary chunk boundaries [lo, hi) covering 0..V. */
export function vocabChunks(V: number, chunk: number): [number, number][] {
  if (!(Number.isInteger(chunk) && chunk > 0))
    throw new GraphError(`vocabChunks: chunk must be a positive integer, got ${chunk}`);
  const k = Math.max(1, Math.ceil(V / chunk));
  const out: [number, number][] = [];
  for (let i = 0; i < k; i++) out.push([Math.floor((i * V) / k), Math.floor(((i + 1) * V) / k)]);
  return out;
}

/**
 * The LM head fused with the per-token log-prob / entropy, chunked over the vocabulary so the full
 * [N, V] logits never exist: hidden h [N, D], head weight W [V, D] (torch layout), targets [N]
 * int64. With z = h·Wᵀ/τ split into chunks z_c = h·W_cᵀ/τ [N, V_c] (V_c ≤ chunk), an online
 * log-sum-exp (Milakov & Gimelshein 2018): m_c = max z_c, s_c = Σ e^{z_c − m_c}, t_c = Σ e^{z_c − m_c}·z_c;
 * M = max_c m_c, lse = M + log Σ_c s_c e^{m_c − M}; lp = z_t − lse; H = lse − Σ_c e^{m_c − lse}·t_c.
 * Backward recomputes each chunk (one more Gemm per chunk; nothing [N, V] is kept): with
 * p_c = e^{z_c − lse}, dz_c = (g_lp·(onehot_c(t) − p_c) − g_H·p_c·(z_c − lse + H)) / τ;
 * dh = Σ_c dz_c·W_c, dW_c = dz_cᵀ·h — the same gradient as `tokenLogprobEntropy(h·Wᵀ/τ, t)`.
 */
export function chunkedLmHeadLogprob(
  b: GraphBuilder,
  h: Var,
  w: Var,
  targets: Var,
  opts: ChunkedHeadOptions = {},
): { logprob: Var; entropy: Var | null; correct: Var | null } {
  if (
    h.rank !== 2 ||
    w.rank !== 2 ||
    targets.rank !== 1 ||
    !dimEq(h.shape[0], targets.shape[0]) ||
    !dimEq(h.shape[1], w.shape[1])
  )
    throw new GraphError(
      `chunkedLmHeadLogprob: need hidden [N, D], weight [V, D] and targets [N], got ${fmtShape(h.shape)}, ${fmtShape(w.shape)} and ${fmtShape(targets.shape)}`,
    );
  if (targets.dtype !== 'int64') throw new GraphError(`chunkedLmHeadLogprob: targets ${targets.name} must be int64`);
  const V = w.shape[0];
  if (typeof V !== 'number')
    throw new GraphError(`chunkedLmHeadLogprob: vocabulary size of ${w.name} must be static, got ${fmtShape(w.shape)}`);
  const wantEnt = opts.entropy ?? true;
  const tau = opts.temperature ?? 1;
  const chunks = vocabChunks(V, opts.chunk ?? 8192);
  const tcol = b.unsqueeze(targets, [1]); // [N, 1]
  const bias = opts.logitBias ?? null;
  if (bias && bias.length !== V)
    throw new GraphError(`chunkedLmHeadLogprob: logitBias has ${bias.length} values for a vocabulary of ${V}`);
  const biasVar = bias
    ? b.initializer(
        `${h.name.replace(/:\d+$/, '')}/logit_bias`,
        h.dtype === 'float64' ? Float64Array.from(bias) : bias,
        [1, V],
        h.dtype,
      )
    : null; // [1, V], h's float type
  // ORT runs nodes in a topological order of its own choosing and would otherwise start every
  // chunk's Gemm before finishing any chunk, keeping all the [N, V_c] tensors alive: chunk c + 1
  // reads h + 0·(one element of each of chunk c's results), a data dependency that costs one
  // [N, D] Add and makes every chunk finish (and free its logits) before the next starts
  const after = (x: Var, deps: Var[]): Var => {
    if (deps.length === 0) return x;
    const first = (d: Var) => b.slice(b.slice(d, 0, 0, 1), 1, 0, 1); // [1, 1]
    const s = deps.slice(1).reduce((a, d) => b.add(a, first(d)), first(deps[0]));
    return b.add(x, b.mul(s, 0));
  };
  const logitsOf = (wc: Var, lo: number, hi: number, hc: Var = h): Var => {
    let z = b.gemm(hc, wc, { transB: true }); // [N, V_c]
    if (biasVar) z = b.add(z, chunks.length === 1 ? biasVar : b.slice(biasVar, 1, lo, hi));
    return tau === 1 ? z : b.div(z, tau);
  };
  const chunkW = (lo: number, hi: number): Var => (chunks.length === 1 ? w : b.slice(w, 0, lo, hi));
  const fwd = b.scope('chunked_head', () => {
    const ms: Var[] = [],
      ss: Var[] = [],
      ts: Var[] = [],
      zts: Var[] = [];
    chunks.forEach(([lo, hi], i) =>
      b.scope(`c${i}`, () => {
        const prev = i === 0 ? [] : [ms[i - 1], ss[i - 1], zts[i - 1], ...(wantEnt ? [ts[i - 1]] : [])];
        const z = b.stopGradient(logitsOf(chunkW(lo, hi), lo, hi, after(h, prev)));
        const m = b.reduceMax(z, [1], true); // [N, 1]
        const e = b.exp(b.sub(z, m));
        ms.push(m);
        ss.push(b.reduceSum(e, [1], true));
        if (wantEnt) ts.push(b.reduceSum(b.mul(e, z), [1], true));
        // z at the target when it falls in [lo, hi)
        const rel = b.sub(tcol, b.const(lo, 'int64'));
        const inside = b.and(b.greaterOrEqual(rel, b.const(0, 'int64')), b.less(rel, b.const(hi - lo, 'int64')));
        const idx = b.where(inside, rel, b.const(0, 'int64'));
        zts.push(b.where(inside, b.gatherElements(z, idx, 1), 0));
      }),
    );
    const cat = (xs: Var[]) => (xs.length === 1 ? xs[0] : b.concat(xs, 1)); // [N, K]
    const m = cat(ms),
      M = b.reduceMax(m, [1], true);
    const scale = b.exp(b.sub(m, M)); // [N, K]
    const lse = b.stopGradient(b.add(M, b.log(b.reduceSum(b.mul(cat(ss), scale), [1], true)))); // [N, 1]
    const zt = b.reduceSum(cat(zts), [1], true);
    const logprob = b.stopGradient(b.squeeze(b.sub(zt, lse), [1]));
    let entropy: Var | null = null;
    if (wantEnt)
      entropy = b.stopGradient(
        b.squeeze(b.sub(lse, b.reduceSum(b.mul(cat(ts), b.exp(b.sub(m, lse))), [1], true)), [1]),
      );
    const correct = opts.correct ? b.squeeze(b.greaterOrEqual(zt, M), [1]) : null;
    return { logprob, entropy, lse, correct };
  });
  const { logprob, entropy, lse } = fwd;
  const outs = entropy ? [logprob, entropy] : [logprob];
  b.customVjp([h, w, null], outs, ([gLp, gEnt]) => {
    if (!gLp && !(gEnt && entropy)) return [b.zerosLike(h), b.zerosLike(w), null];
    const Hcol = entropy ? b.unsqueeze(entropy, [1]) : null;
    let dh: Var | null = null;
    const dws: Var[] = [];
    chunks.forEach(([lo, hi], i) =>
      b.scope(`c${i}`, () => {
        const wc = chunkW(lo, hi);
        const hc = after(h, dh ? [dh, dws[dws.length - 1]] : []);
        const zl = b.sub(logitsOf(wc, lo, hi, hc), lse); // log p_c [N, V_c]
        const p = b.exp(zl);
        let dz: Var | null = null;
        if (gLp) {
          const onehot = b.cast(
            b.equal(b.sub(tcol, b.const(lo, 'int64')), b.unsqueeze(b.range(hi - lo), [0])),
            h.dtype,
          );
          dz = b.mul(b.unsqueeze(gLp, [1]), b.sub(onehot, p));
        }
        if (gEnt && Hcol) {
          const t = b.mul(b.neg(b.unsqueeze(gEnt, [1])), b.mul(p, b.add(zl, Hcol)));
          dz = dz ? b.add(dz, t) : t;
        }
        if (tau !== 1) dz = b.div(dz!, tau);
        dh = b.gemm(dz!, wc, dh ? { c: dh } : {}); // [N, D]
        dws.push(b.gemm(dz!, hc, { transA: true })); // [V_c, D]
      }),
    );
    return [dh!, dws.length === 1 ? dws[0] : b.concat(dws, 0), null];
  });
  return { logprob, entropy, correct: fwd.correct };
}

/**
 * LayerNorm (Ba et al. 2016; torch nn.LayerNorm over the last dim): x̂ = (x − mean(x))·r,
 * r = rsqrt(var(x) + eps) (biased variance), y = x̂·w + bias. x [..., D], w and bias [D].
 * Backward: with gx̂ = g·w: gx = r·(gx̂ − mean(gx̂) − x̂·mean(gx̂·x̂)), gw = Σ g·x̂, gbias = Σ g.
 */
export function layerNorm(b: GraphBuilder, x: Var, w: Var, bias: Var, eps: number): Var {
  const D = x.shape[x.rank - 1];
  for (const p of [w, bias])
    if (p.rank !== 1 || !dimEq(p.shape[0], D))
      throw new GraphError(
        `layerNorm: ${p.name} ${fmtShape(p.shape)} does not match last dim of ${x.name} ${fmtShape(x.shape)}`,
      );
  const { y, xhat, r } = b.scope('layernorm', () => {
    const xc = b.stopGradient(b.sub(x, b.reduceMean(x, [-1], true)));
    const r = b.stopGradient(b.reciprocal(b.sqrt(b.add(b.reduceMean(b.mul(xc, xc), [-1], true), eps))));
    const xhat = b.stopGradient(b.mul(xc, r));
    return { y: b.stopGradient(b.add(b.mul(xhat, w), bias)), xhat, r };
  });
  b.customVjp([x, w, bias], [y], ([g]) => {
    const gxh = b.mul(g!, w);
    const m1 = b.reduceMean(gxh, [-1], true);
    const m2 = b.reduceMean(b.mul(gxh, xhat), [-1], true);
    const gx = b.mul(r, b.sub(b.sub(gxh, m1), b.mul(xhat, m2)));
    return [gx, b.sumTo(b.mul(g!, xhat), w.shape), b.sumTo(g!, bias.shape)];
  });
  return y;
}

/** quick-GELU (CLIP, Qwen2-VL's ViT MLP): x·σ(1.702x); backward g·(s + 1.702·x·s·(1 − s)). */
export function quickGelu(b: GraphBuilder, x: Var): Var {
  const { y, s } = b.scope('quick_gelu', () => {
    const s = b.stopGradient(b.sigmoid(b.mul(x, 1.702)));
    return { y: b.stopGradient(b.mul(x, s)), s };
  });
  b.customVjp([x], [y], ([g]) => [b.mul(g!, b.add(s, b.mul(b.mul(x, 1.702), b.mul(s, b.sub(1, s)))))]);
  return y;
}

/** Exact GELU (torch nn.GELU()): x·Φ(x) = x·(1 + erf(x/√2))/2; backward g·(Φ(x) + x·φ(x)), φ(x) = e^(−x²/2)/√(2π). */
export function gelu(b: GraphBuilder, x: Var): Var {
  const { y, cdf } = b.scope('gelu', () => {
    const z = b.mul(x, Math.SQRT1_2);
    const erf = x.dtype === 'float64' ? erf64(b, z) : b.op('Erf', [z], {}, { dtype: x.dtype, shape: x.shape });
    const cdf = b.stopGradient(b.mul(b.add(erf, 1), 0.5));
    return { y: b.stopGradient(b.mul(x, cdf)), cdf };
  });
  b.customVjp([x], [y], ([g]) => {
    const pdf = b.mul(b.exp(b.mul(b.mul(x, x), -0.5)), 1 / Math.sqrt(2 * Math.PI));
    return [b.mul(g!, b.add(cdf, b.mul(x, pdf)))];
  });
  return y;
}

/**
 * erf in float64 graphs (ORT's CPU Erf kernel is float32 only; float64 graphs are the
 * finite-difference tests'), to ~1e-15: the Maclaurin series 2/√π·z·Σₙ (−z²)ⁿ/(n!(2n+1)), 40 terms
 * (Horner in z²), for |z| < 2; 1 − erfc(|z|) with erfc(z) = e^(−z²)/√π · 1/(z + ½/(z + 1/(z + 3⁄2/(z + …))))
 * (the Laplace continued fraction, 40 levels) for |z| ≥ 2; odd in z. Forward only.
 */
function erf64(b: GraphBuilder, z: Var): Var {
  const N = 40;
  const u = b.mul(z, z);
  let fact = 1;
  const coef: number[] = [];
  for (let n = 0; n <= N; n++) {
    if (n > 0) fact *= n;
    coef.push((n % 2 ? -1 : 1) / (fact * (2 * n + 1)));
  }
  let p = b.const(coef[N], 'float64');
  for (let n = N - 1; n >= 0; n--) p = b.add(b.mul(p, u), coef[n]);
  const series = b.mul(b.mul(z, p), 2 / Math.sqrt(Math.PI));
  const a = b.max(b.abs(z), 2); // the fraction is only used (and only well-conditioned) at |z| ≥ 2
  let t = a;
  for (let k = N; k >= 1; k--) t = b.add(a, b.div(k / 2, t));
  const tail = b.mul(b.sign(z), b.sub(1, b.div(b.mul(b.exp(b.neg(b.mul(a, a))), 1 / Math.sqrt(Math.PI)), t)));
  return b.where(b.less(b.abs(z), 2), series, tail);
}
