/**
 * Vision-language policies: Qwen2-VL's vision tower (Wang et al. 2024, arXiv 2409.12191) in the
 * ONNX engine, and how images reach the decoder.
 *
 * ## API for callers (sampling, scoring, value, training)
 * - A VLM is a ModelConfig with `vision` set (config.ts VisionConfig); its weights add the
 *   `visual.*` parameters (params.ts visionParamSpecs, Qwen2-VL's HF names).
 * - Images are `ImagePixels` (lib/data/images.ts: 8-bit RGB, row-major HWC) whose sides are
 *   multiples of patchSize × spatialMergeSize — what `prepareImage` / `decodePixels` give with
 *   `data.image_factor` = patchSize × spatialMergeSize (28 for Qwen2-VL's 14 × 2).
 * - Prompt convention (Qwen-VL): `<|vision_start|><|image_pad|><|vision_end|>` per image, in the
 *   order of the row's images. Before tokens go to a model, `expandImagePads` repeats each
 *   `<|image_pad|>` to `imageTokenCount(image)` = (h/patch)·(w/patch)/merge² pads; the model replaces
 *   the embedding of the k-th pad of a row by the k-th image token of that row's images, in order.
 *   A row whose pad count differs from its images' token count is refused (ConfigError).
 * - Every entry point takes images per row, aligned with its rows; a row without images passes
 *   `undefined` or `[]`, so one batch may mix rows with and without images:
 *     Sampler.generate: `GenerationRequest.images` (the tower runs once per distinct prompt, in the
 *       prefill; decode steps never see it);
 *     Scorer.score / ValueScorer.values: `ScoreRequest.images`;
 *     Trainer.step / evaluate / computeGradients: `TrainBatch.images` (length batchSize).
 *   A text-only model refuses images; a VLM accepts batches with no image at all.
 * - `actor.model.freeze_vision_tower` → TrainerOptions.freezeVisionTower: no gradient flows into the
 *   tower and its parameters (and their optimizer moments) are never updated.
 * - A VLM never emits its three vision tokens: they get the −1e9 logit bias of every distribution
 *   (decode-graph.ts logitBiasOf), so behaviour, old and new log-probs agree.
 *
 * ## Graph inputs (VISION_IO), built by `visionFeeds`
 *   pixel_patches [I, P, C] float: the batch's I images (padded to the longest, P patches), each
 *     patch C = 3·patch² normalised values (Qwen2-VL processor: x/255, (x − mean)/std,
 *     channel-major; one frame: see visionTower for the temporal patch), in merge-window order (the m²
 *     patches of each m×m window consecutive, windows row-major);
 *   patch_pos [I, P, 2] int64: (row, column) of each patch (2-D RoPE), or (index, 0) (1-D RoPE);
 *   patch_mask [I, P/m², m²] float: 1 = real patch, 0 = padding (masked as a key);
 *   embed_index [B·T] int64: for each flat token position n, n (keep its token embedding) or
 *     B·T + k (the k-th merged image token of the batch, k = image·P/m² + j).
 *   patch_window [I, P] float (windowed towers, Qwen2.5-VL): the attention window of each patch,
 *     (⌊mh/w⌋, ⌊mw/w⌋) numbered row-major, mh/mw its merged row/column and w = windowSize/(patch·merge);
 *     a windowed block attends only keys of the query's window (HF's window reordering and
 *     cu_window_seqlens, as a mask: attention is permutation-equivariant);
 *   mrope_delta [B, T, 3] int64 (M-RoPE decoders, Qwen2-VL / Qwen2.5-VL): each token's (t, h, w)
 *     position minus its 1-D position (mropeDeltas).
 * A batch with no images feeds one all-zero image of one merge window that no position reads.
 *
 * Decoder positions: 1-D (one position per pad, as for text), or M-RoPE when the config has
 * mropeSection (HF get_rope_index, images only: an image's merged token (i, j) sits at (s, s+i, s+j)
 * for s its first token's position, and the text after it continues at s + max(rows, cols)).
 */
