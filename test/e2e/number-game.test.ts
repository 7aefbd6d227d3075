/**
 * The number game learns: examples/number-game.yaml shortened to 15 steps at a constant lr (the
 * example's cosine schedule would end at step 15), trained in-process through the embedded
 * pipeline from the example's seeds and a pinned run id (sample ids, and so the sampler's
 * randomness, derive from it), so the run is deterministic. The untrained policy rarely emits a
 * bare digit (val accuracy ≈ 0); after 15 steps it is far above chance (1/3).
 *
 * Thresholds come from measurements with margin: the pinned run goes 0.000 → 0.102 → 0.648 →
 * 0.852 (steps 0/5/10/15) and train reward/mean 0.06 → 0.96; three other run ids (other sampling
 * streams) started at 0.008–0.031 and reached 0.73–0.92 at step 15 (reward/mean ≥ 0.81). With 2
 * ORT threads instead of the example's 1 (other float rounding) the pinned run ends at 0.797.
 * About 25 s on 2 cores.
 *
 * A second, one-step run at temperature 0.5 checks the KL reference log-probs: at step 1 the
 * behaviour policy is the reference (version 0), so both log-probs must agree.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { sql } from 'kysely';
import { openStore } from '../../lib/store/index.ts';

const ROOT = join(import.meta.dirname, '../..');
const RUN_ID = 'e2e-number-game';
const runDir = join(ROOT, 'test/.tmp', `number-game-${process.pid}`);
after(() => rmSync(runDir, { recursive: true, force: true }));

test(
  'number game: validation accuracy rises from chance to well above it in 15 steps',
  { timeout: 600_000 },
  async () => {
    const cfg = loadConfig({
      file: join(ROOT, 'examples/number-game.yaml'),
      overrides: [
        `trainer.run_dir=${runDir}`,
        `pipeline.run_id=${RUN_ID}`,
        'trainer.max_steps=15',
        'trainer.val_freq=5',
        'trainer.save_freq=-1',
        'actor.optim.lr_scheduler=constant',
      ],
    });
    const out = await trainEmbedded(cfg, silentLogger(RUN_ID));
    assert.equal(out.status, 'completed', out.message);
    const store = await openStore({ kind: 'pglite', dir: join(runDir, 'db') });
    try {
      const metrics = await store.getMetrics(RUN_ID, ['val/accuracy', 'reward/mean']);
      const series = (name: string) => metrics.filter((m) => m.name === name).sort((a, b) => a.step - b.step);
      const val = series('val/accuracy');
      assert.deepEqual(
        val.map((m) => m.step),
        [0, 5, 10, 15],
        'validation before training and every 5 steps',
      );
      const [first, last] = [val[0].value, val[val.length - 1].value];
      assert.ok(first <= 0.1, `untrained val accuracy ${first} should be near 0`);
      assert.ok(
        last >= 0.6,
        `val accuracy after 15 steps is ${last}; curve: ${val.map((m) => `${m.step}:${m.value.toFixed(3)}`).join(' ')}`,
      );
      const reward = series('reward/mean');
      assert.equal(reward.length, 15);
      assert.ok(
        reward[14].value > reward[0].value + 0.4,
        `train reward rises: ${reward[0].value} → ${reward[14].value}`,
      );
      assert.equal(
        await store.countTrajectories(RUN_ID, { kind: 'train' }),
        15 * 128 * 5,
        'one trajectory row per (step, prompt, sample)',
      );
      // validation samples are stored too: 4 rounds × 128 prompts × n = 1, one row each, with their rewards
      assert.equal(
        await store.countTrajectories(RUN_ID, { kind: 'val' }),
        4 * 128,
        'one validation row per (round, prompt, sample)',
      );
      for (const step of [0, 15]) {
        const { rows } = await sql<{
          n: number;
          acc: number;
        }>`select count(*)::int as n, avg(coalesce((reward_details->>'accuracy')::float8, reward)) filter (where reward is not null) as acc
        from trajectories where run_id = ${RUN_ID} and kind = 'val' and step = ${step}`.execute(store.database.db);
        const logged = val.find((m) => m.step === step)!.value;
        assert.ok(
          Math.abs(rows[0].acc - logged) < 1e-9,
          `round ${step}: the stored rows' accuracy ${rows[0].acc} is val/accuracy ${logged}`,
        );
      }
    } finally {
      await store.close();
    }
  },
);

test(
  'KL reference log-probs are taken at the rollout temperature (step 1: reference = behaviour policy)',
  { timeout: 300_000 },
  async () => {
    const dir = join(runDir, 'temperature');
    const cfg = loadConfig({
      file: join(ROOT, 'examples/number-game.yaml'),
      overrides: [
        `trainer.run_dir=${dir}`,
        'pipeline.run_id=e2e-ref-temperature',
        'trainer.max_steps=1',
        'trainer.val_before_train=false',
        'trainer.val_freq=-1',
        'rollout.temperature=0.5',
        'data.rollout_batch_size=8',
        'actor.global_batch_size=40',
        'actor.micro_batch_size_per_device_for_update=40',
        'actor.micro_batch_size_per_device_for_experience=40',
        'actor.ppo_epochs=1',
      ],
    });
    const out = await trainEmbedded(cfg, silentLogger('e2e-ref-temperature'));
    assert.equal(out.status, 'completed', out.message);
    const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
    try {
      const rows = await store.getTrajectories('e2e-ref-temperature', { kind: 'train' });
      assert.equal(rows.length, 40);
      // step 1 is sampled from version 0, the reference policy: the sampler's behaviour log-probs
      // (log softmax(logits / T)) and the reference log-probs must agree token by token
      let worst = 0;
      for (const r of rows) {
        assert.ok(r.refLogprobs, `${r.id} has reference log-probs`);
        assert.equal(r.refLogprobs!.length, r.behaviourLogprobs.length);
        r.behaviourLogprobs.forEach((b, t) => {
          worst = Math.max(worst, Math.abs(b - r.refLogprobs![t]));
        });
      }
      assert.ok(worst < 1e-4, `reference and behaviour log-probs of the same policy differ by up to ${worst}`);
    } finally {
      await store.close();
    }
  },
);
