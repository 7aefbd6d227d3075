/**
 * LoRA in the trainer: config errors are one line naming the key; a fresh adapter (B = 0) gives
 * the base's log-probs exactly; a step trains only the adapters (base arrays untouched, AdamW
 * state for the adapters only); the adapter path equals the merged weights W + s·B·A; adapters
 * off is the base model (the reference policy); adapters saved in PEFT layout load back, refuse a
 * base they do not fit, and `export --merge` writes the merged model.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { modelConfig } from '../../../lib/model/config.ts';
import { initWeights } from '../../../lib/model/init.ts';
import { initLora, loraConfig, loraSpecs, mergeLora } from '../../../lib/model/lora.ts';
import { cloneWeights, paramSpecs } from '../../../lib/model/params.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { createTrainer, type TrainBatch } from '../../../lib/model/train.ts';
import { Rng } from '../../../lib/util/rng.ts';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadAdapter, loadCheckpoint, saveAdapter, saveCheckpoint } from '../../../lib/model/checkpoint.ts';
import { decodeSafetensors } from '../../../lib/model/safetensors.ts';
import { exportCommand } from '../../../app/cli/commands/export.ts';
import { mergeLoraOnnx } from '../../../lib/model/lora-merge.ts';

const model = modelConfig({
  modelType: 'qwen2',
  attentionBias: true,
  hiddenSize: 32,
  intermediateSize: 48,
  numHiddenLayers: 2,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  vocabSize: 13,
  maxPositionEmbeddings: 16,
  bosTokenId: 1,
  eosTokenId: 2,
  padTokenId: 0,
});
const cache = new SessionCache();
const lora = loraConfig({ rank: 4, alpha: 8, targetModules: 'all-linear' });

function batch(B: number, T: number, seed: number): TrainBatch {
  const rng = Rng.fromSeed(seed);
  const n = B * T;
  const tokens = new Int32Array(n),
    resp = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    tokens[i] = 3 + rng.int(model.vocabSize - 3);
    resp[i] = i % T >= 3 ? 1 : 0;
  }
  const f = (s: number, o = 0) => Float32Array.from({ length: n }, () => (rng.next() - 0.5) * s + o);
  return { batchSize: B, seqLen: T, tokens, responseMask: resp, advantages: f(2), oldLogprobs: f(0.6, -2.5) };
}

const maxAbs = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
};

describe('LoRA config', () => {
  it('rank 0, a target that matches no module and dropout ≠ 0 are one line naming the key', () => {
    assert.throws(
      () => loraConfig({ rank: 0, alpha: 16, targetModules: ['q_proj'] }, 'actor.model.lora'),
      /^ConfigError: actor\.model\.lora\.rank must be an integer ≥ 1[^\n]*$/,
    );
    assert.throws(
      () => loraConfig({ rank: 8, alpha: 16, targetModules: ['q_proj', 'qkv'] }, 'actor.model.lora'),
      (e: Error) =>
        /actor\.model\.lora\.target_modules: "qkv" matches no module/.test(e.message) &&
        e.message.includes('q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj') &&
        !e.message.includes('\n'),
    );
    assert.throws(
      () => loraConfig({ rank: 8, alpha: 16, dropout: 0.05, targetModules: 'all-linear' }, 'actor.model.lora'),
      /actor\.model\.lora\.dropout must be 0/,
    );
    assert.deepEqual(loraConfig({ rank: 8, alpha: 16, targetModules: ['v_proj', 'q_proj'] }).targetModules, [
      'q_proj',
      'v_proj',
    ]);
  });

  it('PEFT init: A ~ U(−1/√in, 1/√in), B = 0', () => {
    const w = initLora(model, lora, 3);
    const a = w.get('model.layers.0.mlp.down_proj.lora_A.weight')!; // in = ffn 48
    assert.equal(a.length, 4 * 48);
    const bound = 1 / Math.sqrt(48);
    assert.ok(a.every((v) => Math.abs(v) <= bound) && Math.max(...a.map(Math.abs)) > 0.8 * bound);
    assert.ok(w.get('model.layers.1.self_attn.k_proj.lora_B.weight')!.every((v) => v === 0));
  });
});

describe('LoRA trainer', () => {
  const base = initWeights(model, 7, { std: 0.2 });
  const loss = { type: 'policy' as const, useKlLoss: false };

  it('a fresh adapter (B = 0) gives log-probs identical to the base model', async () => {
    const full = createTrainer({ model, loss, weights: base, cache, threads: 1 });
    const ad = createTrainer({ model, loss, weights: base, lora, seed: 1, cache, threads: 1 });
    const b = batch(3, 9, 1);
    const e0 = await full.evaluate(b),
      e1 = await ad.evaluate(b);
    assert.deepEqual(e1.perToken, e0.perToken);
  });

  it('a step trains only the adapters; the adapter path equals the merged weights; adapters off is the base', async () => {
    const frozen = cloneWeights(base);
    const ad = createTrainer({
      model,
      loss,
      weights: base,
      lora,
      seed: 1,
      cache,
      threads: 1,
      optim: { weightDecay: 0.1 },
    });
    const b = batch(4, 9, 2);
    for (let k = 0; k < 3; k++) await ad.step(b, 1e-2);
    for (const s of paramSpecs(model))
      assert.deepEqual(base.get(s.name), frozen.get(s.name), `base ${s.name} is untouched`);
    const st = ad.getOptimizerState();
    assert.deepEqual(
      [...st.expAvg.keys()],
      loraSpecs(model, lora).map((s) => s.name),
      'AdamW state for the adapters only',
    );
    assert.ok(
      [...ad.getWeights().entries()].some(([k, v]) => k.endsWith('lora_B.weight') && v.some((x) => x !== 0)),
      'B moved',
    );
    const onAdapter = (await ad.evaluate(b)).perToken;
    const merged = mergeLora(model, lora, base, ad.getWeights());
    const viaMerge = (await createTrainer({ model, loss, weights: merged, cache, threads: 1 }).evaluate(b)).perToken;
    const viaBase = (await createTrainer({ model, loss, weights: base, cache, threads: 1 }).evaluate(b)).perToken;
    assert.ok(maxAbs(onAdapter, viaBase) > 1e-3, `the adapter changes the policy (${maxAbs(onAdapter, viaBase)})`);
    assert.ok(maxAbs(onAdapter, viaMerge) < 2e-5, `adapter path vs merged weights: ${maxAbs(onAdapter, viaMerge)}`);
    assert.deepEqual((await ad.evaluate(b, { adapters: false })).perToken, viaBase, 'adapters off = the base model');
    assert.ok(
      maxAbs(
        (await ad.mergedWeights()).get('model.layers.1.mlp.up_proj.weight')!,
        merged.get('model.layers.1.mlp.up_proj.weight')!,
      ) < 1e-6,
    );
  });

  it("the in-graph step (packed outputs, as on a GPU; with micro-batches) gives the in-place CPU step's adapters", async () => {
    const b = batch(4, 9, 3);
    const cpu = createTrainer({ model, loss, weights: base, lora, seed: 2, cache, threads: 1 });
    const packed = createTrainer({
      model,
      loss,
      weights: base,
      lora,
      seed: 2,
      cache,
      threads: 1,
      packOutputs: true,
      microBatchSize: 2,
    });
    for (let k = 0; k < 2; k++) {
      await cpu.step(b, 1e-2);
      await packed.step(b, 1e-2);
    }
    for (const [k, w] of cpu.getWeights()) assert.ok(maxAbs(packed.getWeights().get(k)!, w) < 1e-5, `${k} differs`);
    assert.deepEqual(
      [...packed.getOptimizerState().expAvgSq.keys()],
      loraSpecs(model, lora).map((s) => s.name),
    );
  });

  it('refuses adapter tensors that do not fit the model', () => {
    const bad = initLora(model, loraConfig({ rank: 2, alpha: 8, targetModules: 'all-linear' }), 1);
    assert.throws(
      () => createTrainer({ model, loss, weights: base, lora, adapter: bad, cache }),
      /LoRA rank 4 on q_proj.*lora_A\.weight has 64 values, expected shape \[4,32\]/,
    );
  });
});

describe('LoRA adapters on disk (PEFT layout) and export --merge', () => {
  it('saves PEFT names and config, loads back, refuses another base, and merges', async () => {
    const tmp = mkdtempSync(join(tmpdir(), 'rlstream-lora-'));
    try {
      const base = initWeights(model, 9, { std: 0.2 });
      const baseDir = join(tmp, 'base');
      await saveCheckpoint(baseDir, model, base);
      const l = loraConfig({ rank: 2, alpha: 4, targetModules: ['q_proj', 'down_proj'] });
      const trainer = createTrainer({
        model,
        loss: { type: 'policy' },
        weights: base,
        lora: l,
        seed: 4,
        cache,
        threads: 1,
      });
      await trainer.step(batch(3, 8, 5), 5e-2);
      const ad = join(tmp, 'adapter');
      await saveAdapter(ad, model, l, trainer.getWeights(), {
        basePath: baseDir,
        optimizer: trainer.getOptimizerState(),
        metadata: { policy_version: '1' },
      });
      assert.deepEqual(readdirSync(ad).sort(), [
        'adapter_config.json',
        'adapter_model.safetensors',
        'generation_config.json',
        'optimizer.safetensors',
      ]);
      const cfg = JSON.parse(readFileSync(join(ad, 'adapter_config.json'), 'utf8'));
      assert.equal(cfg.peft_type, 'LORA');
      assert.equal(cfg.r, 2);
      assert.equal(cfg.lora_alpha, 4);
      assert.deepEqual(cfg.target_modules, ['q_proj', 'down_proj']);
      assert.equal(cfg.base_model_name_or_path, baseDir);
      const names = [...decodeSafetensors(readFileSync(join(ad, 'adapter_model.safetensors'))).tensors.keys()];
      assert.ok(
        names.includes('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight') &&
          names.includes('base_model.model.model.layers.1.mlp.down_proj.lora_B.weight') &&
          names.length === 8,
        names.join(),
      );
      const back = await loadAdapter(ad, model, { expect: l });
      assert.deepEqual(back.adapter, trainer.getWeights());
      assert.equal(back.optimizer!.step, 1);
      assert.deepEqual(back.optimizer!.expAvg, trainer.getOptimizerState().expAvg);
      // another base: wider, so every adapter tensor's in/out differs
      const other = modelConfig({
        ...model,
        hiddenSize: 16,
        numAttentionHeads: 2,
        numKeyValueHeads: 1,
        headDim: undefined,
      });
      await assert.rejects(
        loadAdapter(ad, other),
        (e: Error) =>
          /lora_A\.weight has shape \[2,32\], the base model \(qwen2, 2 layers, hidden 16, ffn 48\) needs \[2,16\]; the adapter was trained on another base model/.test(
            e.message,
          ) && !e.message.includes('\n'),
      );
      await assert.rejects(
        loadAdapter(ad, model, { expect: loraConfig({ rank: 4, alpha: 4, targetModules: ['q_proj', 'down_proj'] }) }),
        /is not actor\.model\.lora \(rank 4/,
      );
      // export --merge: the merged HF model = W + s·B·A, loadable as a plain model
      const out = join(tmp, 'merged');
      await assert.rejects(exportCommand.run([ad, '--out', out]), /pass --merge/);
      assert.equal(await exportCommand.run([ad, '--merge', '--out', out]), 0);
      assert.ok(existsSync(join(out, 'config.json')) && existsSync(join(out, 'model.safetensors')));
      const m = await loadCheckpoint(out, { optimizer: false });
      assert.deepEqual(m.weights, await mergeLoraOnnx(model, l, base, trainer.getWeights()));
      const b = batch(2, 8, 6);
      const viaMerged = (
        await createTrainer({ model, loss: { type: 'policy' }, weights: m.weights, cache, threads: 1 }).evaluate(b)
      ).perToken;
      assert.ok(maxAbs(viaMerged, (await trainer.evaluate(b)).perToken) < 2e-5);
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  });
});

describe('LoRA merge in ORT', () => {
  it('equals the plain-JS merge to float32 rounding and shares the unadapted tensors', async () => {
    const base = initWeights(model, 2, { std: 0.2 });
    const l = loraConfig({ rank: 3, alpha: 12, targetModules: ['k_proj', 'o_proj', 'gate_proj'] });
    const ad = initLora(model, l, 7);
    const rng = Rng.fromSeed('merge');
    for (const [k, a] of ad)
      if (k.endsWith('lora_B.weight')) for (let i = 0; i < a.length; i++) a[i] = rng.next() - 0.5;
    const js = mergeLora(model, l, base, ad),
      ort = await mergeLoraOnnx(model, l, base, ad, { cache });
    let changed = 0;
    for (const [k, w] of js) {
      const d = maxAbs(ort.get(k)!, w);
      assert.ok(d < 1e-6, `${k}: ORT merge differs by ${d}`);
      if (w !== base.get(k)) changed++;
      else assert.equal(ort.get(k), base.get(k), `${k} is the base's array`);
    }
    assert.equal(changed, 3 * model.numHiddenLayers);
  });
});
