/**
 * A small DiT velocity predictor for flow-matching image policies (Peebles & Xie 2023, "Scalable
 * Diffusion Models with Transformers", arXiv 2212.09748: patchify, transformer blocks with adaLN-Zero
 * conditioning, unpatchify), conditioned on the timestep and a prompt class (a closed vocabulary;
 * class `numClasses` is the null prompt used by classifier-free guidance).
 *
 * Shapes: x [B, C, S, S] (pixels in [−1, 1]), t [B] ∈ [0, 1] (t = 1 noise, t = 0 data), cls [B]
 * int64; G = S/p patches per side, N = G², D hidden, P = C·p·p.
 *  patches [B·N, P] (patch order row-major (gy, gx), inside a patch (c, py, px))
 *  h = patches·W_xᵀ + b_x + pos [N, D]
 *  c = MLP(sinusoid(1000·t)) + E_cls[cls]                                       [B, D]
 *  per block: (shift₁, scale₁, gate₁, shift₂, scale₂, gate₂) = silu(c)·W_adaᵀ + b   [B, 6D]
 *    h += gate₁ · Attn(LN(h)·(1 + scale₁) + shift₁);  h += gate₂ · MLP(LN(h)·(1 + scale₂) + shift₂)
 *  out = (LN(h)·(1 + scale) + shift)·W_oᵀ + b_o → unpatchify → v [B, C, S, S]
 * LN has no affine (eps 1e-6); MLP = fc2(GELU(fc1)), exact GELU. Weights in torch Linear layout.
 */
import { GraphBuilder, GraphError, type Dim, type Var, dimMul } from '../onnx/builder.ts';
import { gelu, layerNorm, linear, silu, embedding } from '../onnx/nn.ts';
import { Rng } from '../util/rng.ts';

export interface DitConfig {
  /** Image side S (square images). */
  imageSize: number;
  /** Channels C (1 = grey). */
  channels: number;
  /** Patch side p (S % p = 0). */
  patchSize: number;
  /** Hidden size D. */
  hidden: number;
  /** Transformer blocks. */
  depth: number;
  /** Attention heads (D % heads = 0). */
  heads: number;
  /** MLP hidden size = mlpRatio·D. */
  mlpRatio: number;
  /** Prompt classes K; the class table has K + 1 rows (row K = the null prompt). */
  numClasses: number;
  /** Sinusoidal timestep features F (even). */
  timeFreqs: number;
}

export function ditConfig(c: Partial<DitConfig> & Pick<DitConfig, 'numClasses'>): DitConfig {
  const cfg: DitConfig = {
    imageSize: 32,
    channels: 1,
    patchSize: 4,
    hidden: 64,
    depth: 2,
    heads: 4,
    mlpRatio: 2,
    timeFreqs: 32,
    ...c,
  };
  const bad = (m: string) => {
    throw new GraphError(`dit config: ${m}`);
  };
  if (cfg.imageSize % cfg.patchSize !== 0)
    bad(`imageSize ${cfg.imageSize} must be a multiple of patchSize ${cfg.patchSize}`);
  if (cfg.hidden % cfg.heads !== 0) bad(`hidden ${cfg.hidden} must be a multiple of heads ${cfg.heads}`);
  if (cfg.timeFreqs % 2 !== 0) bad(`timeFreqs ${cfg.timeFreqs} must be even`);
  if (!(cfg.numClasses >= 1)) bad(`numClasses must be ≥ 1, got ${cfg.numClasses}`);
  return cfg;
}

export interface ParamSpec {
  name: string;
  shape: number[];
}

/** Every parameter, in a fixed order (the packed layout of the trainer). */
export function ditParamSpecs(c: DitConfig): ParamSpec[] {
  const D = c.hidden,
    P = c.channels * c.patchSize * c.patchSize,
    N = (c.imageSize / c.patchSize) ** 2,
    M = c.mlpRatio * D;
  const lin = (name: string, out: number, inp: number): ParamSpec[] => [
    { name: `${name}.weight`, shape: [out, inp] },
    { name: `${name}.bias`, shape: [out] },
  ];
  const specs: ParamSpec[] = [
    ...lin('x_embed', D, P),
    { name: 'pos_embed', shape: [N, D] },
    ...lin('t_embed.0', D, c.timeFreqs),
    ...lin('t_embed.2', D, D),
    { name: 'class_embed.weight', shape: [c.numClasses + 1, D] },
  ];
  for (let i = 0; i < c.depth; i++)
    specs.push(
      ...lin(`blocks.${i}.ada`, 6 * D, D),
      ...lin(`blocks.${i}.qkv`, 3 * D, D),
      ...lin(`blocks.${i}.proj`, D, D),
      ...lin(`blocks.${i}.fc1`, M, D),
      ...lin(`blocks.${i}.fc2`, D, M),
    );
  specs.push(...lin('final.ada', 2 * D, D), ...lin('final.linear', P, D));
  return specs;
}

