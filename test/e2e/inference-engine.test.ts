/**
 * Rollouts through an inference engine: the number game trained a few steps with
 * `rollout.engine: openai` against `rlstream serve-policy` in another process (told to load each
 * policy version by update_weights_from_disk) samples exactly the trajectories `engine: onnx` does
 * with the same seed and run id, and logs a zero mismatch (f32 policy versions: the onnx sampler's
 * log-probs are the trainer's up to f32 rounding), although the engine is killed mid-run and
 * restarted (nothing lost, nothing sampled twice differently). A deliberately mismatched engine
 * (serve-policy --debug-temperature-scale 1.5) shows rollout/mismatch_kl > 0, and the
 * TIS metrics agree with an independent recomputation from the stored trajectories.
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig, type Config } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import type { StoredTrajectory } from '../../lib/store/port.ts';
import { loadCheckpoint } from '../../lib/model/checkpoint.ts';
import { Scorer } from '../../lib/model/score.ts';
import { policyDir, policyModelConfig, tokenizerFor } from '../../lib/pipeline/policy.ts';
import { makePolicyRunDir } from '../support/policy-run-dir.ts';
import { spawnCli, killHard, type CliProc } from '../support/chaos-procs.ts';

const ROOT = join(import.meta.dirname, '../..');
const RUN_ID = 'e2e-inference-engine';
const tmp = join(ROOT, 'test/.tmp', `inference-engine-${process.pid}`);
const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const MODEL = ['trainer.val_before_train=false', 'trainer.save_freq=-1'];
const procs: CliProc[] = [];
let exact = '';
let exactProc: CliProc;
let mismatched = '';

after(async () => {
  for (const p of procs) await killHard(p);
  rmSync(tmp, { recursive: true, force: true });
});

async function serve(args: string[], dir = 'serve'): Promise<{ url: string; proc: CliProc }> {
  const p = spawnCli([
    'serve-policy',
    join(tmp, dir),
    '--port',
    '0',
    '--follow-ms',
    '0',
    '--served-model-name',
    'policy',
    ...args,
  ]);
  procs.push(p);
  assert.ok(await p.waitFor(/serving policy .* at http:\/\/\S+/, 60_000), p.output());
  return { url: /at (http:\/\/\S+)/.exec(p.output())![1], proc: p };
}

before(async () => {
  await makePolicyRunDir(join(tmp, 'serve'), MODEL, CONFIG);
  const [exactServer, other] = await Promise.all([serve([]), serve(['--debug-temperature-scale', '1.5'])]);
  mismatched = other.url;
  exact = exactServer.url;
  exactProc = exactServer.proc;
});

function config(name: string, extra: string[]): Config {
  return loadConfig({
    file: CONFIG,
    overrides: [...MODEL, `trainer.run_dir=${join(tmp, name)}`, `pipeline.run_id=${RUN_ID}`, ...extra],
  });
}

/** The number game as examples/number-game.yaml trains it, for `steps` steps with validation at 0 and at the end. */
function numberGame(name: string, steps: number, extra: string[]): Config {
  return loadConfig({
    file: join(ROOT, 'examples/number-game.yaml'),
    overrides: [
      `trainer.max_steps=${steps}`,
      `trainer.val_freq=${steps}`,
      'trainer.save_freq=-1',
      `trainer.run_dir=${join(tmp, name)}`,
      'pipeline.run_id=e2e-number-game',
      ...extra,
    ],
  });
}

async function trajectories(
  name: string,
  runId = RUN_ID,
): Promise<{ trajs: StoredTrajectory[]; metric: (n: string) => number[] }> {
  const store = await openStore({ kind: 'pglite', dir: join(tmp, name, 'db') });
  try {
    const trajs = (await store.getTrajectories(runId, { kind: 'train' })).sort((a, b) => (a.id < b.id ? -1 : 1));
    const ms = await store.getMetrics(runId);
    const metric = (n: string) =>
      ms
        .filter((m) => m.name === n)
        .sort((a, b) => a.step - b.step)
        .map((m) => m.value);
    return { trajs, metric };
  } finally {
    await store.close();
  }
}

