/**
 * Model config (HF round trip, validation), seeded init, safetensors and checkpoints (round trip,
 * atomic write, validation errors naming the tensor), tokenizers.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { fromHfConfig, modelConfig, toHfConfig } from '../../../lib/model/config.ts';
import { initWeights } from '../../../lib/model/init.ts';
import { paramCount, paramSpecs, zerosLikeWeights } from '../../../lib/model/params.ts';
import { checkpointSha256, loadCheckpoint, saveCheckpoint } from '../../../lib/model/checkpoint.ts';
import { decodeSafetensors, encodeSafetensors, roundedToBf16 } from '../../../lib/model/safetensors.ts';
import { AlphabetTokenizer, ByteTokenizer, createTokenizer } from '../../../lib/model/tokenizer.ts';

const base = {
  hiddenSize: 16,
  intermediateSize: 24,
  numHiddenLayers: 2,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  vocabSize: 20,
  maxPositionEmbeddings: 32,
  bosTokenId: 1,
  eosTokenId: 2,
  padTokenId: 0,
};

async function tmpdir(): Promise<string> {
  return fs.mkdtemp(path.join(os.tmpdir(), 'rlstream-ckpt-'));
}

describe('model config', () => {
  it('round-trips through HF config.json for llama, qwen2 and value models', () => {
    for (const c of [
      modelConfig(base),
      modelConfig({ ...base, modelType: 'qwen2', attentionBias: true, tieWordEmbeddings: true }),
      modelConfig({ ...base, head: 'value' }),
    ]) {
      const hf = toHfConfig(c);
      assert.equal(hf.hidden_size, 16);
      assert.equal(hf.torch_dtype, 'float32');
      assert.deepEqual(fromHfConfig(JSON.parse(JSON.stringify(hf))), c);
    }
    assert.deepEqual(toHfConfig(modelConfig({ ...base, head: 'value' })).architectures, [
      'LlamaForTokenClassification',
    ]);
    assert.deepEqual(toHfConfig(modelConfig({ ...base, modelType: 'qwen2' })).architectures, ['Qwen2ForCausalLM']);
  });
  it('rejects bad configs with the field to fix', () => {
    assert.throws(
      () => modelConfig({ ...base, hiddenSize: 18 }),
      /hiddenSize 18 must be divisible by numAttentionHeads 4/,
    );
    assert.throws(() => modelConfig({ ...base, numKeyValueHeads: 3 }), /multiple of numKeyValueHeads 3/);
    assert.throws(() => modelConfig({ ...base, eosTokenId: 20 }), /eosTokenId 20 is outside the vocabulary/);
    assert.throws(() => modelConfig({ ...base, hiddenSizes: 3 } as never), /hiddenSizes/);
    assert.throws(
      () => fromHfConfig({ ...toHfConfig(modelConfig(base)), model_type: 'gpt2' }),
      /model_type "gpt2" is not supported/,
    );
  });
  it('parameter names follow HF conventions', () => {
    const names = paramSpecs(modelConfig({ ...base, attentionBias: true })).map((s) => s.name);
    assert.ok(names.includes('model.layers.1.self_attn.k_proj.bias'), 'q/k/v biases');
    assert.ok(names.includes('lm_head.weight'), 'separate head');
    assert.ok(
      !paramSpecs(modelConfig({ ...base, tieWordEmbeddings: true })).some((s) => s.name === 'lm_head.weight'),
      'tied head has no lm_head.weight',
    );
    assert.deepEqual(paramSpecs(modelConfig({ ...base, head: 'value' })).at(-1), {
      name: 'score.weight',
      shape: [1, 16],
    });
    const kv = paramSpecs(modelConfig(base)).find((s) => s.name === 'model.layers.0.self_attn.k_proj.weight');
    assert.deepEqual(kv!.shape, [8, 16]);
  });
});

describe('seeded init', () => {
  it('same seed gives byte-identical weights; different seeds differ; std ≈ 0.02, norms 1, biases 0', () => {
    const c = modelConfig({ ...base, attentionBias: true });
    const a = initWeights(c, 42),
      b = initWeights(c, 42),
      d = initWeights(c, 43);
    const bytes = (w: Map<string, Float32Array>) =>
      createHash('sha256')
        .update(Buffer.concat([...w.values()].map((x) => Buffer.from(x.buffer))))
        .digest('hex');
    assert.equal(bytes(a), bytes(b));
    assert.notEqual(bytes(a), bytes(d));
    const e = a.get('model.embed_tokens.weight')!;
    const std = Math.sqrt(e.reduce((s, x) => s + x * x, 0) / e.length);
    assert.ok(Math.abs(std - 0.02) < 0.003, `embedding std ${std}`);
    assert.ok(
      a.get('model.norm.weight')!.every((x) => x === 1),
      'norms are 1',
    );
    assert.ok(
      a.get('model.layers.0.self_attn.q_proj.bias')!.every((x) => x === 0),
      'biases are 0',
    );
    assert.equal(
      [...a.values()].reduce((s, x) => s + x.length, 0),
      paramCount(c),
    );
  });
});

describe('safetensors', () => {
  it('round-trips tensors and metadata; header is 8-byte aligned', () => {
    const buf = encodeSafetensors(
      [
        ['a', { shape: [2, 3], data: Float32Array.from([1, 2, 3, 4, 5, 6]) }],
        ['b', { shape: [2], data: BigInt64Array.from([7n, -8n]) }],
      ],
      { format: 'pt' },
    );
    assert.equal(Number(buf.readBigUInt64LE(0)) % 8, 0);
    const { tensors, metadata } = decodeSafetensors(buf);
    assert.deepEqual(metadata, { format: 'pt' });
    assert.deepEqual(Array.from(tensors.get('a')!.data as Float32Array), [1, 2, 3, 4, 5, 6]);
    assert.deepEqual(tensors.get('b')!.shape, [2]);
    assert.equal(tensors.get('b')!.dtype, 'I64');
  });
  it('rejects truncated and inconsistent files, naming the tensor', () => {
    const buf = encodeSafetensors([['w', { shape: [4], data: new Float32Array(4) }]]);
    assert.throws(
      () => decodeSafetensors(buf.subarray(0, buf.length - 4), 'x.safetensors'),
      /x.safetensors: tensor w has data_offsets .* outside/,
    );
    assert.throws(() => decodeSafetensors(buf.subarray(0, 20), 'x.safetensors'), /header length/);
    const hdr = JSON.stringify({ w: { dtype: 'F32', shape: [3], data_offsets: [0, 16] } });
    const bad = Buffer.concat([Buffer.alloc(8), Buffer.from(hdr), Buffer.alloc(16)]);
    bad.writeBigUInt64LE(BigInt(hdr.length));
    assert.throws(() => decodeSafetensors(bad, 'y'), /tensor w F32\[3\] needs 12 bytes, offsets give 16/);
  });
});

describe('checkpoints', () => {
  it('save → load round trip with optimizer state; sha256 is stable and matches the file', async () => {
    const dir = path.join(await tmpdir(), 'step-3');
    const c = modelConfig({ ...base, modelType: 'qwen2', attentionBias: true });
    const w = initWeights(c, 1);
    const m = initWeights(c, 2),
      v = zerosLikeWeights(c);
    const { weightsSha256 } = await saveCheckpoint(dir, c, w, {
      optimizer: { step: 3, expAvg: m, expAvgSq: v },
      metadata: { run_id: 'r1' },
    });
    assert.deepEqual((await fs.readdir(dir)).sort(), [
      'config.json',
      'generation_config.json',
      'model.safetensors',
      'optimizer.safetensors',
    ]);
    assert.deepEqual(await fs.readdir(path.dirname(dir)), ['step-3'], 'no temporary directories left behind');
    const ck = await loadCheckpoint(dir);
    assert.deepEqual(ck.config, c);
    assert.equal(ck.weightsSha256, weightsSha256);
    assert.equal(await checkpointSha256(dir), weightsSha256);
    assert.equal(ck.metadata.run_id, 'r1');
    for (const s of paramSpecs(c)) assert.deepEqual(ck.weights.get(s.name), w.get(s.name));
    assert.equal(ck.optimizer!.step, 3);
    assert.deepEqual(ck.optimizer!.expAvg.get('model.norm.weight'), m.get('model.norm.weight'));
    // same weights → same hash (deterministic bytes)
    const dir2 = path.join(path.dirname(dir), 'again');
    assert.equal((await saveCheckpoint(dir2, c, w, { metadata: { run_id: 'r1' } })).weightsSha256, weightsSha256);
    await assert.rejects(saveCheckpoint(dir2, c, w), /already exists/);
    await saveCheckpoint(dir2, c, initWeights(c, 9), { overwrite: true });
    assert.notEqual(await checkpointSha256(dir2), weightsSha256);
  });
  it('bf16 weights with optimizer state: the f32 masters come back with it, the rounded weights without', async () => {
    const dir = path.join(await tmpdir(), 'bf16');
    const c = modelConfig(base);
    const w = initWeights(c, 4);
    await saveCheckpoint(dir, c, w, {
      dtype: 'bfloat16',
      optimizer: { step: 2, expAvg: zerosLikeWeights(c), expAvgSq: zerosLikeWeights(c) },
    });
    const stored = decodeSafetensors(await fs.readFile(path.join(dir, 'model.safetensors')), 'model.safetensors');
    assert.ok([...stored.tensors.values()].every((t) => t.dtype === 'BF16'));
    const full = await loadCheckpoint(dir);
    const rounded = await loadCheckpoint(dir, { optimizer: false });
    let differ = 0;
    for (const s of paramSpecs(c)) {
      assert.deepEqual(full.weights.get(s.name), w.get(s.name), `${s.name}: the f32 master`);
      assert.deepEqual(rounded.weights.get(s.name), roundedToBf16(w.get(s.name)!), `${s.name}: rounded to bf16`);
      // hand-checked rounding: the top 16 bits, plus one when the low 16 are above half or a tie with an odd top
      const bits = new Uint32Array(w.get(s.name)!.buffer);
      const got = new Uint32Array(rounded.weights.get(s.name)!.buffer);
      bits.forEach((x, i) => {
        const lo = x & 0xffff,
          hi = x >>> 16;
        assert.equal(got[i] >>> 16, hi + (lo > 0x8000 || (lo === 0x8000 && hi & 1) ? 1 : 0));
        if (lo) differ++;
      });
    }
    assert.ok(differ > 0, 'rounding changed some weights');
  });
  it('loading reports missing files, wrong shapes, unknown tensors and bad dtypes by name', async () => {
    const root = await tmpdir();
    const c = modelConfig(base);
    const dir = path.join(root, 'ck');
    await saveCheckpoint(dir, c, initWeights(c, 1));
    // a config with more layers than the weights
    await fs.writeFile(
      path.join(dir, 'config.json'),
      JSON.stringify(toHfConfig(modelConfig({ ...base, numHiddenLayers: 3 }))),
    );
    await assert.rejects(loadCheckpoint(dir), /missing tensor model.layers.2.input_layernorm.weight/);
    await fs.writeFile(
      path.join(dir, 'config.json'),
      JSON.stringify(toHfConfig(modelConfig({ ...base, intermediateSize: 32 }))),
    );
    await assert.rejects(
      loadCheckpoint(dir),
      /tensor model.layers.0.mlp.gate_proj.weight has shape \[24,16\], expected \[32,16\]/,
    );
    await fs.writeFile(
      path.join(dir, 'config.json'),
      JSON.stringify(toHfConfig(modelConfig({ ...base, numHiddenLayers: 1 }))),
    );
    await assert.rejects(loadCheckpoint(dir), /unexpected tensor\(s\) model.layers.1/);
    await fs.writeFile(path.join(dir, 'config.json'), JSON.stringify(toHfConfig(c)));
    const specs = paramSpecs(c);
    const w = initWeights(c, 1);
    await fs.writeFile(
      path.join(dir, 'model.safetensors'),
      encodeSafetensors(
        specs.map((s) => [
          s.name,
          { shape: s.shape, data: s.name === 'model.norm.weight' ? new Int32Array(16) : w.get(s.name)! },
        ]),
      ),
    );
    await assert.rejects(loadCheckpoint(dir), /model.norm.weight has dtype I32, expected a float dtype/);
    await fs.rm(path.join(dir, 'model.safetensors'));
    await assert.rejects(loadCheckpoint(dir), /model.safetensors \(or model.safetensors.index.json\) not found/);
    await assert.rejects(loadCheckpoint(path.join(root, 'nope')), /config.json not found/);
  });
  it('accepts float64 / bf16 tensors by converting to float32', async () => {
    const c = modelConfig(base);
    const dir = path.join(await tmpdir(), 'bf');
    await saveCheckpoint(dir, c, initWeights(c, 1));
    const specs = paramSpecs(c);
    const bf = (x: number) => new Uint16Array(new Float32Array([x]).buffer)[1];
    await fs.writeFile(
      path.join(dir, 'model.safetensors'),
      encodeSafetensors(
        specs.map((s) => [
          s.name,
          s.name === 'model.norm.weight'
            ? { shape: s.shape, data: Uint16Array.from({ length: 16 }, () => bf(1.5)), dtype: 'BF16' as const }
            : { shape: s.shape, data: Float64Array.from(initWeights(c, 1).get(s.name)!) },
        ]),
      ),
    );
    const ck = await loadCheckpoint(dir);
    assert.ok(
      ck.weights.get('model.norm.weight')!.every((x) => x === 1.5),
      'bf16 1.5 decoded',
    );
  });
});

describe('tokenizers', () => {
  it('ByteTokenizer round-trips any UTF-8 text; specials are distinct and dropped on decode', () => {
    const t = new ByteTokenizer();
    for (const s of ['', 'hello', 'héllo wörld — ✓ 日本語 🎉', '\u0000\n\t']) assert.equal(t.decode(t.encode(s)), s);
    assert.equal(new Set([t.bos, t.eos, t.pad]).size, 3);
    assert.ok(t.bos >= 256 && t.eos >= 256 && t.pad >= 256 && t.vocabSize === 259, 'specials after the bytes');
    assert.equal(t.decode([t.bos, ...t.encode('ab'), t.eos, t.pad]), 'ab');
    assert.throws(() => t.decode([300]), /id 300 at position 0 is outside/);
  });
  it('AlphabetTokenizer: compact ids, clear error for an unknown character', () => {
    const t = new AlphabetTokenizer('0123456789 :');
    assert.equal(t.vocabSize, 15);
    assert.deepEqual(Array.from(t.encode('37 5:')), [6, 10, 13, 8, 14]);
    assert.equal(t.decode(t.encode('81 5 37:')), '81 5 37:');
    assert.throws(() => t.encode('12x'), /character "x" at position 2 of "12x" is not in the alphabet "0123456789 :"/);
    assert.throws(() => new AlphabetTokenizer('aba'), /appears twice/);
    assert.equal(createTokenizer({ type: 'alphabet', alphabet: 'ab' }).vocabSize, 5);
    assert.throws(() => createTokenizer({ type: 'bpe' } as never), /unknown tokenizer type "bpe"/);
  });
});