export type DitWeights = Map<string, Float32Array>;

/**
 * Initial weights: Linear weights uniform ±1/√in (torch's default bound), biases 0, embeddings
 * N(0, 0.02²)-ish (uniform of the same std). adaLN-Zero: `zeroInit` zeroes the modulation and
 * output layers (the paper's init; the model starts as v = 0). Deterministic in `seed`.
 */
export function initDitWeights(c: DitConfig, seed: number | string, opts: { zeroInit?: boolean } = {}): DitWeights {
  const rng = Rng.fromSeed(seed);
  const w: DitWeights = new Map();
  const zero = opts.zeroInit ?? true;
  for (const s of ditParamSpecs(c)) {
    const n = s.shape.reduce((a, b) => a * b, 1);
    const a = new Float32Array(n);
    const isZero = zero && /(\.ada\.|final\.linear)/.test(s.name);
    let bound = 0;
    if (s.name.endsWith('.weight') && s.shape.length === 2 && !s.name.startsWith('class_embed'))
      bound = 1 / Math.sqrt(s.shape[1]);
    else if (s.name === 'pos_embed' || s.name.startsWith('class_embed')) bound = 0.02 * Math.sqrt(3);
    else if (!zero && s.name.endsWith('.bias')) bound = 0.1;
    if (!isZero && bound > 0) for (let i = 0; i < n; i++) a[i] = (rng.next() * 2 - 1) * bound;
    w.set(s.name, a);
  }
  return w;
}

export type DitParamVars = Map<string, Var>;

export function declareDitParams(b: GraphBuilder, c: DitConfig): DitParamVars {
  const p: DitParamVars = new Map();
  for (const s of ditParamSpecs(c)) p.set(s.name, b.input(s.name, b.float, s.shape));
  return p;
}

/** Sinusoidal features of 1000·t: [cos(1000·t·f_k), sin(1000·t·f_k)], f_k = 10000^(−k/(F/2)), t [B] → [B, F]. */
export function timestepFeatures(b: GraphBuilder, t: Var, F: number): Var {
  const half = F / 2;
  const freqs = Array.from({ length: half }, (_, k) => 1000 * Math.exp((-Math.log(10000) * k) / half));
  const args = b.mul(b.unsqueeze(t, [1]), b.const(freqs)); // [B, F/2]
  return b.concat(
    [
      b.op('Cos', [args], {}, { dtype: b.float, shape: args.shape }),
      b.op('Sin', [args], {}, { dtype: b.float, shape: args.shape }),
    ],
    1,
  );
}

/**
 * v_θ(x, t, cls): x [B, C, S, S], t [B] (no gradient to t), cls [B] int64 → [B, C, S, S].
 * `loraScale`: a linear layer `n` whose `n.lora_A.weight` [r, in] and `n.lora_B.weight` [out, r]
 * are in `p` adds s·(h·Aᵀ)·Bᵀ to h·Wᵀ + b (LoRA, lib/image/lora.ts).
 */