import { GraphBuilder, GraphError, type Dim, type Var } from '../onnx/builder.ts';
import { gelu, layerNorm, linear, quickGelu, rmsNorm, rope, swiglu } from '../onnx/nn.ts';
import { tensor, type ort } from '../onnx/runtime.ts';
import { ConfigError } from '../errors.ts';
import type { ImagePixels } from '../data/images.ts';
import type { ModelConfig, VisionConfig } from './config.ts';
import { MASK_NEG, type ParamVars } from './llama.ts';
import { loraScale, towerLoraModules, type LoraConfig } from './lora.ts';

export type { ImagePixels };

export const VISION_IO = {
  patches: 'pixel_patches',
  patchPos: 'patch_pos',
  patchMask: 'patch_mask',
  embedIndex: 'embed_index',
  patchWindow: 'patch_window',
  mropeDelta: 'mrope_delta',
} as const;

/** Qwen2-VL image processor normalisation (OpenAI CLIP mean / std, RGB). */
export const IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073] as const;
export const IMAGE_STD = [0.26862954, 0.26130258, 0.27577711] as const;

function visionOf(c: ModelConfig, what: string): VisionConfig {
  if (!c.vision) throw new ConfigError(`${what}: the model is text-only (no vision config); it cannot take images`);
  return c.vision;
}

/** Patch grid [rows, cols] of an image; its sides must be multiples of patchSize × spatialMergeSize. */
export function patchGrid(v: VisionConfig, img: ImagePixels): [number, number] {
  const f = v.patchSize * v.spatialMergeSize;
  if (!(img.height > 0 && img.width > 0 && img.height % f === 0 && img.width % f === 0))
    throw new ConfigError(
      `image ${img.width}×${img.height}: sides must be positive multiples of patchSize × spatialMergeSize = ${f} (set data.image_factor to ${f})`,
    );
  if (img.data.length !== img.width * img.height * 3)
    throw new ConfigError(
      `image ${img.width}×${img.height}: expected ${img.width * img.height * 3} RGB bytes, got ${img.data.length}`,
    );
  return [img.height / v.patchSize, img.width / v.patchSize];
}

/** Decoder tokens of one image: merged patches (h/patch)·(w/patch)/merge². */
export function imageTokenCount(v: VisionConfig, img: ImagePixels): number {
  const [gh, gw] = patchGrid(v, img);
  return (gh * gw) / (v.spatialMergeSize * v.spatialMergeSize);
}

/**
 * One image as patches (Qwen2-VL processor, one frame): P = gh·gw rows of C = 3·patch² values,
 * value (x/255 − mean_c)/std_c at index (c·patch + y)·patch + x, rows in merge-window
 * order; `pos` [P, 2] the (row, column) of each patch (2-D RoPE) or (index, 0) (1-D).
 */
export function patchify(v: VisionConfig, img: ImagePixels): { patches: Float32Array; pos: Int32Array; count: number } {
  const key = `${v.patchSize}:${v.spatialMergeSize}:${v.rope}`;
  const hit = patchCache.get(img);
  if (hit && hit.key === key) return hit.value;
  const [gh, gw] = patchGrid(v, img);
  const ps = v.patchSize,
    m = v.spatialMergeSize,
    W = img.width,
    px = img.data;
  const C = 3 * ps * ps,
    P = gh * gw;
  const patches = new Float32Array(P * C),
    pos = new Int32Array(P * 2);
  // (x/255 − mean_c)/std_c as x·scale_c + offset_c
  const scale = IMAGE_STD.map((sd) => 1 / (255 * sd)),
    offset = IMAGE_MEAN.map((mu, c) => -mu / IMAGE_STD[c]);
  let r = 0,
    o = 0;
  for (let bh = 0; bh < gh / m; bh++)
    for (let bw = 0; bw < gw / m; bw++)
      for (let ih = 0; ih < m; ih++)
        for (let iw = 0; iw < m; iw++) {
          const ph = bh * m + ih,
            pw = bw * m + iw;
          if (v.rope === '2d') {
            pos[2 * r] = ph;
            pos[2 * r + 1] = pw;
          } else pos[2 * r] = r; // 1-D: the patch index (merge-window order)
          for (let c = 0; c < 3; c++) {
            const sc = scale[c],
              of = offset[c];
            for (let y = 0; y < ps; y++) {
              let q = ((ph * ps + y) * W + pw * ps) * 3 + c;
              for (let x = 0; x < ps; x++, q += 3) patches[o++] = px[q] * sc + of;
            }
          }
          r++;
        }
  const value = { patches, pos, count: P };
  patchCache.set(img, { key, value });
  return value;
}

