/**
 * The glyphs example at a tiny size (3 characters, 16×16): the standalone driver renders glyphs,
 * trains and exports the recogniser and learns a DiT by flow matching (SFT); then `rlstream train
 * examples/glyphs/glyphs.yaml` trains that model through the five stages with DiffusionNFT and
 * with Flow-GRPO (KL to v0, EMA on), each run SIGKILLed at the start of step 3 (after checkpoint
 * global_step_2: the restart starts the trainer and its AdamW state from it) and started again
 * with the same config: each ends on the uninterrupted run's final checkpoint sha256. `rlstream replay` of the Flow-GRPO run gives that sha256 too.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { runGlyphs } from '../../examples/glyphs/run.ts';
import { createSession } from '../../lib/onnx/runtime.ts';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { replayRun } from '../../app/replay.ts';
import { silentLogger } from '../../lib/log.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { deadline, killHard, selfKilledAt, spawnCli, type CliProc } from '../support/chaos-procs.ts';

const CONFIG = join(ROOT, 'examples/glyphs/glyphs.yaml');
const tmp = join(ROOT, 'test/.tmp', `glyphs-${process.pid}`);
const procs: CliProc[] = [];
after(async () => {
  for (const p of procs) await killHard(p);
  rmSync(tmp, { recursive: true, force: true });
});

const overrides = (assets: string, dir: string, runId: string, algo: string) => [
  `trainer.run_dir=${dir}`,
  `pipeline.run_id=${runId}`,
  `data.train_files=${join(assets, 'data.jsonl')}`,
  `data.val_files=${join(assets, 'data.jsonl')}`,
  `actor.model.path=${join(assets, 'model')}`,
  `reward.reward_fn_kwargs.recogniser=${join(assets, 'recogniser.onnx')}`,
  'data.rollout_batch_size=2',
  'rollout.n=4',
  'actor.global_batch_size=8',
  'actor.micro_batch_size_per_device_for_update=8',
  'actor.micro_batch_size_per_device_for_experience=8',
  'algorithm.image.steps=3',
  'algorithm.image.eval_steps=3',
  'trainer.max_steps=4',
  'trainer.val_freq=2',
  'trainer.save_freq=2',
  'actor.threads=1',
  `algorithm.policy_loss=${algo}`,
  ...(algo === 'flow_grpo'
    ? ['algorithm.use_kl_loss=true', 'algorithm.kl_coef=0.01', 'algorithm.ema.enable=true']
    : []),
];

/** `rlstream train args` SIGKILLed at crash point `spec` (it kills itself there). */
async function killedAt(args: string[], spec: string): Promise<void> {
  const p = spawnCli(args, { RLSTREAM_CRASH_AT: spec });
  procs.push(p);
  const done = await Promise.race([p.exit, deadline(120_000)]);
  if (!done) {
    await killHard(p);
    assert.fail(`rlstream train with ${spec} did not end:\n${p.output().slice(-3000)}`);
  }
  assert.equal(done.signal, 'SIGKILL', `not killed at ${spec}:\n${p.output().slice(-3000)}`);
  assert.equal(selfKilledAt(p.output()), spec);
}

/** The final checkpoint sha256 in a run's summary. */
const finalSha = (summary: string) => /final checkpoint: .* \(step 4, sha256 ([0-9a-f]{64})\)/.exec(summary)?.[1];

test(
  'glyphs: SFT by the driver, then DiffusionNFT and Flow-GRPO under rlstream train survive SIGKILL to the same sha256; replay gives it too',
  { timeout: 400_000 },
  async () => {
    const assets = join(tmp, 'assets');
    const sft = await runGlyphs({
      chars: 3,
      size: 16,
      recogniserSteps: 30,
      perChar: 5,
      evalEvery: 10,
      minutes: 5,
      threads: 1,
      out: assets,
      algo: 'diffusion_nft',
      sftSteps: 10,
      rlIters: 0,
      recogniserHidden: 128,
      evalPerChar: 2,
    });
    assert.ok(sft.recogniserHeldout >= 0 && sft.recogniserHeldout <= 1);
    const curve = readFileSync(join(assets, 'curve.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number | string>);
    assert.deepEqual(
      curve.map((l) => l.phase),
      ['recogniser', 'sft'],
    );
    assert.ok(Number(curve[1].ocr_confidence) > 0 && Number(curve[1].ocr_confidence) < 1, JSON.stringify(curve[1]));
    assert.deepEqual(
      readdirSync(assets).filter((f) => f.endsWith('.png')),
      ['sft-00010.png'],
    );
    await createSession(readFileSync(join(assets, 'recogniser.onnx')), { threads: 1 });
    writeFileSync(
      join(assets, 'data.jsonl'),
      ['0', '1', '2'].map((c) => JSON.stringify({ prompt: c, answer: c })).join('\n'),
    );

    const algos = ['diffusion_nft', 'flow_grpo'];
    const args = (algo: string, dir: string) => overrides(assets, join(tmp, dir), algo, algo);
    // both runs are SIGKILLed at the start of step 3 (in their own processes, side by side) while
    // the uninterrupted references train here
    const killed = Promise.all(algos.map((a) => killedAt(['train', CONFIG, ...args(a, a)], 'update:start@3')));
    const want: Record<string, string> = {};
    for (const algo of algos) {
      const ref = await trainEmbedded(
        loadConfig({ file: CONFIG, overrides: args(algo, `${algo}-ref`) }),
        silentLogger(algo),
      );
      assert.equal(ref.status, 'completed', ref.message);
      const sha = finalSha(ref.summary);
      assert.ok(sha, ref.summary);
      want[algo] = sha;
    }
    await killed;
    for (const algo of algos) {
      // the same run started again resumes from global_step_2, re-trains step 3 from its log and finishes
      const again = await trainEmbedded(
        loadConfig({
          file: CONFIG,
          // the CLI's environment set the server and lifecycle keys (pipeline.http_port, …) otherwise
          overrides: [...args(algo, algo), 'trainer.resume_with_changed_config=true'],
        }),
        silentLogger(algo),
      );
      assert.equal(again.status, 'completed', again.message);
      assert.equal(
        finalSha(again.summary),
        want[algo],
        `${algo}: the SIGKILLed run ends on the uninterrupted run's checkpoint`,
      );
    }
    const r = await replayRun({ from: join(tmp, 'flow_grpo-ref'), overrides: [], log: silentLogger('replay') });
    assert.equal(r.status, 'completed', r.message);
    assert.equal(r.finalSha256, want.flow_grpo, 'the replay trains to the same checkpoint');
  },
);