export function ditForward(
  b: GraphBuilder,
  c: DitConfig,
  p: DitParamVars,
  x: Var,
  t: Var,
  cls: Var,
  opts: { checkpoint?: boolean; loraScale?: number } = {},
): Var {
  const B = x.shape[0];
  const { patchSize: ps, channels: C, imageSize: S, hidden: D, heads: H } = c;
  const G = S / ps,
    N = G * G,
    P = C * ps * ps,
    hd = D / H;
  const BN: Dim = dimMul(B, N);
  const W = (n: string): Var => {
    const v = p.get(n);
    if (!v) throw new GraphError(`dit: parameter ${n} not declared`);
    return v;
  };
  const linOf =
    (get: (n: string) => Var | undefined) =>
    (h: Var, n: string): Var => {
      const y = linear(b, h, get(`${n}.weight`)!, get(`${n}.bias`)!);
      const A = get(`${n}.lora_A.weight`),
        Bw = get(`${n}.lora_B.weight`);
      if (!A || !Bw) return y;
      // [N, in]·Aᵀ [in, r] → [N, r]; ·Bᵀ [r, out] → [N, out], times s = alpha / r
      return b.add(y, b.mul(b.matmul(b.matmul(h, b.transposeLast2(A)), b.transposeLast2(Bw)), opts.loraScale ?? 1));
    };
  const lin = linOf((n) => p.get(n) ?? (n.includes('.lora_') ? undefined : W(n)));
  const ones = b.const(Array(D).fill(1));
  const zeros = b.const(Array(D).fill(0));
  const ln = (h: Var) => layerNorm(b, h, ones, zeros, 1e-6);
  const modulate = (h: Var, shift: Var, scale: Var) =>
    b.add(b.mul(ln(h), b.add(b.unsqueeze(scale, [1]), 1)), b.unsqueeze(shift, [1]));

  const patches = b.scope('patchify', () =>
    b.reshape(b.transpose(b.reshape(x, [B, C, G, ps, G, ps]), [0, 2, 4, 1, 3, 5]), [BN, P]),
  );
  let h = b.add(b.reshape(lin(patches, 'x_embed'), [B, N, D]), W('pos_embed'));
  const cond = b.scope('cond', () => {
    const tf = timestepFeatures(b, b.stopGradient(t), c.timeFreqs);
    const temb = lin(silu(b, lin(tf, 't_embed.0')), 't_embed.2');
    return b.add(temb, embedding(b, W('class_embed.weight'), cls));
  });
  const sc = silu(b, cond); // [B, D]
  const block = (i: number, hIn: Var, scIn: Var, Wb: (n: string) => Var | undefined): Var =>
    b.scope(`blocks.${i}`, () => {
      const lin = linOf(Wb);
      const mods = b.split(lin(scIn, `blocks.${i}.ada`), 1, [D, D, D, D, D, D]);
      const [sh1, sc1, g1, sh2, sc2, g2] = mods;
      const a = b.scope('attn', () => {
        const hn = b.reshape(modulate(hIn, sh1, sc1), [BN, D]);
        const qkv = b.transpose(b.reshape(lin(hn, `blocks.${i}.qkv`), [B, N, 3, H, hd]), [2, 0, 3, 1, 4]); // [3, B, H, N, hd]
        const [q, k, v] = b.split(qkv, 0, [1, 1, 1]).map((z) => b.squeeze(z, [0]));
        const att = b.softmax(b.mul(b.matmul(q, b.transposeLast2(k)), 1 / Math.sqrt(hd)), -1); // [B, H, N, N]
        const o = b.reshape(b.transpose(b.matmul(att, v), [0, 2, 1, 3]), [BN, D]);
        return b.reshape(lin(o, `blocks.${i}.proj`), [B, N, D]);
      });
      const h1 = b.add(hIn, b.mul(b.unsqueeze(g1, [1]), a));
      const m = b.scope('mlp', () => {
        const hn = b.reshape(modulate(h1, sh2, sc2), [BN, D]);
        return b.reshape(lin(gelu(b, lin(hn, `blocks.${i}.fc1`)), `blocks.${i}.fc2`), [B, N, D]);
      });
      return b.add(h1, b.mul(b.unsqueeze(g2, [1]), m));
    });
  for (let i = 0; i < c.depth; i++) {
    if (opts.checkpoint) {
      // gradient checkpointing: the block keeps only its input, the conditioning and its weights
      // (and adapters) for the backward and recomputes the rest there (GraphBuilder.checkpoint)
      const names = [...p.keys()].filter((n) => n.startsWith(`blocks.${i}.`));
      const ws = names.map(W);
      h = b.checkpoint([h, sc, ...ws], ([hh, ss, ...wv]) => {
        const m = new Map(names.map((n, k) => [n, wv[k]]));
        return [block(i, hh, ss, (n) => m.get(n))];
      })[0];
    } else h = block(i, h, sc, (n) => p.get(n));
  }
  return b.scope('final', () => {
    const [shift, scale] = b.split(lin(sc, 'final.ada'), 1, [D, D]);
    const out = lin(b.reshape(modulate(h, shift, scale), [BN, D]), 'final.linear'); // [B·N, P]
    return b.reshape(b.transpose(b.reshape(out, [B, G, G, C, ps, ps]), [0, 3, 1, 4, 2, 5]), [B, C, S, S]);
  });
}

/** The velocity graph: inputs x, t, cls and the parameters; output `velocity`. */
export function buildVelocityGraph(c: DitConfig): Uint8Array {
  const b = new GraphBuilder({ name: 'dit_velocity', float: 'float32' });
  const S = c.imageSize;
  const x = b.input('x', 'float32', ['B', c.channels, S, S]);
  const t = b.input('t', 'float32', ['B']);
  const cls = b.input('cls', 'int64', ['B']);
  const p = declareDitParams(b, c);
  b.output(ditForward(b, c, p, x, t, cls), 'velocity');
  return b.toBytes();
}
