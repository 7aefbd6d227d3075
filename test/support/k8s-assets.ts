/**
 * The user's assets of infra/k8s/examples/own-model, small, for test/e2e/k8s-manifests.test.ts:
 *
 *  - `writeModelDir`: a Hugging Face-layout Qwen3 directory (config.json, model.safetensors) at a
 *    tiny size with the byte tokenizer's 259-id vocabulary, whose fresh policy mostly writes the
 *    digits 1 and 2, so the example's reward module (last number = ground truth) scores about one
 *    response in four 1 and the others 0: GRPO has advantages to train on, and the final
 *    checkpoint depends on the sampled responses.
 *  - `writeTrainParquet`: verl's GSM8K row layout (chat-message prompt, reward_model.ground_truth).
 *  - `uploadWithSums`: a directory's files and their SHA256SUMS under an s3:// prefix.
 *  - `fetchSteps`: the SRC DEST pairs of an init container's `rlstream fetch`.
 *  - `derivedImageFiles`: a Dockerfile's COPY lines as image path → file of its build context,
 *    the layout the derived image has (no image is built).
 */
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { PutObjectCommand, type S3Client } from '@aws-sdk/client-s3';
import { parquetWriteFile } from 'hyparquet-writer';
import { fromHfConfig } from '../../lib/model/config.ts';
import { initWeights } from '../../lib/model/init.ts';
import { paramSpecs } from '../../lib/model/params.ts';
import { createTokenizer } from '../../lib/model/tokenizer.ts';
import { writeHfModelDir } from './hf-model-dir.ts';

export function writeModelDir(dir: string, seed: number): void {
  const byte = createTokenizer({ type: 'byte' });
  const config = {
    architectures: ['Qwen3ForCausalLM'],
    model_type: 'qwen3',
    hidden_size: 32,
    intermediate_size: 64,
    num_hidden_layers: 1,
    num_attention_heads: 2,
    num_key_value_heads: 2,
    head_dim: 16,
    vocab_size: byte.vocabSize,
    max_position_embeddings: 32,
    rms_norm_eps: 1e-6,
    rope_theta: 10000,
    tie_word_embeddings: false,
    bos_token_id: byte.bos,
    eos_token_id: byte.eos,
    pad_token_id: byte.pad,
  };
  const c = fromHfConfig(config);
  const D = c.hiddenSize;
  const w = initWeights(c, seed);
  // residual dimension 0 is a constant 4 at every position (every embedding row has it; no layer
  // writes to it), so after the final norm it is a large positive feature, and the LM head's rows
  // for "1" and "2" (the only non-zero rows) read it: the two digits outweigh the 257 other ids
  const emb = w.get('model.embed_tokens.weight')!;
  for (let v = 0; v < c.vocabSize; v++) emb[v * D] = 4;
  for (const name of ['model.layers.0.self_attn.o_proj.weight', 'model.layers.0.mlp.down_proj.weight']) {
    const m = w.get(name)!;
    m.fill(0, 0, m.length / D);
  }
  const head = w.get('lm_head.weight')!;
  const digits = new Set(Array.from('12', (d) => byte.encode(d).at(-1)!));
  for (let v = 0; v < c.vocabSize; v++)
    if (digits.has(v)) head[v * D] = 2;
    else head.fill(0, v * D, (v + 1) * D);
  writeHfModelDir(dir, { config, tensors: paramSpecs(c).map((s) => [s.name, s.shape]), weights: w, dtype: 'float32' });
}

/**
 * `rows` sums in verl's GSM8K parquet layout whose answers are 11, 12, 21 or 22 — the numbers the
 * fresh policy of writeModelDir writes in two tokens, so about one response in four is right.
 */
export function writeTrainParquet(file: string, rows: number): void {
  mkdirSync(dirname(file), { recursive: true });
  const answers = [11, 12, 21, 22];
  const qa = Array.from({ length: rows }, (_, i) => {
    const sum = answers[(i * 3) % 4],
      a = (i * 5) % 10;
    return [a, sum - a];
  });
  parquetWriteFile({
    filename: file,
    columnData: [
      { name: 'data_source', data: qa.map(() => 'sums') },
      { name: 'prompt', data: qa.map(([a, b]) => [{ role: 'user', content: `${a}+${b}=` }]) },
      { name: 'reward_model', data: qa.map(([a, b]) => ({ ground_truth: String(a + b), style: 'rule' })) },
    ],
  });
}

/** Uploads every file of `dir` and a SHA256SUMS of them under `s3://bucket/prefix/`. */
export async function uploadWithSums(client: S3Client, url: string, dir: string): Promise<void> {
  const m = /^s3:\/\/([^/]+)\/(.*)$/.exec(url);
  if (!m) throw new Error(`${url} is not an s3://bucket/prefix/ URL`);
  const [, bucket, prefix] = m;
  const key = (name: string) => `${prefix.replace(/\/?$/, '/')}${name}`;
  let sums = '';
  for (const name of readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => join(e.parentPath, e.name).slice(dir.length + 1))
    .sort()) {
    const body = readFileSync(join(dir, name));
    sums += `${createHash('sha256').update(body).digest('hex')}  ${name}\n`;
    await client.send(new PutObjectCommand({ Bucket: bucket, Key: key(name), Body: body }));
  }
  await client.send(new PutObjectCommand({ Bucket: bucket, Key: key('SHA256SUMS'), Body: sums }));
}

/** The SRC DEST pairs of an init container's `rlstream fetch SRC DEST [SRC DEST]…`. */
export function fetchSteps(argv: readonly string[]): Array<{ src: string; dest: string }> {
  if (argv[0] !== 'rlstream' || argv[1] !== 'fetch') throw new Error(`not an rlstream fetch: ${argv.join(' ')}`);
  const pairs = argv.slice(2).filter((a) => !a.startsWith('--'));
  return Array.from({ length: pairs.length / 2 }, (_, i) => ({ src: pairs[2 * i], dest: pairs[2 * i + 1] }));
}

/** A Dockerfile's `COPY [--flag…] SRC… DEST` lines: image path → file of its build context (its directory). */
export function derivedImageFiles(dockerfile: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const line of readFileSync(dockerfile, 'utf8').split('\n')) {
    const words = line.trim().split(/\s+/);
    if (words[0]?.toUpperCase() !== 'COPY') continue;
    const rest = words.slice(1).filter((w) => !w.startsWith('--'));
    if (rest.length !== 2 || rest[1].endsWith('/'))
      throw new Error(`${dockerfile}: this layout takes COPY of one file to a file path: ${line}`);
    out.set(rest[1], join(dirname(dockerfile), rest[0]));
  }
  return out;
}