/** Patches by image object: an image is scored several times (samples, old / reference log-probs, updates). */
const patchCache = new WeakMap<
  ImagePixels,
  { key: string; value: { patches: Float32Array; pos: Int32Array; count: number } }
>();

/**
 * Prompt ids with each `<|image_pad|>` repeated to its image's token count (Qwen2-VL's processor
 * does this to the rendered text). The prompt must hold exactly one pad per image.
 */
export function expandImagePads(c: ModelConfig, ids: ArrayLike<number>, images: readonly ImagePixels[]): number[] {
  const v = visionOf(c, 'expandImagePads');
  const out: number[] = [];
  let k = 0;
  for (let i = 0; i < ids.length; i++) {
    if (ids[i] !== v.imageTokenId) {
      out.push(ids[i]);
      continue;
    }
    if (k >= images.length)
      throw new ConfigError(
        `expandImagePads: the prompt has more <|image_pad|> tokens (id ${v.imageTokenId}) than images (${images.length})`,
      );
    const n = imageTokenCount(v, images[k++]);
    for (let j = 0; j < n; j++) out.push(v.imageTokenId);
  }
  if (k !== images.length)
    throw new ConfigError(
      `expandImagePads: ${images.length} images but ${k} <|image_pad|> tokens (id ${v.imageTokenId}) in the prompt; put <|vision_start|><|image_pad|><|vision_end|> once per image`,
    );
  return out;
}

/** Per-row images of a batch: undefined or [] = none. */
export type RowImages = readonly (readonly ImagePixels[] | undefined | null)[];

/**
 * The vision inputs of a batch whose token ids are `ids` [B·T] (row-major, any integer array):
 * see the file comment. The k-th `<|image_pad|>` of row b takes the k-th token of row b's images.
 */
