/**
 * The generation-engine contract (test/support/engine-contract.ts) against both adapters: onnx
 * (the in-process sampler) and openai (serve-policy over HTTP, reloading versions by request);
 * then the openai adapter's failover and retries.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { Sampler } from '../../../lib/model/sample.ts';
import { OnnxEngine } from '../../../lib/inference/onnx-engine.ts';
import { OpenAIEngine, type OpenAIEngineOptions } from '../../../lib/inference/openai-engine.ts';
import { openServedPolicy } from '../../../lib/inference/served-policy.ts';
import { startPolicyServer, type PolicyServer } from '../../../lib/inference/policy-server.ts';
import { policyDir, tokenizerFor } from '../../../lib/pipeline/policy.ts';
import { RlError } from '../../../lib/errors.ts';
import { makePolicyRunDir, type PolicyRunDir } from '../../support/policy-run-dir.ts';
import { engineContract, enginePolicy, type EngineFixture } from '../../support/engine-contract.ts';

const dir = join(import.meta.dirname, '../../.tmp', `engine-contract-${process.pid}`);
let run: PolicyRunDir;
let server: PolicyServer;
let onnx: EngineFixture;
let openai: EngineFixture;
const engines: Array<{ close(): Promise<void> }> = [];

async function serve(port = 0): Promise<PolicyServer> {
  const { policy, initial } = await openServedPolicy(dir, { name: 'policy' });
  return startPolicyServer({ policy, initial, port, followMs: 0, batchWindowMs: 2 });
}

const opts = (urls: string[]): OpenAIEngineOptions => ({
  urls,
  model: null,
  timeoutMs: 5000,
  maxRetries: 3,
  concurrencyPerServer: 64,
  cooldownMs: 200,
  reload: true,
  sleep: () => new Promise((r) => setTimeout(r, 5)),
});

before(async () => {
  run = await makePolicyRunDir(dir);
  const w1 = await run.writeVersion(1, 21);
  server = await serve();
  const tok = tokenizerFor(run.cfg);
  const base = {
    model: run.model,
    versions: new Map([
      [0, { weights: run.weights, dir: policyDir(dir, 0) }],
      [1, { weights: w1, dir: policyDir(dir, 1) }],
    ]),
    vocabSize: run.model.vocabSize,
    prompts: ['3 7 1:', '0 2 9:', '5 5 4:'].map((s) => Array.from(tok.encode(s, { addSpecialTokens: true }))),
  };
  onnx = { ...base, engine: new OnnxEngine(new Sampler(run.model)) };
  const e = new OpenAIEngine(opts([server.url]));
  engines.push(e);
  openai = { ...base, engine: e };
});
after(async () => {
  for (const e of engines) await e.close();
  await server?.close();
  rmSync(dir, { recursive: true, force: true });
});

engineContract('onnx', () => onnx);
engineContract('openai (serve-policy)', () => openai);

test('openai: a dead URL is skipped, a 4xx is final, an engine that comes back is used again', async () => {
  const reqs = openai.prompts.map((p, i) => ({ id: `f-${i}`, prompt: p }));
  const params = { temperature: 1, maxNewTokens: 2, seed: 1 };
  const want = await onnx.engine.generate(enginePolicy(onnx, 1), reqs, params);
  const failover = new OpenAIEngine(opts(['http://127.0.0.1:9', server.url]));
  engines.push(failover);
  const got = await failover.generate(enginePolicy(openai, 1), reqs, params);
  assert.deepEqual(
    got.map((g) => Array.from(g.tokens)),
    want.map((g) => Array.from(g.tokens)),
  );
  const wrong = new OpenAIEngine({ ...opts([server.url]), model: 'other' });
  engines.push(wrong);
  await assert.rejects(wrong.generate(enginePolicy(openai, 0), reqs, params), (e: unknown) => {
    assert.ok(e instanceof RlError && !e.retriable, String(e));
    assert.match((e as Error).message, /status 404/);
    return true;
  });
  // the engine goes away: a retriable error; back on the same port (version 0 loaded): it is told to load version 1 again
  const port = server.port;
  const solo = new OpenAIEngine(opts([server.url]));
  engines.push(solo);
  await solo.generate(enginePolicy(openai, 1), reqs, params);
  await server.close();
  await assert.rejects(solo.generate(enginePolicy(openai, 1), reqs, params), (e: unknown) => {
    assert.ok(e instanceof RlError && e.retriable, String(e));
    return true;
  });
  server = await serve(port);
  await new Promise((r) => setTimeout(r, 250)); // past the cool-down
  const back = await solo.generate(enginePolicy(openai, 1), reqs, params);
  assert.deepEqual(
    back.map((g) => Array.from(g.tokens)),
    want.map((g) => Array.from(g.tokens)),
  );
  assert.equal(server.version(), 1);
});
