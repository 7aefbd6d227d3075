/**
 * The contract of the generation-engine port (lib/inference/engine-port.ts), run against every
 * adapter: the in-process sampler and OpenAI-compatible servers give the rollout the same thing —
 * exactly the Sampler's draw for each (seed, sample id) and policy version.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Sampler, type Generation, type GenerationRequest, type SamplingParamsInput } from '../../lib/model/sample.ts';
import type { ModelConfig } from '../../lib/model/config.ts';
import type { Weights } from '../../lib/model/params.ts';
import type { EnginePolicy, GenerationEngine } from '../../lib/inference/engine-port.ts';

export interface EngineFixture {
  engine: GenerationEngine;
  model: ModelConfig;
  /** Weights of each version the engine can load, and their directories. */
  versions: Map<number, { weights: Weights; dir: string }>;
  vocabSize: number;
  prompts: number[][];
}

export function enginePolicy(f: EngineFixture, version: number): EnginePolicy {
  const v = f.versions.get(version)!;
  return { version, weights: async () => v.weights, dir: async () => v.dir };
}

export function engineContract(name: string, fixture: () => EngineFixture): void {
  const params: SamplingParamsInput = { temperature: 1, topP: 1, topK: 0, maxNewTokens: 3, seed: 5 };
  const requests = (f: EngineFixture, tag: string): GenerationRequest[] =>
    f.prompts.flatMap((p, i) => [0, 1, 2].map((k) => ({ id: `${tag}-${i}-${k}`, prompt: p })));
  const reference = (f: EngineFixture, v: number, reqs: GenerationRequest[], ps: SamplingParamsInput) =>
    new Sampler(f.model).generate(f.versions.get(v)!.weights, reqs, ps);
  const same = (got: Generation[], want: Generation[]) => {
    assert.equal(got.length, want.length);
    got.forEach((g, i) => {
      assert.equal(g.id, want[i].id);
      assert.deepEqual(Array.from(g.tokens), Array.from(want[i].tokens), `tokens of ${g.id}`);
      // the same draw; log-probs up to the float rounding of another batch composition
      g.logprobs.forEach((x, t) =>
        assert.ok(Math.abs(x - want[i].logprobs[t]) < 1e-5, `log-prob ${t} of ${g.id}: ${x} vs ${want[i].logprobs[t]}`),
      );
      assert.equal(g.finishReason, want[i].finishReason);
    });
  };

  test(`${name}: one generation per request, in order, the sampler's own draw`, async () => {
    const f = fixture();
    const reqs = requests(f, 'a');
    const got = await f.engine.generate(enginePolicy(f, 0), reqs, params);
    for (const g of got) {
      assert.ok(g.tokens.length >= 1 && g.tokens.length <= 3);
      assert.ok(g.tokens.every((t) => t >= 0 && t < f.vocabSize));
      assert.ok(g.logprobs.every((x) => Number.isFinite(x) && x <= 0));
    }
    same(got, await reference(f, 0, reqs, params));
    assert.deepEqual(await f.engine.generate(enginePolicy(f, 0), [], params), []);
  });

  test(`${name}: a new policy version is used once asked for, and an old one again`, async () => {
    const f = fixture();
    const reqs = requests(f, 'b');
    const greedy = { ...params, temperature: 0.7, topK: 4 };
    same(await f.engine.generate(enginePolicy(f, 1), reqs, greedy), await reference(f, 1, reqs, greedy));
    same(await f.engine.generate(enginePolicy(f, 0), reqs, greedy), await reference(f, 0, reqs, greedy));
  });
}