export function visionFeeds(
  c: ModelConfig,
  ids: ArrayLike<number | bigint>,
  B: number,
  T: number,
  images: RowImages | undefined,
  what = 'batch',
): Record<string, ort.Tensor> {
  const v = visionOf(c, what);
  if (images && images.length !== B)
    throw new ConfigError(`${what}: images has ${images.length} rows, expected one entry per row (${B})`);
  const m2 = v.spatialMergeSize * v.spatialMergeSize;
  const all: { patches: Float32Array; pos: Int32Array; count: number }[] = [];
  const rowStart: number[] = [];
  for (let b = 0; b < B; b++) {
    rowStart.push(all.length);
    for (const img of images?.[b] ?? []) all.push(patchify(v, img));
  }
  rowStart.push(all.length);
  const dummy = all.length === 0;
  const C = 3 * v.patchSize * v.patchSize;
  const I = dummy ? 1 : all.length;
  const P = dummy ? m2 : Math.max(...all.map((a) => a.count));
  const patches = new Float32Array(I * P * C),
    pos = new BigInt64Array(I * P * 2),
    mask = new Float32Array(I * P);
  if (dummy) mask.fill(1);
  all.forEach((a, i) => {
    patches.set(a.patches, i * P * C);
    for (let j = 0; j < a.count * 2; j++) pos[i * P * 2 + j] = BigInt(a.pos[j]);
    mask.fill(1, i * P, i * P + a.count);
  });
  const N = B * T,
    Pm = P / m2;
  const index = new BigInt64Array(N);
  for (let b = 0; b < B; b++) {
    let img = rowStart[b],
      j = 0;
    const tokensOf = (i: number) => all[i].count / m2;
    let seen = 0;
    const expected = all.slice(rowStart[b], rowStart[b + 1]).reduce((s, a) => s + a.count / m2, 0);
    for (let t = 0; t < T; t++) {
      const n = b * T + t;
      if (Number(ids[n]) !== v.imageTokenId) {
        index[n] = BigInt(n);
        continue;
      }
      if (seen >= expected)
        throw new ConfigError(
          `${what}: row ${b} has more <|image_pad|> tokens than its ${rowStart[b + 1] - rowStart[b]} image(s) give (${expected}); expand each placeholder with expandImagePads`,
        );
      while (j >= tokensOf(img)) {
        img++;
        j = 0;
      }
      index[n] = BigInt(N + img * Pm + j);
      j++;
      seen++;
    }
    if (seen !== expected)
      throw new ConfigError(
        `${what}: row ${b} has ${seen} <|image_pad|> tokens but its ${rowStart[b + 1] - rowStart[b]} image(s) give ${expected}; expand each placeholder with expandImagePads`,
      );
  }
  const out: Record<string, ort.Tensor> = {
    [VISION_IO.patches]: tensor('float32', patches, [I, P, C]),
    [VISION_IO.patchPos]: tensor('int64', pos, [I, P, 2]),
    [VISION_IO.patchMask]: tensor('float32', mask, [I, Pm, m2]),
    [VISION_IO.embedIndex]: tensor('int64', index, [N]),
  };
  if (hasWindows(v)) {
    const win = new Float32Array(I * P).fill(-1);
    all.forEach((a, i) => {
      const ws = v.windowSize! / (v.patchSize * v.spatialMergeSize);
      const mgw = (a.count === 0 ? 0 : Math.max(...Array.from({ length: a.count }, (_, r) => a.pos[2 * r + 1]))) + 1;
      const nw = Math.ceil(mgw / v.spatialMergeSize / ws);
      for (let r = 0; r < a.count; r++) {
        const mh = Math.floor(a.pos[2 * r] / v.spatialMergeSize),
          mw = Math.floor(a.pos[2 * r + 1] / v.spatialMergeSize);
        win[i * P + r] = Math.floor(mh / ws) * nw + Math.floor(mw / ws);
      }
    });
    out[VISION_IO.patchWindow] = tensor('float32', win, [I, P]);
  }
  if (c.mropeSection) {
    const grids: [number, number][] = [];
    for (let b = 0; b < B; b++)
      for (const img of images?.[b] ?? []) {
        const [gh, gw] = patchGrid(v, img);
        grids.push([gh / v.spatialMergeSize, gw / v.spatialMergeSize]);
      }
    out[VISION_IO.mropeDelta] = tensor('int64', mropeDeltas(v.imageTokenId, ids, B, T, rowStart, grids), [B, T, 3]);
  }
  return out;
}

/** Whether some block of the tower attends within windows (Qwen2.5-VL). */
export function hasWindows(v: VisionConfig): boolean {
  return v.windowSize !== null && v.fullattBlockIndexes.length < v.depth;
}

/**
 * M-RoPE position offsets [B·T·3] (HF Qwen2-VL get_rope_index, images): the (t, h, w) position of
 * each token minus its 1-D position (its index among the row's tokens). Row b's image pads take
 * its images in order (images rowStart[b] …, merged grid `grids[k]` = [rows, cols]): the j-th pad of
 * an image adds (−j, ⌊j/cols⌋ − j, j mod cols − j) to the running offset, and after the image the
 * offset grows by max(rows, cols) − rows·cols. Every other token gets the running offset thrice.
 */
export function mropeDeltas(
  imageTokenId: number,
  ids: ArrayLike<number | bigint>,
  B: number,
  T: number,
  rowStart: readonly number[],
  grids: readonly (readonly [number, number])[],
): BigInt64Array {
  const out = new BigInt64Array(B * T * 3);
  for (let b = 0; b < B; b++) {
    let acc = 0,
      img = rowStart[b],
      j = 0;
    for (let t = 0; t < T; t++) {
      const o = (b * T + t) * 3;
      if (Number(ids[b * T + t]) !== imageTokenId || img >= grids.length) {
        out[o] = out[o + 1] = out[o + 2] = BigInt(acc);
        continue;
      }
      const [gh, gw] = grids[img];
      out[o] = BigInt(acc - j);
      out[o + 1] = BigInt(acc + Math.floor(j / gw) - j);
      out[o + 2] = BigInt(acc + (j % gw) - j);
      if (++j === gh * gw) {
        acc += Math.max(gh, gw) - gh * gw;
        img++;
        j = 0;
      }
    }
  }
  return out;
}

