/**
 * LoRA end to end: `rlstream train` with actor.model.lora on a small Hugging Face Qwen3 directory
 * (the real tokenizer) trains two GRPO steps with the KL loss; the reference log-probs are the
 * base model's (adapters off); every policy version and the checkpoint's actor/ carry only the
 * adapter in PEFT layout (version 0: B = 0); and `rlstream export --merge` of the checkpoint
 * reloads to the log-probs of base + adapter; killed half-way through an adapter version's write,
 * the same command resumes to the undisturbed checkpoint. About 45 s on 2 cores.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { fromHfConfig } from '../../lib/model/config.ts';
import { initWeights } from '../../lib/model/init.ts';
import { paramSpecs } from '../../lib/model/params.ts';
import { loadAdapter, loadCheckpoint } from '../../lib/model/checkpoint.ts';
import { loraConfig } from '../../lib/model/lora.ts';
import { mergeLoraOnnx } from '../../lib/model/lora-merge.ts';
import { decodeSafetensors } from '../../lib/model/safetensors.ts';
import { Scorer } from '../../lib/model/score.ts';
import { openStore } from '../../lib/store/index.ts';
import { policyModelConfig, tokenizerFor } from '../../lib/pipeline/policy.ts';
import { sha256File } from '../../lib/policy-store/hash.ts';
import { spawnCli } from '../support/chaos-procs.ts';
import {
  writeHfModelDir,
  tinyQwen3Config,
  QWEN3_GENERATION_IDS,
  QWEN3_TOKENIZER_DIR,
  writeArithmeticJsonl,
  hfGrpoOverrides,
} from '../support/hf-model-dir.ts';

const ROOT = join(import.meta.dirname, '../..');
const RUN_ID = 'e2e-lora';
const tmp = join(ROOT, 'test/.tmp', `lora-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

const config = tinyQwen3Config();
const generation = QWEN3_GENERATION_IDS;

const cli = (...args: string[]): string =>
  execFileSync(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), ...args], { encoding: 'utf8', cwd: ROOT });

test(
  'rlstream train with actor.model.lora: PEFT adapters as policy versions, the base as reference, export --merge',
  { timeout: 300_000 },
  async () => {
    const src = join(tmp, 'Qwen3-tiny');
    const c0 = fromHfConfig(config);
    writeHfModelDir(src, {
      config,
      generation,
      tensors: paramSpecs(c0).map((s) => [s.name, s.shape]),
      weights: initWeights(c0, 5, { std: 0.1 }),
      dtype: 'float32',
      tokenizerFrom: QWEN3_TOKENIZER_DIR,
    });
    const base = await loadCheckpoint(src, { optimizer: false });
    mkdirSync(tmp, { recursive: true });
    const data = join(tmp, 'train.jsonl');
    writeArithmeticJsonl(data);
    const runDir = join(tmp, 'run');
    const overrides = (dir: string) =>
      hfGrpoOverrides({ data, model: src, runDir: dir, runId: RUN_ID }, [
        'algorithm.use_kl_loss=true',
        'algorithm.kl_coef=0.1',
        'actor.model.lora={rank: 4, alpha: 8, target_modules: all-linear}',
        'actor.optim.lr=5e-2',
        // an entropy bonus: a gradient whatever the rewards (a random policy's exact-match rewards are all 0, so its GRPO advantages are too)
        'actor.entropy_coeff=0.01',
      ]);
    const cfg = loadConfig({ overrides: overrides(runDir) });
    const t0 = Date.now();
    const run = await trainEmbedded(cfg, silentLogger(RUN_ID));
    assert.equal(run.status, 'completed', run.message);
    console.log(`  undisturbed run ${((Date.now() - t0) / 1000).toFixed(1)} s`);

    // ── killed half-way through writing step 2's adapter version (hits 1 and 2: versions 0 and 1),
    // the same command resumes at step 1 from the run's start (re-training step 1 from the log) and
    // ends with the undisturbed checkpoint
    const killedDir = join(tmp, 'killed');
    const killed = spawnCli(['train', ...overrides(killedDir)], { RLSTREAM_CRASH_AT: 'update:version-half-written@3' });
    assert.equal((await killed.exit).signal, 'SIGKILL', killed.output().slice(-3000));
    assert.match(killed.output(), /SIGKILL at update:version-half-written@3 policy 2/);
    const resumed = spawnCli(['train', ...overrides(killedDir)]);
    assert.equal((await resumed.exit).code, 0, resumed.output().slice(-3000));
    console.log(
      `  killed run ${((resumed.startedAt - killed.startedAt) / 1000).toFixed(1)} s, resumed run ${((Date.now() - resumed.startedAt) / 1000).toFixed(1)} s`,
    );
    assert.match(resumed.output(), /re-trained steps 1–1 from the update stage's input log/);
    assert.equal(
      await sha256File(join(killedDir, 'checkpoints/global_step_2/actor/adapter_model.safetensors')),
      await sha256File(join(runDir, 'checkpoints/global_step_2/actor/adapter_model.safetensors')),
      'the resumed LoRA run ends with the undisturbed checkpoint',
    );
    const lora = loraConfig({ rank: 4, alpha: 8, targetModules: 'all-linear' });

    // ── policy versions: the adapter only, PEFT layout
    const v0 = join(runDir, 'policy', 'v000000'),
      v2 = join(runDir, 'policy', 'v000002');
    for (const v of [v0, v2]) {
      assert.ok(
        existsSync(join(v, 'adapter_config.json')) && existsSync(join(v, 'adapter_model.safetensors')),
        `${v} is a PEFT adapter`,
      );
      assert.ok(
        !existsSync(join(v, 'model.safetensors')) && !existsSync(join(v, 'config.json')),
        `${v} carries no base weights`,
      );
    }
    const names = [...decodeSafetensors(readFileSync(join(v2, 'adapter_model.safetensors'))).tensors.keys()];
    assert.ok(
      names.includes('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight') &&
        names.includes('base_model.model.model.layers.1.mlp.down_proj.lora_B.weight'),
    );
    assert.equal(names.length, 2 * 7 * 2);
    const pc = JSON.parse(readFileSync(join(v2, 'adapter_config.json'), 'utf8'));
    assert.deepEqual([pc.peft_type, pc.r, pc.lora_alpha, pc.base_model_name_or_path], ['LORA', 4, 8, src]);
    const a0 = await loadAdapter(v0, base.config),
      a2 = await loadAdapter(v2, base.config, { optimizer: false });
    // a version holds the adapter only; the adapters' AdamW state is in the checkpoint
    assert.ok(!existsSync(join(v2, 'optimizer.safetensors')), 'a policy version holds no optimizer state');
    const ck2 = await loadAdapter(join(runDir, 'checkpoints', 'global_step_2', 'actor'), base.config, {
      optimizer: true,
    });
    assert.equal(ck2.weightsSha256, a2.weightsSha256, "the checkpoint's adapter is version 2's");
    assert.ok(
      [...a0.adapter].every(([k, w]) => !k.endsWith('lora_B.weight') || w.every((x) => x === 0)),
      'version 0: B = 0 (the base policy)',
    );
    assert.ok(
      [...a2.adapter].some(([k, w]) => k.endsWith('lora_B.weight') && w.some((x) => x !== 0)),
      'two steps trained the adapters',
    );
    assert.ok(
      ck2.optimizer && ck2.optimizer.step > 0 && ck2.optimizer.expAvg.size === 28,
      'AdamW state for the adapters only',
    );
    const bytes = readdirSync(v2)
      .filter((f) => f.endsWith('.safetensors') && f !== 'optimizer.safetensors')
      .reduce((s, f) => s + statSync(join(v2, f)).size, 0);
    assert.ok(
      bytes < 0.01 * statSync(join(src, 'model.safetensors')).size,
      `a policy version's weights are ${bytes} bytes`,
    );

    // ── the reference log-probs are the base model's (adapters off)
    // the run's model config (its sampling mask applies to every distribution)
    const scorer = new Scorer(policyModelConfig(cfg, tokenizerFor(cfg)), { threads: 2 });
    const store = await openStore({ kind: 'pglite', dir: join(runDir, 'db') });
    try {
      const trajs = (await store.getTrajectories(RUN_ID)).filter((t) => t.refLogprobs && t.refLogprobs.length);
      assert.ok(trajs.length >= 8, `${trajs.length} trajectories with reference log-probs`);
      const t = trajs.find((x) => x.step === 2) ?? trajs[trajs.length - 1];
      const [ref] = await scorer.score(base.weights, [{ prompt: t.promptTokens, response: t.responseTokens }], {
        temperature: cfg.rollout.temperature,
        entropy: false,
      });
      Array.from(t.refLogprobs!).forEach((lp, i) =>
        assert.ok(Math.abs(lp - ref.logprobs[i]) < 1e-5, `ref logprob ${i}: ${lp} vs base ${ref.logprobs[i]}`),
      );
    } finally {
      await store.close();
    }

    // ── the checkpoint carries the adapter; export --merge reloads to base + adapter's log-probs
    const ckptDir = join(runDir, 'checkpoints', 'global_step_2');
    assert.ok(
      existsSync(join(ckptDir, 'actor', 'adapter_model.safetensors')) &&
        existsSync(join(ckptDir, 'actor', 'adapter_config.json')),
    );
    const out = join(tmp, 'merged');
    assert.match(cli('export', ckptDir, '--merge', '--out', out), /merged .*LoRA rank 4/);
    const merged = await loadCheckpoint(out);
    assert.ok(!existsSync(join(out, 'optimizer.safetensors')) && existsSync(join(out, 'tokenizer.json')));
    const reqs = [
      { prompt: [151644, 872, 198, 17, 488, 18], response: [20, 151645] },
      { prompt: [9707, 11], response: [1879, 0, 13] },
    ];
    const viaExport = await scorer.score(merged.weights, reqs, { entropy: false });
    const viaAdapter = await scorer.score(await mergeLoraOnnx(base.config, lora, base.weights, a2.adapter), reqs, {
      entropy: false,
    });
    viaExport.forEach((r, i) =>
      assert.deepEqual(
        Array.from(r.logprobs),
        Array.from(viaAdapter[i].logprobs),
        `row ${i}: merged export = base + adapter`,
      ),
    );
    const viaBase = await scorer.score(base.weights, reqs, { entropy: false });
    // generate reads the adapter checkpoint (merged into its base): its greedy answer scores as base + adapter
    const g = JSON.parse(
      cli('generate', ckptDir, '--prompt', 'Hello', '--max-new-tokens', '3', '--temperature', '0', '--json')
        .trim()
        .split('\n')
        .at(-1)!,
    );
    // (generate scores with the directory's own config, as `rlstream generate` on any model directory)
    const [gref] = await new Scorer(merged.config, { threads: 2 }).score(
      merged.weights,
      [{ prompt: g.prompt_ids, response: g.response_ids }],
      { entropy: false },
    );
    g.logprobs.forEach((lp: number, i: number) =>
      assert.ok(Math.abs(lp - gref.logprobs[i]) < 1e-4, `adapter greedy logprob ${i}: ${lp} vs ${gref.logprobs[i]}`),
    );
    assert.ok(
      viaExport.some((r, i) => r.logprobs.some((x, j) => Math.abs(x - viaBase[i].logprobs[j]) > 1e-4)),
      'the merged model is not the base',
    );
  },
);
