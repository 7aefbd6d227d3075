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
  if (w.rank !== 1 || !dimEq(w.shape[0], D)) throw new GraphError(`rmsNorm: weight ${w.name} ${fmtShape(w.shape)} does not match last dim of ${x.name} ${fmtShape(x.shape)}`);
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
  if (typeof hd !== 'number' || hd % 2 !== 0) throw new GraphError(`rope: head dim of ${x.name} ${fmtShape(x.shape)} must be a static even number`);
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
export function tokenLogprobEntropy(b: GraphBuilder, logits: Var, targets: Var, opts: { entropy?: boolean } = {}): { logprob: Var; entropy: Var | null } {
  if (logits.rank !== 2 || targets.rank !== 1 || !dimEq(logits.shape[0], targets.shape[0]))
    throw new GraphError(`tokenLogprobEntropy: need logits [N, V] and targets [N], got ${fmtShape(logits.shape)} and ${fmtShape(targets.shape)}`);
  if (targets.dtype !== 'int64') throw new GraphError(`tokenLogprobEntropy: targets ${targets.name} must be int64`);
  const wantEnt = opts.entropy ?? true;
  const N = logits.shape[0], V = logits.shape[1];
  const { logprob, entropy, lsm, p, tcol } = b.scope('logprob', () => {
    const lsm = b.stopGradient(b.logSoftmax(logits, -1));
    const tcol = b.unsqueeze(targets, [1]);
    const logprob = b.stopGradient(b.squeeze(b.gatherElements(lsm, tcol, 1), [1]));
    let entropy: Var | null = null, p: Var | null = null;
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
  if (table.rank !== 2) throw new GraphError(`embedding: table ${table.name} must be [V, D], got ${fmtShape(table.shape)}`);
  const V = table.shape[0], D = table.shape[1];
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