/** The M-RoPE offsets input [B, T, 3] of a graph whose ids are [B, T] (null for a 1-D RoPE decoder). */
export function mropeDeltaInput(b: GraphBuilder, c: ModelConfig, ids: Var): Var | null {
  if (!c.mropeSection) return null;
  return b.input(VISION_IO.mropeDelta, 'int64', [ids.shape[0], ids.shape[1], 3]);
}

/** Whether a batch's rows carry any image (a text-only model takes none). */
export function hasImages(images: RowImages | undefined): boolean {
  return !!images && images.some((r) => !!r && r.length > 0);
}

function param(p: ParamVars, name: string): Var {
  const v = p.get(name);
  if (!v) throw new GraphError(`vision: missing parameter ${name}`);
  return v;
}

/**
 * Rotary cos/sin [I, P, 1, hd] of the ViT from patch positions [I, P, 2] (Qwen2-VL
 * VisionRotaryEmbedding): 2d: f_i = θ^(−2i/(hd/2)), i < hd/4, angles (row·f, col·f) concatenated
 * [hd/2]; 1d: f_i = θ^(−2i/hd), i < hd/2, angles index·f. Both halves repeated (rotate_half layout).
 */
function visionRope(b: GraphBuilder, v: VisionConfig, pos: Var): { cos: Var; sin: Var } {
  const hd = v.hiddenSize / v.numHeads;
  const nf = v.rope === '2d' ? hd / 4 : hd / 2;
  const dim = v.rope === '2d' ? hd / 2 : hd;
  const inv = Array.from({ length: nf }, (_, i) => Math.fround(1 / Math.fround(Math.pow(v.ropeTheta, (2 * i) / dim))));
  const invV = b.initializer(
    'vision_rope.inv_freq',
    b.float === 'float64' ? Float64Array.from(inv) : Float32Array.from(inv),
    [nf],
    b.float,
  );
  const posF = b.cast(pos, b.float); // [I, P, 2]
  const ang = (col: number) => b.mul(b.slice(posF, 2, col, col + 1), invV); // [I, P, nf]
  const half = v.rope === '2d' ? b.concat([ang(0), ang(1)], -1) : ang(0); // [I, P, hd/2]
  const emb = b.unsqueeze(b.concat([half, half], -1), [2]); // [I, P, 1, hd]
  return {
    cos: b.op('Cos', [emb], {}, { dtype: b.float, shape: emb.shape }),
    sin: b.op('Sin', [emb], {}, { dtype: b.float, shape: emb.shape }),
  };
}

/**
 * The vision tower on the batch's patches: declares the pixel_patches / patch_pos / patch_mask
 * inputs and returns the merged image tokens [I·P/m², D] in the decoder's embedding space.
 *   x = patches · (Σ_t W_pe[:, :, t])ᵀ                    [I·P, E]   (Conv3d, stride = kernel, on a repeated frame)
 *   depth × { x += proj(attn(rope(N₁(x)))) ; x += mlp(N₂(x)) }  (bidirectional, per image or per
 *     window (windowed blocks), padded patches masked as keys; attention softmax(q·kᵀ/√hd) per head;
 *     N LayerNorm or RMSNorm, mlp fc2(quick_gelu(fc1 h)) or down(silu(gate h)·up h))
 *   tokens = mlp.2(GELU(mlp.0(reshape(LN_q(x), [I·P/m², m²E]))))           [I·P/m², D]
 */
