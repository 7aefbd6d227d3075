/**
 * Qwen-VL checkpoints beyond the decoder: LoRA on the vision tower's linear layers (the adapter
 * path equals the merged weights W + s·B·A, gradient checkpointing of ViT blocks and decoder
 * layers gives the same adapters bit for bit, PEFT's tensor names and a target_modules regex that
 * names exactly the adapted modules, export --merge), and the two tensor layouts of a checkpoint
 * (transformers < 4.52's `model.*` / `visual.*` and transformers 5's `model.language_model.*` /
 * `model.visual.*`): both load to the same weights, and export writes the input's names, dtypes
 * and shapes; weights over the shard size are written in save_pretrained's shards. Tiny random
 * Qwen2.5-VL directories (devkit/qwen-vl-dir.ts: bf16 shards).
 */
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { exportCommand } from '../../../app/cli/commands/export.ts';
import { QWEN_VL_TOKENS, writeQwenVlDir } from '../../../devkit/qwen-vl-dir.ts';
import {
  checkpointSha256,
  checkpointWeightsSha256,
  loadAdapter,
  loadCheckpoint,
  saveAdapter,
  saveCheckpoint,
} from '../../../lib/model/checkpoint.ts';
import { hfName } from '../../../lib/model/hf-layout.ts';
import { initLora, loraConfig, loraSpecs, mergeLora, peftTargetModules } from '../../../lib/model/lora.ts';
import { paramSpecs } from '../../../lib/model/params.ts';
import { decodeSafetensors, encodeSafetensors } from '../../../lib/model/safetensors.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { createTrainer, type TrainBatch } from '../../../lib/model/train.ts';
import { expandImagePads } from '../../../lib/model/vision.ts';
import { Rng } from '../../../lib/util/rng.ts';

const tmp = mkdtempSync(join(tmpdir(), 'rlstream-qvl-lora-'));
after(() => rmSync(tmp, { recursive: true, force: true }));
const cache = new SessionCache();
const flatDir = join(tmp, 'flat');
const { config: model, weights: base } = writeQwenVlDir(flatDir, { seed: 3 });
const lora = loraConfig({
  rank: 2,
  alpha: 4,
  targetModules: ['q_proj', 'down_proj'],
  visionTargetModules: 'all-linear',
});

/** Two rows with a 32×32 image each (8×8 patches of 4 px, 16 merged tokens in 2×2 attention windows) and a 4-token response. */
function batch(seed: number): TrainBatch {
  const rng = Rng.fromSeed(`qvl-lora:${seed}`);
  const img = () => ({ width: 32, height: 32, data: Uint8Array.from({ length: 3072 }, () => rng.int(256)) });
  const imgs = [img(), img()];
  const { imagePad: pad, visionStart: vs, visionEnd: ve } = QWEN_VL_TOKENS;
  const rows = imgs.map((im) => [
    ...expandImagePads(model, [151644, vs, pad, ve, 100 + rng.int(500), 200], [im]),
    ...Array.from({ length: 4 }, () => 300 + rng.int(1000)),
  ]);
  const T = rows[0].length;
  return {
    batchSize: 2,
    seqLen: T,
    tokens: Int32Array.from(rows.flat()),
    responseMask: Float32Array.from({ length: 2 * T }, (_, i) => (i % T >= T - 4 ? 1 : 0)),
    advantages: Float32Array.from({ length: 2 * T }, () => rng.next() * 2 - 1),
    oldLogprobs: Float32Array.from({ length: 2 * T }, () => -11 - rng.next()),
    images: imgs.map((im) => [im]),
  };
}
const maxAbs = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
};

