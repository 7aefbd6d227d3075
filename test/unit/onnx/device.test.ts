/**
 * actor.device: the CUDA execution provider is a separate download that `npm ci` skips here, so
 * asking for it must stop the run at start with what to do, not fail deep inside a stage.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { checkDevice, createSession, cudaProviderMissing, ortBinaryDir } from '../../../lib/onnx/runtime.ts';
import { GraphBuilder } from '../../../lib/onnx/builder.ts';
import { ConfigError } from '../../../lib/errors.ts';
import { loadConfig } from '../../../lib/config/index.ts';
import { initWeights, modelConfig } from '../../../lib/model/index.ts';
import { Sampler } from '../../../lib/model/sample.ts';
import { Scorer } from '../../../lib/model/score.ts';
import { ValueScorer } from '../../../lib/model/value.ts';
import { createTrainer } from '../../../lib/model/train.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';

const EXAMPLE = join(import.meta.dirname, '../../../examples/number-game.yaml');
const CUDA_LIB = process.platform === 'win32' ? 'onnxruntime_providers_cuda.dll' : 'libonnxruntime_providers_cuda.so';

test('ortBinaryDir finds the directory holding the native binding', () => {
  const dir = ortBinaryDir();
  assert.ok(dir, 'onnxruntime-node binary directory not found');
  assert.match(dir!, /napi-v\d+/);
});

test('cudaProviderMissing: without the CUDA provider library the message names the fix', () => {
  const empty = mkdtempSync(join(tmpdir(), 'rl-ort-'));
  try {
    const why = cudaProviderMissing('actor.device', empty);
    assert.ok(why);
    assert.match(why!, /actor\.device=cuda/);
    assert.match(why!, /ONNXRUNTIME_NODE_INSTALL=cuda12 node node_modules\/onnxruntime-node\/script\/install\.js/);
    assert.match(why!, /actor\.device=cpu/);
    writeFileSync(join(empty, CUDA_LIB), '');
    assert.equal(cudaProviderMissing('actor.device', empty), null, 'present: nothing missing (ORT loads it later)');
  } finally {
    rmSync(empty, { recursive: true, force: true });
  }
});

test('checkDevice: cpu passes; a device that cannot start here is a ConfigError naming the setting', async () => {
  await checkDevice('cpu');
  for (const device of ['cuda', 'webgpu'] as const) {
    let started = true;
    try {
      await checkDevice(device, 'rollout.device');
    } catch (e) {
      started = false;
      assert.ok(e instanceof ConfigError, String(e));
      assert.equal(e.retriable, false);
      assert.match(e.message, new RegExp(`^rollout\\.device=${device}: `));
      assert.match(e.message, device === 'cuda' ? /ONNXRUNTIME_NODE_INSTALL=cuda12/ : /Vulkan/);
      assert.match(e.message, /set rollout\.device=cpu/);
    }
    if (started) console.log(`# ${device} starts on this machine`);
  }
});

test('config: actor.device defaults to cpu and rejects other providers with the valid ones', () => {
  assert.equal(loadConfig({ file: EXAMPLE }).actor.device, 'cpu');
  assert.equal(loadConfig({ file: EXAMPLE, overrides: ['actor.device=cuda'] }).actor.device, 'cuda');
  assert.throws(
    () => loadConfig({ file: EXAMPLE, overrides: ['actor.device=gpu'] }),
    /actor\.device[\s\S]*cpu[\s\S]*cuda[\s\S]*webgpu/,
  );
  const split = loadConfig({ file: EXAMPLE, overrides: ['actor.device=webgpu', 'rollout.device=cpu'] });
  assert.deepEqual([split.actor.device, split.rollout.device], ['webgpu', 'cpu']);
  assert.equal(loadConfig({ file: EXAMPLE }).rollout.device, null, 'rollout.device defaults to actor.device');
});

test(
  'createSession on cuda where the provider is missing: a ConfigError with the install advice',
  { skip: cudaProviderMissing() === null ? 'the CUDA execution provider is installed here' : false },
  async () => {
    const b = new GraphBuilder({ name: 'neg', float: 'float32' });
    b.output(b.neg(b.input('x', 'float32', [2])), 'y');
    await assert.rejects(createSession(b.toBytes(), { device: 'cuda' }), (e: unknown) => {
      assert.ok(e instanceof ConfigError, String(e));
      assert.match(e.message, /CUDA execution provider/);
      assert.match(e.message, /ONNXRUNTIME_NODE_INSTALL=cuda12/);
      return true;
    });
  },
);

test(
  'every model session (sampling, scoring, values, training) is created on the requested device',
  { skip: cudaProviderMissing() === null ? 'the CUDA execution provider is installed here' : false },
  async () => {
    // where the provider is missing, reaching ORT with device cuda is what fails: so each of these
    // failing with the CUDA advice shows the device option reached its session
    const base = {
      hiddenSize: 16,
      intermediateSize: 24,
      numHiddenLayers: 1,
      numAttentionHeads: 2,
      numKeyValueHeads: 1,
      vocabSize: 12,
      maxPositionEmbeddings: 16,
      bosTokenId: 1,
      eosTokenId: 2,
      padTokenId: 0,
    };
    const model = modelConfig(base);
    const critic = modelConfig({ ...base, head: 'value' });
    const w = initWeights(model, 1);
    const cache = new SessionCache();
    const cudaAdvice = (e: unknown) => e instanceof ConfigError && /CUDA execution provider/.test(e.message);
    const req = [{ prompt: [1, 3, 4], response: [5, 6] }];
    await assert.rejects(
      new Sampler(model, { device: 'cuda', cache }).generate(w, [{ id: 'a', prompt: [1, 3] }], { maxNewTokens: 2 }),
      cudaAdvice,
    );
    await assert.rejects(new Scorer(model, { device: 'cuda', cache }).score(w, req), cudaAdvice);
    await assert.rejects(
      new ValueScorer(critic, { device: 'cuda', cache }).values(initWeights(critic, 1), req),
      cudaAdvice,
    );
    const trainer = createTrainer({ model, loss: { type: 'policy' }, device: 'cuda', cache, seed: 1 });
    await assert.rejects(
      trainer.step(
        {
          batchSize: 1,
          seqLen: 4,
          tokens: Int32Array.from([1, 3, 5, 6]),
          responseMask: Float32Array.from([0, 0, 1, 1]),
          advantages: new Float32Array(4).fill(1),
          oldLogprobs: new Float32Array(4),
        },
        1e-3,
      ),
      cudaAdvice,
    );
    // the same calls on cpu work (the options are not otherwise broken)
    assert.equal((await new Scorer(model, { device: 'cpu', cache }).score(w, req))[0]!.logprobs.length, 2);
  },
);
