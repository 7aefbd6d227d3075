/**
 * Hugging Face model directories in and out: sharded bf16 loading, the one-line errors (missing
 * shard, missing / mis-shaped tensor, unknown dtype, unsupported config keys), tied heads,
 * eos lists, and `rlstream export` writing a directory that reloads to the same weights.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { fromHfConfig, modelConfig, stopTokenIds, toHfConfig } from '../../../lib/model/config.ts';
import { initWeights } from '../../../lib/model/init.ts';
import { paramSpecs } from '../../../lib/model/params.ts';
import { loadCheckpoint, readModelDirConfig, saveCheckpoint, valueModelFrom } from '../../../lib/model/checkpoint.ts';
import { loadConfig } from '../../../lib/config/index.ts';
import { criticModelConfig, policyModelConfig, tokenizerFor } from '../../../lib/pipeline/policy.ts';
import { encodeSafetensors, floatToHalf, fromFloat32 } from '../../../lib/model/safetensors.ts';
import { exportCommand } from '../../../app/cli/commands/export.ts';
import { QWEN3_TOKENIZER_DIR, writeHfModelDir } from '../../support/hf-model-dir.ts';

const root = mkdtempSync(path.join(os.tmpdir(), 'rlstream-hf-'));
after(() => rmSync(root, { recursive: true, force: true }));

const qwen3Json = {
  architectures: ['Qwen3ForCausalLM'],
  model_type: 'qwen3',
  hidden_size: 32,
  intermediate_size: 48,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 16,
  vocab_size: 50,
  max_position_embeddings: 64,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000,
  hidden_act: 'silu',
  tie_word_embeddings: true,
  attention_bias: false,
  bos_token_id: 3,
  eos_token_id: [4, 5],
  use_cache: true,
  transformers_version: '4.51.0',
  use_sliding_window: false,
  sliding_window: null,
  max_window_layers: 28,
};

function writeDir(name: string, json: Record<string, unknown> = qwen3Json, opts: { shards?: number } = {}) {
  const dir = path.join(root, name);
  const c = fromHfConfig(json);
  const w = initWeights(c, 7, { std: 0.3 });
  writeHfModelDir(dir, {
    config: json,
    generation: { bos_token_id: 3, eos_token_id: [5, 6] },
    tensors: paramSpecs(c).map((s) => [s.name, s.shape]),
    weights: w,
    dtype: 'bfloat16',
    shards: opts.shards ?? 2,
  });
  return { dir, c, w };
}

describe('HF model directories in', () => {
  it('loads sharded bf16 weights (f32 = the bf16 values) with eos ids from config.json and generation_config.json', async () => {
    const { dir, w } = writeDir('ok');
    const ck = await loadCheckpoint(dir);
    assert.equal(ck.config.modelType, 'qwen3');
    assert.equal(ck.config.headDim, 16);
    assert.deepEqual(stopTokenIds(ck.config), [4, 5, 6]);
    assert.ok(paramSpecs(ck.config).some((s) => s.name === 'model.layers.1.self_attn.k_norm.weight'));
    for (const [name, a] of w) {
      const got = ck.weights.get(name)!,
        bf = fromFloat32(a, [a.length], 'bfloat16').data as Uint16Array;
      for (let i = 0; i < a.length; i += 97)
        assert.equal(new Uint32Array(Float32Array.of(got[i]).buffer)[0], (bf[i] << 16) >>> 0, `${name}[${i}]`);
      assert.ok(Math.abs(got[0] - a[0]) <= Math.abs(a[0]) / 128, `${name} rounds to bf16`);
    }
    assert.equal(ck.config.extra?.transformers_version, '4.51.0');
  });

  it('a missing shard names the file; nothing half-loads', async () => {
    const { dir } = writeDir('noshard');
    unlinkSync(path.join(dir, 'model-00002-of-00002.safetensors'));
    await assert.rejects(loadCheckpoint(dir), /names shard model-00002-of-00002\.safetensors, which is missing/);
    const bin = path.join(root, 'binonly');
    writeDir('binonly');
    for (const f of [
      'model-00001-of-00002.safetensors',
      'model-00002-of-00002.safetensors',
      'model.safetensors.index.json',
    ])
      unlinkSync(path.join(bin, f));
    writeFileSync(path.join(bin, 'pytorch_model.bin'), 'pickle');
    await assert.rejects(
      loadCheckpoint(bin),
      /has only PyTorch pickle weights \(pytorch_model\.bin\); download the model's safetensors files/,
    );
  });

  it('a missing or mis-shaped tensor names it with the expected and found shape', async () => {
    const { dir } = writeDir('shape', { ...qwen3Json, intermediate_size: 40 });
    writeFileSync(path.join(dir, 'config.json'), JSON.stringify({ ...qwen3Json, intermediate_size: 48 }));
    await assert.rejects(
      loadCheckpoint(dir),
      /tensor model\.layers\.0\.mlp\.gate_proj\.weight has shape \[40,32\], expected \[48,32\]/,
    );
    const d2 = writeDir('missing');
    const idx = JSON.parse(readFileSync(path.join(d2.dir, 'model.safetensors.index.json'), 'utf8'));
    delete idx.weight_map['model.layers.1.self_attn.q_norm.weight'];
    writeFileSync(path.join(d2.dir, 'model.safetensors.index.json'), JSON.stringify(idx));
    await assert.rejects(
      loadCheckpoint(d2.dir),
      /missing tensor model\.layers\.1\.self_attn\.q_norm\.weight \(expected shape \[16\]\)/,
    );
  });

  it('an unknown dtype names it', async () => {
    const dir = path.join(root, 'dtype');
    const c = fromHfConfig(qwen3Json);
    writeHfModelDir(dir, {
      config: qwen3Json,
      tensors: paramSpecs(c).map((s) => [s.name, s.shape]),
      weights: initWeights(c, 1),
      shards: 1,
    });
    const specs = paramSpecs(c);
    const buf = encodeSafetensors(
      specs.map((s, i) => [
        s.name,
        i === 0
          ? { shape: s.shape, data: new Uint8Array(s.shape[0] * s.shape[1]), dtype: 'U8' as const }
          : fromFloat32(new Float32Array(s.shape.reduce((a, b) => a * b, 1)), s.shape, 'float32'),
      ]),
    );
    writeFileSync(path.join(dir, 'model.safetensors'), buf);
    await assert.rejects(loadCheckpoint(dir), /model\.embed_tokens\.weight has dtype U8/);
    const hdr = buf.readBigUInt64LE(0);
    const json = JSON.parse(buf.subarray(8, 8 + Number(hdr)).toString());
    json['model.norm.weight'].dtype = 'F8_E4M3';
    let h = JSON.stringify(json);
    h += ' '.repeat((8 - (h.length % 8)) % 8);
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(h.length));
    writeFileSync(
      path.join(dir, 'model.safetensors'),
      Buffer.concat([len, Buffer.from(h), buf.subarray(8 + Number(hdr))]),
    );
    await assert.rejects(loadCheckpoint(dir), /model\.norm\.weight has unsupported dtype "F8_E4M3"/);
  });

  it('refuses what it does not implement with one line naming the key and value', () => {
    const cases: Array<[Record<string, unknown>, RegExp]> = [
      [
        { model_type: 'gemma3' },
        /^config\.json: model_type "gemma3" is not supported \(supported: llama, mistral, qwen2, qwen3, qwen2_vl, qwen2_5_vl\)$/,
      ],
      [{ hidden_act: 'gelu' }, /hidden_act "gelu" is not supported/],
      [
        { rope_scaling: { rope_type: 'yarn', factor: 4 } },
        /rope_scaling type "yarn" is not supported \(supported: linear, llama3\)/,
      ],
      [{ use_sliding_window: true }, /use_sliding_window true is not supported/],
      [{ attention_bias: true }, /attention_bias true for model_type qwen3 is not supported/],
      [{ quantization_config: { quant_method: 'awq' } }, /quantization_config is not supported/],
      [{ rope_scaling: { rope_type: 'llama3', factor: 8 } }, /rope_scaling "llama3" needs a number "low_freq_factor"/],
    ];
    for (const [patch, re] of cases) {
      assert.throws(
        () => fromHfConfig({ ...qwen3Json, ...patch }),
        (e: Error) => re.test(e.message) && !e.message.includes('\n'),
        JSON.stringify(patch),
      );
    }
  });

  it('reads llama3 / linear rope scaling (rope_type or type) and the transformers 5 rope_parameters form', () => {
    const l = fromHfConfig({
      ...qwen3Json,
      model_type: 'llama',
      head_dim: 8,
      rope_scaling: {
        rope_type: 'llama3',
        factor: 8,
        low_freq_factor: 1,
        high_freq_factor: 4,
        original_max_position_embeddings: 8192,
      },
    });
    assert.deepEqual(l.ropeScaling, {
      type: 'llama3',
      factor: 8,
      lowFreqFactor: 1,
      highFreqFactor: 4,
      originalMaxPositionEmbeddings: 8192,
    });
    assert.deepEqual(
      fromHfConfig({ ...qwen3Json, model_type: 'mistral', rope_scaling: { type: 'linear', factor: 2 } }).ropeScaling,
      { type: 'linear', factor: 2 },
    );
    const { rope_theta: _t, ...noTheta } = qwen3Json;
    const v5 = fromHfConfig({ ...noTheta, rope_parameters: { rope_type: 'default', rope_theta: 5000 } });
    assert.equal(v5.ropeTheta, 5000);
    assert.equal(v5.ropeScaling, null);
  });

  it("ignores a tied model's stored lm_head.weight; refuses a tensor config.json does not explain", async () => {
    const json = { ...qwen3Json };
    const c = fromHfConfig(json),
      w = initWeights(c, 2);
    const dir = path.join(root, 'tiedhead');
    w.set('lm_head.weight', w.get('model.embed_tokens.weight')!);
    writeHfModelDir(dir, {
      config: json,
      tensors: [...paramSpecs(c).map((s) => [s.name, s.shape] as [string, number[]]), ['lm_head.weight', [50, 32]]],
      weights: w,
      shards: 1,
    });
    assert.equal((await loadCheckpoint(dir)).weights.has('lm_head.weight'), false);
    const dir2 = path.join(root, 'stray');
    w.set('model.layers.0.mlp.gate_proj.bias', new Float32Array(48));
    writeHfModelDir(dir2, {
      config: json,
      tensors: [
        ...paramSpecs(c).map((s) => [s.name, s.shape] as [string, number[]]),
        ['model.layers.0.mlp.gate_proj.bias', [48]],
      ],
      weights: w,
      shards: 1,
    });
    await assert.rejects(loadCheckpoint(dir2), /unexpected tensor\(s\) model\.layers\.0\.mlp\.gate_proj\.bias/);
  });

  it('bf16 / f16 conversion rounds to nearest even', () => {
    assert.equal(floatToHalf(1), 0x3c00);
    assert.equal(floatToHalf(65504), 0x7bff);
    assert.equal(floatToHalf(1e6), 0x7c00);
    assert.equal(floatToHalf(2 ** -24), 1);
    assert.equal(floatToHalf(1 + 2 ** -11), 0x3c00); // tie → even
    assert.equal(floatToHalf(1 + 3 * 2 ** -11), 0x3c02);
    const b = fromFloat32(Float32Array.of(1 + 2 ** -8, 1 + 3 * 2 ** -8, -2), [3], 'bfloat16').data as Uint16Array;
    assert.deepEqual([...b], [0x3f80, 0x3f82, 0xc000]);
  });
});

describe('HF model directories out', () => {
  it('a saved directory keeps the source keys, states the dtype, carries generation config and tokenizer files', async () => {
    const { dir } = writeDir('src');
    writeFileSync(path.join(dir, 'tokenizer.json'), '{"fake": true}');
    writeFileSync(path.join(dir, 'tokenizer_config.json'), '{"chat_template": "x"}');
    const ck = await loadCheckpoint(dir);
    const out = path.join(root, 'saved');
    await saveCheckpoint(out, ck.config, ck.weights, { assetsFrom: dir });
    const cfg = JSON.parse(readFileSync(path.join(out, 'config.json'), 'utf8'));
    assert.equal(cfg.transformers_version, '4.51.0');
    assert.equal(cfg.max_window_layers, 28);
    assert.deepEqual(cfg.eos_token_id, [4, 5, 6]);
    assert.equal(cfg.torch_dtype, 'float32');
    assert.deepEqual(cfg.architectures, ['Qwen3ForCausalLM']);
    assert.equal(readFileSync(path.join(out, 'tokenizer.json'), 'utf8'), '{"fake": true}');
    assert.deepEqual(JSON.parse(readFileSync(path.join(out, 'generation_config.json'), 'utf8')), {
      bos_token_id: 3,
      eos_token_id: [5, 6],
    });
    const again = await readModelDirConfig(out);
    assert.deepEqual(again.config, ck.config);
  });

  it('rlstream export writes bf16 without optimizer state; it reloads to the same (bf16) weights', async () => {
    const { dir } = writeDir('exp-src');
    const ck = await loadCheckpoint(dir);
    const run = path.join(root, 'policy-v1');
    await saveCheckpoint(run, ck.config, ck.weights, {
      assetsFrom: dir,
      optimizer: { step: 1, expAvg: ck.weights, expAvgSq: ck.weights },
    });
    const out = path.join(root, 'exported');
    const log: string[] = [];
    const orig = process.stdout.write.bind(process.stdout);
    process.stdout.write = ((s: string) => {
      log.push(s);
      return true;
    }) as typeof process.stdout.write;
    try {
      assert.equal(await exportCommand.run([run, '--out', out, '--dtype', 'bf16']), 0);
    } finally {
      process.stdout.write = orig;
    }
    assert.match(log.join(''), /exported .* \(qwen3, .*M parameters, bf16\)/);
    assert.ok(!existsSync(path.join(out, 'optimizer.safetensors')));
    assert.equal(JSON.parse(readFileSync(path.join(out, 'config.json'), 'utf8')).torch_dtype, 'bfloat16');
    const back = await loadCheckpoint(out);
    for (const [k, v] of ck.weights) assert.deepEqual(back.weights.get(k), v, k);
    await assert.rejects(exportCommand.run([run, '--out', out]), /already exists/);
    await assert.rejects(
      exportCommand.run([run, '--out', path.join(root, 'x'), '--dtype', 'f8']),
      /--dtype must be one of bf16, f16, f32/,
    );
  });

  it('toHfConfig / fromHfConfig keep qwen3 head_dim, rope scaling and eos lists', () => {
    const c = modelConfig({
      modelType: 'qwen3',
      hiddenSize: 32,
      intermediateSize: 48,
      numHiddenLayers: 1,
      numAttentionHeads: 4,
      numKeyValueHeads: 2,
      headDim: 16,
      vocabSize: 50,
      maxPositionEmbeddings: 64,
      bosTokenId: 1,
      eosTokenId: 2,
      eosTokenIds: [2, 7],
      padTokenId: 0,
      ropeScaling: { type: 'linear', factor: 2 },
    });
    assert.deepEqual(fromHfConfig(JSON.parse(JSON.stringify(toHfConfig(c)))), c);
  });
});

describe('a run on a model directory', () => {
  const runCfg = (dir: string, extra: string[] = []) =>
    loadConfig({
      overrides: [
        `actor.model.path=${dir}`,
        'data.task=number_game',
        'data.max_prompt_length=16',
        'data.max_response_length=8',
        ...extra,
      ],
    });

  it('takes the architecture and tokenizer from the directory; a tokenizer that does not fit the vocabulary says both sizes', () => {
    const big = path.join(root, 'run-ok'),
      small = path.join(root, 'run-small');
    for (const [dir, vocab] of [
      [big, 151936],
      [small, 1000],
    ] as const) {
      const json = {
        ...qwen3Json,
        vocab_size: vocab,
        hidden_size: 8,
        head_dim: 4,
        intermediate_size: 8,
        num_hidden_layers: 1,
      };
      const c = fromHfConfig(json);
      writeHfModelDir(dir, {
        config: json,
        tensors: paramSpecs(c).map((s) => [s.name, s.shape]),
        weights: initWeights(c, 1),
        shards: 1,
        tokenizerFrom: QWEN3_TOKENIZER_DIR,
      });
    }
    const cfg = runCfg(big);
    const tok = tokenizerFor(cfg);
    assert.equal(tok.vocabSize, 151669);
    assert.deepEqual(Array.from(tok.encode('Hello world')), [9707, 1879]);
    const c = policyModelConfig(cfg, tok);
    assert.equal(c.modelType, 'qwen3');
    assert.equal(c.vocabSize, 151936);
    const critic = criticModelConfig(
      loadConfig({
        overrides: [
          `actor.model.path=${big}`,
          'data.task=number_game',
          'data.max_prompt_length=16',
          'data.max_response_length=8',
          'algorithm.adv_estimator=gae',
        ],
      }),
      tok,
    );
    assert.deepEqual([critic.head, critic.tieWordEmbeddings, critic.hiddenSize], ['value', false, 8]);
    assert.throws(
      () => policyModelConfig(runCfg(small), tokenizerFor(runCfg(small))),
      /^ConfigError: actor\.model\.path: the tokenizer has 151669 ids but the model's vocab_size is 1000; use the tokenizer the model was trained with$/,
    );
    assert.throws(
      () => policyModelConfig(runCfg(big, ['data.max_response_length=250']), tok),
      /16 \+ 250 = 266 exceeds the model's max_position_embeddings 64/,
    );
  });

  it('a causal LM starts a critic: same trunk, fresh score head', async () => {
    const { dir } = writeDir('critic-src');
    const ck = await loadCheckpoint(dir);
    const v = valueModelFrom(ck, 3);
    assert.equal(v.config.head, 'value');
    assert.deepEqual(
      v.weights.get('model.layers.1.mlp.up_proj.weight'),
      ck.weights.get('model.layers.1.mlp.up_proj.weight'),
    );
    assert.deepEqual(paramSpecs(v.config).at(-1), { name: 'score.weight', shape: [1, 32] });
    assert.ok(v.weights.get('score.weight')!.some((x) => x !== 0));
  });
});
