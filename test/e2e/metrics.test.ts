/**
 * Step metrics a user reads for every run: pipeline throughput (perf/samples_per_second,
 * perf/tokens_per_second, measured between policy versions) and, when configured, the entropy
 * penalty term of the actor loss (algorithm.entropy_penalty_coef → actor/entropy_penalty).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { openPipeline } from '../../lib/pipeline/runtime.ts';
import { silentLogger } from '../../lib/log.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const dir = join(ROOT, 'test/.tmp', `metrics-${process.pid}`);
after(() => rmSync(dir, { recursive: true, force: true }));

test('throughput metrics from step 2 on, and the entropy penalty in the actor loss', { timeout: 300_000 }, async () => {
  const cfg = loadConfig({
    file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
    overrides: [
      `trainer.run_dir=${dir}`,
      'pipeline.run_id=metrics-test',
      'trainer.max_steps=3',
      'algorithm.entropy_penalty_coef=0.05',
    ],
  });
  const out = await trainEmbedded(cfg, silentLogger('metrics-test'));
  assert.equal(out.status, 'completed', out.message);
  const p = await openPipeline(cfg);
  try {
    const rows = await p.store.getMetrics('metrics-test', [
      'perf/samples_per_second',
      'perf/tokens_per_second',
      'actor/entropy_penalty',
      'actor/pg_loss',
      'timing/rollout/wait_s',
      'timing/update/wait_s',
      'timing/update/compute_s',
      'perf/step_time_s/update',
    ]);
    const at = (name: string) => new Map(rows.filter((r) => r.name === name).map((r) => [r.step, r.value]));
    const sps = at('perf/samples_per_second'),
      tps = at('perf/tokens_per_second'),
      pen = at('actor/entropy_penalty');
    assert.deepEqual(
      [...sps.keys()].sort(),
      [2, 3],
      'throughput is measured between versions: steps 2 and 3 of a fresh process',
    );
    for (const s of [2, 3]) {
      assert.ok(sps.get(s)! > 0 && Number.isFinite(sps.get(s)), `perf/samples_per_second at step ${s}: ${sps.get(s)}`);
      // every sample has its prompt (≥ 4 tokens) and a response: more tokens than samples per second
      assert.ok(tps.get(s)! > 4 * sps.get(s)!, `perf/tokens_per_second ${tps.get(s)} vs samples ${sps.get(s)}`);
    }
    assert.deepEqual([...pen.keys()].sort(), [1, 2, 3], 'actor/entropy_penalty is logged every step');
    // waiting vs computing: in a sync run the rollout of step s waits for the update of step s − 1,
    // and the update waits for the step's groups; the wait is not part of the stage's step time
    const rolloutWait = at('timing/rollout/wait_s'),
      updateWait = at('timing/update/wait_s');
    const compute = at('timing/update/compute_s'),
      stepTime = at('perf/step_time_s/update');
    for (const s of [2, 3]) {
      assert.ok(rolloutWait.get(s)! > 0, `timing/rollout/wait_s at step ${s}: ${rolloutWait.get(s)}`);
      assert.ok(updateWait.get(s)! > 0, `timing/update/wait_s at step ${s}: ${updateWait.get(s)}`);
      assert.ok(
        stepTime.get(s)! >= compute.get(s)! && stepTime.get(s)! < compute.get(s)! + 1,
        `perf/step_time_s/update ${stepTime.get(s)} is compute ${compute.get(s)} + checkpoint, without the wait`,
      );
    }
    // 0.05 · agg(−log π) with log π < 0: positive, and below 0.05 · log(vocabulary) for a near-uniform policy
    for (const [s, v] of pen) assert.ok(v > 0 && v < 0.05 * 10, `actor/entropy_penalty at step ${s}: ${v}`);
  } finally {
    await p.close();
  }
});

test(
  'policy_loss nft with neg_weight < 0 is the DAPO-like variant: it trains exactly as vanilla PPO',
  { timeout: 300_000 },
  async () => {
    const { checkpointSha256 } = await import('../../lib/model/index.ts');
    const run = async (sub: string, extra: string[]) => {
      const cfg = loadConfig({
        file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
        overrides: [
          `trainer.run_dir=${join(dir, sub)}`,
          'pipeline.run_id=nft-dapo-test',
          'trainer.max_steps=1',
          ...extra,
        ],
      });
      const out = await trainEmbedded(cfg, silentLogger('nft-dapo-test'));
      assert.equal(out.status, 'completed', out.message);
      return checkpointSha256(join(dir, sub, 'policy/v000001'));
    };
    const dapo = await run('dapo', ['algorithm.policy_loss=nft', 'algorithm.nft.neg_weight=-1']);
    const vanilla = await run('vanilla', ['algorithm.policy_loss=vanilla']);
    const nft = await run('nft', [
      'algorithm.policy_loss=nft',
      'algorithm.nft.neg_weight=1',
      'algorithm.nft.correct_key=accuracy',
    ]);
    assert.equal(dapo, vanilla);
    assert.notEqual(nft, vanilla, 'NFT proper trains differently');
  },
);