describe('LoRA on the vision tower', () => {
  it('adapts every linear layer of every ViT block (qkv, proj, gate/up/down), never the patch embedding or merger', () => {
    const names = loraSpecs(model, lora).map((s) => s.name);
    assert.ok(names.includes('visual.blocks.1.attn.qkv.lora_A.weight'));
    for (const m of ['attn.proj', 'mlp.gate_proj', 'mlp.up_proj', 'mlp.down_proj'])
      assert.ok(names.includes(`visual.blocks.0.${m}.lora_B.weight`), m);
    assert.ok(!names.some((n) => /patch_embed|merger|fc1/.test(n)));
    assert.throws(
      () =>
        createTrainer({
          model,
          loss: { type: 'sft' },
          weights: base,
          lora: { ...lora, visionModules: ['fc1'] },
          cache,
        }),
      /vision_target_modules: fc1 not in this tower's blocks; valid here: qkv, proj, gate_proj/,
    );
  });

  it('a step trains the tower adapters; the adapter path equals the merged weights; checkpointing gives the same adapters', async () => {
    const loss = { type: 'policy' as const };
    const run = async (ckpt: boolean) => {
      const tr = createTrainer({
        model,
        loss,
        weights: base,
        lora,
        seed: 1,
        cache,
        threads: 1,
        gradientCheckpointing: ckpt,
      });
      await tr.step(batch(0), 5e-2);
      return tr;
    };
    const off = await run(false),
      on = await run(true);
    const w = off.getWeights();
    for (const [k, a] of w) assert.deepEqual(on.getWeights().get(k), a, `${k}: checkpointed = kept activations`);
    assert.ok(
      w.get('visual.blocks.0.attn.qkv.lora_B.weight')!.some((x) => x !== 0),
      'tower B moved',
    );
    assert.ok(
      w.get('visual.blocks.1.mlp.up_proj.lora_B.weight')!.some((x) => x !== 0),
      'tower MLP B moved',
    );
    const b = batch(7);
    const onAdapter = (await off.evaluate(b)).perToken;
    const merged = mergeLora(model, lora, base, w);
    const viaMerge = (await createTrainer({ model, loss, weights: merged, cache, threads: 1 }).evaluate(b)).perToken;
    const decoderOnly = mergeLora(model, { ...lora, visionModules: [] }, base, w);
    const viaDecoder = (await createTrainer({ model, loss, weights: decoderOnly, cache, threads: 1 }).evaluate(b))
      .perToken;
    assert.ok(maxAbs(onAdapter, viaMerge) < 2e-5, `adapter path vs merged weights: ${maxAbs(onAdapter, viaMerge)}`);
    assert.ok(maxAbs(onAdapter, viaDecoder) > 1e-4, 'the tower adapters change the policy');
    assert.ok(
      maxAbs(
        (await off.mergedWeights()).get('visual.blocks.1.attn.qkv.weight')!,
        merged.get('visual.blocks.1.attn.qkv.weight')!,
      ) < 1e-6,
    );
  });

  it('freeze_vision_tower with tower adapters is refused in one line', () => {
    assert.throws(
      () => createTrainer({ model, loss: { type: 'sft' }, weights: base, lora, cache, freezeVisionTower: true }),
      (e: Error) =>
        /freeze_vision_tower and actor\.model\.lora\.vision_target_modules/.test(e.message) &&
        !e.message.includes('\n'),
    );
  });
});

/** The model's linear module paths (2-D weights of the decoder layers and the ViT blocks) in `layout`. */
function linearModules(layout: 'flat' | 'nested'): string[] {
  return paramSpecs(model)
    .filter((s) => s.shape.length === 2 && /\.(layers|blocks)\.\d+\./.test(s.name))
    .map((s) => hfName(layout, s.name.slice(0, -'.weight'.length)));
}

