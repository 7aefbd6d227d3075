/**
 * Generated images as PNG bytes (the form they travel, are stored by hash and are scored in):
 * floats in [−1, 1], [C, S, S] channel-major (C = 1 grey or 3 RGB) → 8-bit PNG, and a grid of
 * several images for reports. Encoding by sharp (libvips/libpng), deterministic for equal pixels.
 */
import sharp from 'sharp';

function toBytes(x: Float32Array, C: number, S: number): Buffer {
  const out = Buffer.alloc(S * S * C);
  for (let c = 0; c < C; c++)
    for (let i = 0; i < S * S; i++)
      out[i * C + c] = Math.round((Math.max(-1, Math.min(1, x[c * S * S + i])) + 1) * 127.5);
  return out;
}

/** One image [C, S, S] in [−1, 1] → PNG bytes. */
export async function imageToPng(x: Float32Array, channels: number, size: number): Promise<Uint8Array> {
  if (x.length !== channels * size * size)
    throw new Error(`imageToPng: ${x.length} values for a ${channels}×${size}×${size} image`);
  const buf = await sharp(toBytes(x, channels, size), {
    raw: { width: size, height: size, channels: channels as 1 | 3 },
  })
    .png({ compressionLevel: 9 })
    .toBuffer();
  return new Uint8Array(buf);
}

/** A batch [B, C, S, S] → B PNGs. */
export async function batchToPngs(x: Float32Array, channels: number, size: number): Promise<Uint8Array[]> {
  const px = channels * size * size;
  return Promise.all(
    Array.from({ length: x.length / px }, (_, b) => imageToPng(x.subarray(b * px, (b + 1) * px), channels, size)),
  );
}

/** A batch [B, C, S, S] laid out `cols` per row (1-pixel grey gutters) → one PNG. */
export async function gridPng(x: Float32Array, channels: number, size: number, cols: number): Promise<Uint8Array> {
  const px = channels * size * size,
    B = x.length / px;
  const rows = Math.ceil(B / cols);
  const W = cols * (size + 1) + 1,
    H = rows * (size + 1) + 1;
  const out = Buffer.alloc(W * H * channels, 128);
  for (let b = 0; b < B; b++) {
    const img = toBytes(x.subarray(b * px, (b + 1) * px), channels, size);
    const ox = 1 + (b % cols) * (size + 1),
      oy = 1 + Math.floor(b / cols) * (size + 1);
    for (let y = 0; y < size; y++)
      img.copy(out, ((oy + y) * W + ox) * channels, y * size * channels, (y + 1) * size * channels);
  }
  return new Uint8Array(
    await sharp(out, { raw: { width: W, height: H, channels: channels as 1 | 3 } })
      .png()
      .toBuffer(),
  );
}

/** PNG bytes → [C, S, S] floats in [−1, 1] (grey or RGB; alpha dropped). */
export async function pngToImage(png: Uint8Array, channels: 1 | 3): Promise<{ x: Float32Array; size: number }> {
  let s = sharp(png);
  s = channels === 1 ? s.greyscale() : s.removeAlpha().toColourspace('srgb');
  const { data, info } = await s.raw().toBuffer({ resolveWithObject: true });
  if (info.width !== info.height) throw new Error(`pngToImage: image is ${info.width}×${info.height}, not square`);
  const S = info.width,
    C = info.channels;
  const x = new Float32Array(channels * S * S);
  for (let c = 0; c < channels; c++) for (let i = 0; i < S * S; i++) x[c * S * S + i] = (data[i * C + c] / 255) * 2 - 1;
  return { x, size: S };
}

/**
 * Encoded image bytes (any format libvips reads) → [C, S, S] floats in [−1, 1] at `size`: grey
 * (C = 1) or sRGB (C = 3), alpha dropped, EXIF orientation applied; another size is scaled so its
 * short side is S and centre-cropped (diffusers' text-to-image training: Resize + CenterCrop),
 * Lanczos-3. Throws an Error saying why when the bytes do not decode.
 */
export async function decodeImage(bytes: Uint8Array, channels: 1 | 3, size: number): Promise<Float32Array> {
  let s = sharp(bytes).rotate();
  s = channels === 1 ? s.greyscale() : s.removeAlpha().toColourspace('srgb');
  const meta = await sharp(bytes).metadata();
  const swap = (meta.orientation ?? 1) >= 5;
  const w = swap ? meta.height : meta.width,
    h = swap ? meta.width : meta.height;
  if (w !== size || h !== size) s = s.resize(size, size, { fit: 'cover', position: 'centre', kernel: 'lanczos3' });
  const { data, info } = await s.raw().toBuffer({ resolveWithObject: true });
  const C = info.channels,
    px = size * size;
  const x = new Float32Array(channels * px);
  for (let c = 0; c < channels; c++) for (let i = 0; i < px; i++) x[c * px + i] = (data[i * C + c] / 255) * 2 - 1;
  return x;
}