export function visionTower(
  b: GraphBuilder,
  c: ModelConfig,
  p: ParamVars,
  opts: { checkpoint?: boolean; lora?: { config: LoraConfig; p: ParamVars } } = {},
): Var {
  const v = visionOf(c, 'visionTower');
  // LoRA on the blocks' linear layers (lora.ts): y + s·(h·Aᵀ)·Bᵀ, A [r, in], B [out, r]
  const loraMods: readonly string[] = opts.lora ? towerLoraModules(c, opts.lora.config) : [];
  const loraS = opts.lora ? loraScale(opts.lora.config) : 0;
  const adapt = (y: Var, h: Var, module: string, path: string, W: (name: string) => Var): Var =>
    loraMods.includes(module)
      ? b.scope(`lora.${module}`, () =>
          b.add(
            y,
            b.gemm(linear(b, h, W(`${path}.lora_A.weight`)), W(`${path}.lora_B.weight`), {
              transB: true,
              alpha: loraS,
            }),
          ),
        )
      : y;
  const lin = (h: Var, path: string, module: string, W: (name: string) => Var): Var =>
    adapt(linear(b, h, W(`${path}.weight`), W(`${path}.bias`)), h, module, path, W);
  const E = v.hiddenSize,
    H = v.numHeads,
    hd = E / H,
    ps = v.patchSize;
  const C = 3 * ps * ps,
    m2 = v.spatialMergeSize * v.spatialMergeSize,
    tp = v.temporalPatchSize;
  // P = m²·Pm patches per image (Pm merged tokens), so the merge reshape checks statically
  const P: Dim = m2 === 1 ? 'Pm' : `${m2}*Pm`;
  const patches = b.input(VISION_IO.patches, b.float, ['I', P, C]);
  const pos = b.input(VISION_IO.patchPos, 'int64', ['I', P, 2]);
  const pmask = b.reshape(b.input(VISION_IO.patchMask, b.float, ['I', 'Pm', m2]), ['I', P]);
  return b.scope('visual', () => {
    const NP: Dim = `I*${P}`;
    const { cos, sin } = b.scope('rope', () => visionRope(b, v, pos));
    // key bias [I, 1, 1, P]: 0 for real patches, −1e9 for padding
    const bias = b.unsqueeze(b.mul(b.sub(1, pmask), MASK_NEG), [1, 2]);
    // windowed blocks (Qwen2.5-VL): also −1e9 between patches of different windows, [I, 1, P, P]
    const windowBias = hasWindows(v)
      ? b.scope('window_mask', () => {
          const win = b.input(VISION_IO.patchWindow, b.float, ['I', P]);
          const same = b.equal(b.unsqueeze(win, [2]), b.unsqueeze(win, [1])); // [I, P, P]
          return b.add(b.unsqueeze(b.where(same, b.const(0), b.const(MASK_NEG)), [1]), bias);
        })
      : null;
    const norm = (x0: Var, W: (name: string) => Var, name: string): Var =>
      v.norm === 'rmsnorm'
        ? rmsNorm(b, x0, W(`${name}.weight`), v.layerNormEps)
        : layerNorm(b, x0, W(`${name}.weight`), W(`${name}.bias`), v.layerNormEps);
    // an image is its frame repeated over the temporal patch (Qwen2-VL's processor), so the Conv3d
    // over [3, tp, ps, ps] equals the one-frame conv with the kernel summed over t: half the work
    // for tp = 2, and the gradient reaches every t slice (ReduceSum's backward)
    let x = b.scope('patch_embed', () => {
      const w5 = param(p, 'visual.patch_embed.proj.weight'); // [E, 3, tp, ps, ps]
      const w = tp === 1 ? b.reshape(w5, [E, C]) : b.reshape(b.reduceSum(w5, [2]), [E, C]);
      return linear(b, b.reshape(patches, [NP, C]), w);
    });
    const scale = 1 / Math.sqrt(hd);
    for (let l = 0; l < v.depth; l++) {
      const pre = `visual.blocks.${l}`;
      /** One ViT block x0 → x0 + attn → + mlp, weights through W. */
      const blockBias = windowBias && !v.fullattBlockIndexes.includes(l) ? windowBias : bias;
      const block = (x0: Var, W: (name: string) => Var): Var => {
        const att = b.scope('attn', () => {
          const h = norm(x0, W, `${pre}.norm1`);
          const [q0, k0, v0] = b.split(lin(h, `${pre}.attn.qkv`, 'qkv', W), 1, [E, E, E]);
          const q = b.mul(rope(b, b.reshape(q0, ['I', P, H, hd]), cos, sin), scale);
          const k = rope(b, b.reshape(k0, ['I', P, H, hd]), cos, sin);
          const q4 = b.transpose(q, [0, 2, 1, 3]),
            k4 = b.transpose(k, [0, 2, 1, 3]); // [I, H, P, hd]
          const v4 = b.transpose(b.reshape(v0, ['I', P, H, hd]), [0, 2, 1, 3]);
          const probs = b.softmax(b.add(b.matmul(q4, b.transposeLast2(k4)), blockBias), -1); // [I, H, P, P]
          const ctx = b.transpose(b.matmul(probs, v4), [0, 2, 1, 3]); // [I, P, H, hd]
          return lin(b.reshape(ctx, [NP, E]), `${pre}.attn.proj`, 'proj', W);
        });
        const x1 = b.add(x0, att);
        const mlp = b.scope('mlp', () => {
          const h = norm(x1, W, `${pre}.norm2`);
          if (v.mlp === 'silu_glu') {
            const F = v.intermediateSize;
            const [g, u] = b.split(
              linear(
                b,
                h,
                b.concat([W(`${pre}.mlp.gate_proj.weight`), W(`${pre}.mlp.up_proj.weight`)], 0),
                b.concat([W(`${pre}.mlp.gate_proj.bias`), W(`${pre}.mlp.up_proj.bias`)], 0),
              ),
              1,
              [F, F],
            );
            const act = swiglu(
              b,
              adapt(g, h, 'gate_proj', `${pre}.mlp.gate_proj`, W),
              adapt(u, h, 'up_proj', `${pre}.mlp.up_proj`, W),
            );
            return lin(act, `${pre}.mlp.down_proj`, 'down_proj', W);
          }
          return lin(quickGelu(b, lin(h, `${pre}.mlp.fc1`, 'fc1', W)), `${pre}.mlp.fc2`, 'fc2', W);
        });
        return b.add(x1, mlp);
      };
      b.scope(`blocks.${l}`, () => {
        const lp = opts.lora?.p;
        const all = lp ? new Map<string, Var>([...p, ...lp]) : p;
        if (!opts.checkpoint) {
          x = block(x, (n) => param(all, n));
          return;
        }
        // gradient checkpointing (builder.ts checkpoint): the block's input and weights (base and adapters) are kept, the rest recomputed
        const names = [...all.keys()].filter((k) => k.startsWith(`${pre}.`));
        x = b.checkpoint([x, ...names.map((n) => param(all, n))], ([x0, ...ws]) => {
          const byName = new Map(names.map((n, i) => [n, ws[i]]));
          return [block(x0, (n) => byName.get(n) ?? param(all, n))];
        })[0];
      });
    }
    return b.scope('merger', () => {
      const h = b.reshape(
        norm(x, (n) => param(p, n), 'visual.merger.ln_q'),
        ['I*Pm', m2 * E],
      );
      const h1 = gelu(b, linear(b, h, param(p, 'visual.merger.mlp.0.weight'), param(p, 'visual.merger.mlp.0.bias')));
      return linear(b, h1, param(p, 'visual.merger.mlp.2.weight'), param(p, 'visual.merger.mlp.2.bias')); // [I·P/m², D]
    });
  });
}