/** A copy of a flat-layout directory in transformers 5's layout: every shard's and the index's names renamed. */
function nestedCopy(src: string, dst: string): void {
  mkdirSync(dst, { recursive: true });
  for (const f of readdirSync(src)) {
    const buf = readFileSync(join(src, f));
    if (f.endsWith('.safetensors')) {
      const d = decodeSafetensors(buf, f);
      writeFileSync(
        join(dst, f),
        encodeSafetensors(
          [...d.tensors].map(([k, t]) => [hfName('nested', k), t]),
          d.metadata,
        ),
      );
    } else if (f === 'model.safetensors.index.json') {
      const j = JSON.parse(buf.toString('utf8')) as { weight_map: Record<string, string> };
      j.weight_map = Object.fromEntries(Object.entries(j.weight_map).map(([k, v]) => [hfName('nested', k), v]));
      writeFileSync(join(dst, f), JSON.stringify(j));
    } else writeFileSync(join(dst, f), buf);
  }
}
/** name → dtype[shape] of every tensor of a directory's safetensors files. */
function header(dir: string): [string, string][] {
  const m = new Map<string, string>();
  for (const f of readdirSync(dir).filter((x) => x.endsWith('.safetensors') && !x.startsWith('adapter')))
    for (const [k, t] of decodeSafetensors(readFileSync(join(dir, f)), f).tensors)
      m.set(k, `${t.dtype}[${t.shape.join(',')}]`);
  return [...m].sort(([a], [b]) => a.localeCompare(b));
}
const quiet = async (argv: string[]) => {
  const write = process.stdout.write.bind(process.stdout);
  process.stdout.write = () => true;
  try {
    return await exportCommand.run(argv);
  } finally {
    process.stdout.write = write;
  }
};