test(
  'engine: openai against serve-policy samples the same trajectories as engine: onnx, through an engine kill',
  { timeout: 300_000 },
  async () => {
    const steps = 'trainer.max_steps=2';
    // the engine is SIGKILLed when the run first tells it to load a version (step 1 is about to
    // sample) and restarted on its port; the rollout retries until it is back
    const chaos = (async () => {
      assert.ok(await exactProc.waitFor(/serving policy version 0\b/, 120_000), exactProc.output());
      await killHard(exactProc);
      return serve(['--port', new URL(exact).port]);
    })();
    const [a, b] = await Promise.all([
      trainEmbedded(config('onnx', [steps]), silentLogger(RUN_ID)),
      trainEmbedded(
        config('openai', [steps, 'rollout.engine=openai', `rollout.openai.urls=[${exact}]`]),
        silentLogger(RUN_ID),
      ),
    ]);
    assert.equal(a.status, 'completed', a.message);
    assert.equal(b.status, 'completed', b.message);
    const restarted = await chaos;
    assert.equal(restarted.url, exact);
    assert.match(restarted.proc.output(), /serving policy version 1\b/, 'the restarted engine served the run');
    const A = await trajectories('onnx');
    const B = await trajectories('openai');
    assert.equal(A.trajs.length, 2 * 4 * 4);
    assert.deepEqual(
      B.trajs.map((t) => [t.id, t.step, t.policyVersion]),
      A.trajs.map((t) => [t.id, t.step, t.policyVersion]),
    );
    B.trajs.forEach((t, i) => {
      assert.deepEqual(t.responseTokens, A.trajs[i].responseTokens, `response of ${t.id}`);
      t.behaviourLogprobs.forEach((x, k) => assert.ok(Math.abs(x - A.trajs[i].behaviourLogprobs[k]) < 1e-4, `${t.id}`));
    });
    assert.deepEqual(B.metric('reward/mean'), A.metric('reward/mean'));
    for (const kl of B.metric('rollout/mismatch_kl')) assert.ok(kl < 1e-6, `exact engine: mismatch KL ${kl}`);
    // policy.dtype f32: the onnx sampler's log-probs are the trainer's up to f32 rounding (~1e-7)
    const gaps = A.metric('rollout/logprob_mismatch_abs_max');
    assert.equal(gaps.length, 2);
    for (const g of gaps) assert.ok(g < 1e-5, `f32 versions: max |Δ log-prob| ${g}`);
  },
);

test(
  'a mismatched engine: mismatch KL > 0 and TIS metrics an independent computation reproduces',
  { timeout: 300_000 },
  async () => {
    const cfg = config('mismatch', [
      'trainer.max_steps=1',
      'rollout.engine=openai',
      `rollout.openai.urls=[${mismatched}]`,
      'algorithm.rollout_correction.mode=tis',
      'algorithm.rollout_correction.threshold=1.2',
    ]);
    const out = await trainEmbedded(cfg, silentLogger(RUN_ID));
    assert.equal(out.status, 'completed', out.message);
    const { trajs, metric } = await trajectories('mismatch');
    const kl = metric('rollout/mismatch_kl')[0];
    assert.ok(kl > 1e-3, `mismatch KL ${kl}`);
    // independent: the trainer's log-probs of step 1 are version 0's at rollout.temperature
    const model = policyModelConfig(cfg, tokenizerFor(cfg));
    const v0 = await loadCheckpoint(policyDir(cfg.trainer.run_dir!, 0), { optimizer: false });
    const scores = await new Scorer(model).score(
      v0.weights,
      trajs.map((t) => ({ prompt: t.promptTokens, response: t.responseTokens })),
      { temperature: cfg.rollout.temperature, entropy: false },
    );
    let n = 0,
      k3 = 0,
      w = 0,
      cut = 0;
    trajs.forEach((t, i) =>
      t.behaviourLogprobs.forEach((b, k) => {
        const r = Math.exp(scores[i].logprobs[k]) / Math.exp(b);
        k3 += r - 1 - Math.log(r);
        w += Math.min(r, 1.2);
        cut += r > 1.2 ? 1 : 0;
        n++;
      }),
    );
    assert.ok(Math.abs(kl - k3 / n) < 1e-4, `mismatch KL ${kl} vs ${k3 / n}`);
    assert.ok(Math.abs(metric('rollout/is_weight_mean')[0] - w / n) < 1e-4);
    assert.ok(Math.abs(metric('rollout/is_weight_clipped_frac')[0] - cut / n) < 1e-3);
    assert.ok(cut > 0, 'some weights were truncated');
  },
);

test(
  'the number game trains through serve-policy (engine: openai) to the validation accuracy engine: onnx reaches',
  { timeout: 300_000 },
  async () => {
    // 10 steps (the cosine lr schedule ending at step 10) take val/accuracy from ≈ 0 to ≈ 0.45
    const steps = 10;
    await makePolicyRunDir(join(tmp, 'serve-ng'), ['trainer.save_freq=-1']);
    const engine = await serve([], 'serve-ng');
    const [a, b] = await Promise.all([
      trainEmbedded(numberGame('ng-onnx', steps, []), silentLogger('e2e-number-game')),
      trainEmbedded(
        numberGame('ng-openai', steps, ['rollout.engine=openai', `rollout.openai.urls=[${engine.url}]`]),
        silentLogger('e2e-number-game'),
      ),
    ]);
    assert.equal(a.status, 'completed', a.message);
    assert.equal(b.status, 'completed', b.message);
    const A = await trajectories('ng-onnx', 'e2e-number-game');
    const B = await trajectories('ng-openai', 'e2e-number-game');
    const accA = A.metric('val/accuracy'),
      accB = B.metric('val/accuracy');
    assert.equal(accA.length, 2, 'validated before training and after the last step');
    assert.ok(accA[0] < 0.1 && accA[1] > 0.3, `engine onnx learned: val accuracy ${accA}`);
    // the same seed samples the same trajectories, so every accuracy is the same number
    assert.deepEqual(accB, accA);
    assert.deepEqual(B.metric('reward/mean'), A.metric('reward/mean'));
  },
);