/**
 * The decoder's input embeddings with image tokens placed (see the file comment): declares
 * `embed_index` [B·T] and the tower's inputs; `tokens` [N, D] are the token embeddings of ids [B, T].
 * With `freeze`, no gradient flows into the tower (unless `lora` adapts its blocks: then only to the
 * adapters); with `checkpoint`, each ViT block recomputes its forward in the backward (gradient checkpointing).
 */
export function placeImageTokens(
  b: GraphBuilder,
  c: ModelConfig,
  p: ParamVars,
  tokens: Var,
  N: Dim,
  opts: { freeze?: boolean; checkpoint?: boolean; lora?: { config: LoraConfig; p: ParamVars } } = {},
): Var {
  const index = b.input(VISION_IO.embedIndex, 'int64', [N]);
  // LoRA on the tower: its base is frozen (no gradient asked for it) but the adapters are trained
  const towerLora = !!opts.lora && towerLoraModules(c, opts.lora.config).length > 0;
  let img = visionTower(b, c, p, {
    checkpoint: !!opts.checkpoint && (!opts.freeze || towerLora),
    ...(towerLora ? { lora: opts.lora } : {}),
  });
  if (opts.freeze && !towerLora) img = b.stopGradient(img);
  return b.scope('place_images', () => b.gather(b.concat([tokens, img], 0), index)); // [N, D]
}