describe('tensor layouts: model.* / visual.* and model.language_model.* / model.visual.*', () => {
  const nestedDir = join(tmp, 'nested');
  it('both load to the same weights; export writes the input layout, dtype (bf16) and shapes', async () => {
    nestedCopy(flatDir, nestedDir);
    const flat = await loadCheckpoint(flatDir),
      nested = await loadCheckpoint(nestedDir);
    assert.equal(flat.config.tensorLayout, undefined);
    assert.equal(nested.config.tensorLayout, 'nested');
    assert.equal(nested.config.storedDtype, 'bfloat16');
    for (const [k, a] of flat.weights) assert.deepEqual(nested.weights.get(k), a, k);
    for (const [src, name] of [
      [flatDir, 'flat-out'],
      [nestedDir, 'nested-out'],
    ] as const) {
      const out = join(tmp, name);
      assert.equal(await quiet([src, '--out', out]), 0);
      assert.deepEqual(header(out), header(src), `${name}: names, dtypes and shapes as the input`);
      assert.equal(JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')).torch_dtype, 'bfloat16');
    }
    assert.ok(header(nestedDir).some(([k]) => k.startsWith('model.language_model.layers.0.')));
    assert.ok(header(nestedDir).some(([k]) => k.startsWith('model.visual.blocks.0.')));
  });

  it('weights over the shard size are written as save_pretrained shards with the index; they load back with the same sha256', async () => {
    const nested = await loadCheckpoint(nestedDir);
    const out = join(tmp, 'sharded');
    const { weightsSha256 } = await saveCheckpoint(out, nested.config, nested.weights, {
      dtype: 'bfloat16',
      maxShardBytes: 4e6,
      assetsFrom: nestedDir,
    });
    const shards = readdirSync(out).filter((f) => /^model-\d{5}-of-\d{5}\.safetensors$/.test(f));
    assert.ok(shards.length >= 2, shards.join());
    assert.deepEqual(header(out), header(nestedDir));
    const back = await loadCheckpoint(out);
    assert.equal(back.weightsSha256, weightsSha256);
    assert.equal(await checkpointSha256(out), weightsSha256);
    // the sha256 of a version kept in memory only: the same bytes hashed without writing them
    assert.equal(
      checkpointWeightsSha256(nested.config, nested.weights, { dtype: 'bfloat16', maxShardBytes: 4e6 }),
      weightsSha256,
    );
    const one = await saveCheckpoint(`${out}-one`, nested.config, nested.weights, { dtype: 'bfloat16' });
    assert.equal(checkpointWeightsSha256(nested.config, nested.weights, { dtype: 'bfloat16' }), one.weightsSha256);
    for (const [k, a] of nested.weights) assert.deepEqual(back.weights.get(k), a, k);
  });

  for (const layout of ['flat', 'nested'] as const) {
    it(`${layout}: a tower adapter has PEFT's names, a target_modules regex naming exactly its modules, loads back and merges in export`, async () => {
      const dir = layout === 'flat' ? flatDir : nestedDir;
      const ck = await loadCheckpoint(dir);
      const ad = initLora(ck.config, lora, 5);
      for (const [k, v] of ad) if (k.endsWith('lora_B.weight')) v.forEach((_, i) => (v[i] = 0.01 * ((i % 7) - 3)));
      const adDir = join(tmp, `adapter-${layout}`);
      await saveAdapter(adDir, ck.config, lora, ad, { basePath: dir });
      const names = [...decodeSafetensors(readFileSync(join(adDir, 'adapter_model.safetensors')), 'a').tensors.keys()];
      const p = layout === 'flat' ? 'base_model.model.' : 'base_model.model.model.';
      assert.ok(names.includes(`${p}visual.blocks.0.attn.qkv.lora_A.weight`), names.slice(0, 3).join());
      assert.ok(
        names.includes(
          layout === 'flat'
            ? 'base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight'
            : 'base_model.model.model.language_model.layers.1.self_attn.q_proj.lora_B.weight',
        ),
      );
      // PEFT full-matches a string target_modules against module paths: exactly the adapted ones
      const tm = JSON.parse(readFileSync(join(adDir, 'adapter_config.json'), 'utf8')).target_modules as string;
      assert.equal(tm, peftTargetModules(lora, ck.config));
      const re = new RegExp(`^(?:${tm})$`);
      const adapted = new Set(
        loraSpecs(ck.config, lora).map((s) => hfName(layout, s.name.replace(/\.lora_[AB]\.weight$/, ''))),
      );
      for (const m of [
        ...linearModules(layout),
        hfName(layout, 'visual.patch_embed.proj'),
        hfName(layout, 'visual.merger.mlp.0'),
      ])
        assert.equal(re.test(m), adapted.has(m), m);
      const back = await loadAdapter(adDir, ck.config, { expect: lora });
      assert.deepEqual(back.lora.visionModules, ['qkv', 'proj', 'gate_proj', 'up_proj', 'down_proj']);
      for (const [k, v] of ad) assert.deepEqual(back.adapter.get(k), v, k);
      // export --merge: the base's names, dtype and shapes; W + s·B·A in them
      const out = join(tmp, `merged-${layout}`);
      assert.equal(await quiet([adDir, '--merge', '--out', out]), 0);
      assert.deepEqual(header(out), header(dir));
      const m = await loadCheckpoint(out);
      const want = mergeLora(ck.config, lora, ck.weights, ad).get('visual.blocks.0.mlp.gate_proj.weight')!;
      assert.ok(maxAbs(m.weights.get('visual.blocks.0.mlp.gate_proj.weight')!, want) < 1e-2, 'merged, bf16-rounded');
      assert.ok(
        maxAbs(
          m.weights.get('visual.blocks.0.mlp.gate_proj.weight')!,
          ck.weights.get('visual.blocks.0.mlp.gate_proj.weight')!,
        ) > 1e-3,
      );
    });
  }

  it("PEFT's own suffix-list adapter (target_modules [gate_proj, …] adapts the tower MLP too) loads with its tower modules", async () => {
    const ck = await loadCheckpoint(flatDir);
    const l = loraConfig({ rank: 2, alpha: 4, targetModules: ['gate_proj'], visionTargetModules: ['gate_proj'] });
    const adDir = join(tmp, 'adapter-suffix');
    await saveAdapter(adDir, ck.config, l, initLora(ck.config, l, 1), { basePath: flatDir });
    const cfgFile = join(adDir, 'adapter_config.json');
    writeFileSync(
      cfgFile,
      JSON.stringify({ ...JSON.parse(readFileSync(cfgFile, 'utf8')), target_modules: ['gate_proj'] }),
    );
    const back = await loadAdapter(adDir, ck.config);
    assert.deepEqual([back.lora.targetModules, back.lora.visionModules], [['gate_proj'], ['gate_proj']]);
  });
});
