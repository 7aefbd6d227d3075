/**
 * Embedded crash test: `rlstream train` (all five stages in one process over PGlite) is killed
 * with SIGKILL again and again — at exact crash points (RLSTREAM_CRASH_AT: mid-rollout, after an
 * update, after the new version is saved but before the batch commits, half-way through a
 * checkpoint write, after the checkpoint is renamed or recorded but not committed, …) and at
 * seeded random times — and restarted with the same command each time. The run must end with the
 * uninterrupted run's checkpoint sha256, with exactly one trajectory row per (step, prompt,
 * sample), identical to the uninterrupted run's rows. The first kill comes at the start of step 4,
 * after step 3's version was committed and between checkpoints (2 and 4): policy versions hold no
 * optimizer state, so the restart starts the trainer from global_step_2 and re-trains step 3 from
 * the update stage's input log. Odd steps' versions are kept in memory only (policy.version_files
 * defaults to checkpoints in `rlstream train`): a restart hands the re-trained ones to the rollout
 * again; the kills include a version write half done, a prune half done and a seal in flight. It also checks the resume lines, that a
 * half-written checkpoint is never taken as the last one, and that a live run directory cannot
 * be opened by another process (the lock names the PID).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { openDatabase } from '../../lib/db/database.ts';
import { listCheckpointSteps } from '../../lib/pipeline/checkpoints.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import {
  Rng,
  deadline,
  killHard,
  lastCrashPoint,
  phaseOf,
  resumeLines,
  selfKilledAt,
  sleep,
  spawnCli,
  type CliProc,
} from '../support/chaos-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'crash';
const SEED = Number(process.env.RLSTREAM_CRASH_SEED ?? 11);
const TRAIN = 16,
  BATCH = 4,
  N = 4,
  STEPS = 20,
  SAVE_FREQ = 2,
  SAVE_LIMIT = 3;
const SPE = TRAIN / BATCH;
const tmp = join(ROOT, 'test/.tmp', `crash-${process.pid}`);
const procs: CliProc[] = [];
after(async () => {
  for (const p of procs) await killHard(p);
  rmSync(tmp, { recursive: true, force: true });
});

const overrides = (dir: string) => [
  `trainer.run_dir=${dir}`,
  `pipeline.run_id=${RUN_ID}`,
  `data.task_size.train=${TRAIN}`,
  `data.rollout_batch_size=${BATCH}`,
  `rollout.n=${N}`,
  `trainer.total_epochs=${Math.ceil(STEPS / SPE)}`,
  `trainer.max_steps=${STEPS}`,
  `trainer.save_freq=${SAVE_FREQ}`,
  `trainer.save_limit=${SAVE_LIMIT}`,
];

/** Points where the process kills itself; n counts hits in that process. */
const HOOKS = [
  'checkpoint:half-written@1',
  'update:version-written@1',
  // a checkpoint step's version with its files in the temporary directory; a prune half done
  'update:version-half-written@1',
  'update:pruning@1',
  // an odd step's version (kept in memory only) being sealed by the seal worker
  'update:sealing@1',
  'rollout:generated@3',
  'reward:scored@2',
  'update:trained@2',
  'checkpoint:renamed@1',
  'checkpoint:recorded@1',
  'advantage:computed@2',
];
/**
 * One hook of each phase the test must hit goes first (in seeded order): how many steps a process
 * gets through before its kill depends on the machine's speed, and on a slow, loaded machine a
 * random-time kill can come so late that the run finishes before the hooks planned last.
 */
const FIRST = [
  'rollout:generated@3',
  'reward:scored@2',
  'update:trained@2',
  'update:sealing@1',
  'checkpoint:half-written@1',
];
/** The first process is killed as step 4 starts: step 3 is committed, the last checkpoint is global_step_2. */
const RETRAIN_KILL = 'update:start@4';

interface TrajRow {
  step: number;
  epoch: number;
  prompt_index: number;
  sample_index: number;
  response_tokens: number[];
  reward: number | null;
  advantages: number[] | null;
  policy_version: number;
}

async function runState(runDir: string) {
  const store = await openStore({ kind: 'pglite', dir: join(runDir, 'db') });
  try {
    const rows = (
      await sql<TrajRow>`select step, epoch, prompt_index, sample_index, response_tokens, reward, advantages, policy_version
      from trajectories where run_id = ${RUN_ID} and kind = 'train' order by step, prompt_index, sample_index`.execute(
        store.database.db,
      )
    ).rows;
    return { latest: await store.latestCheckpoint(RUN_ID), checkpoints: await store.listCheckpoints(RUN_ID), rows };
  } finally {
    await store.close();
  }
}

test(
  'SIGKILLed at rollout, update and checkpoint-write points and at random times, the embedded run ends with the uninterrupted checkpoint and trajectories',
  { timeout: 420_000 },
  async () => {
    const t0 = Date.now();
    // the uninterrupted reference
    const refDir = join(tmp, 'reference');
    const ref = await trainEmbedded(loadConfig({ file: CONFIG, overrides: overrides(refDir) }), silentLogger(RUN_ID));
    assert.equal(ref.status, 'completed', ref.message);
    const want = await runState(refDir);
    assert.equal(want.latest?.step, STEPS);

    // the same command, killed again and again
    const dir = join(tmp, 'crashed');
    const args = ['train', CONFIG, ...overrides(dir)];
    const rng = Rng.fromSeed(`crash:${SEED}`);
    const hooks = [...rng.shuffle([...FIRST]), ...rng.shuffle(HOOKS.filter((h) => !FIRST.includes(h)))];
    // first a kill between checkpoints (step 3 committed, the last checkpoint global_step_2), then
    // a random-time kill before every fourth hook after the first
    const plan: Array<{ kind: 'hook'; spec: string } | { kind: 'random'; delayMs: number }> = [
      { kind: 'hook', spec: RETRAIN_KILL },
    ];
    hooks.forEach((spec, i) => {
      if (i % 4 === 0 && i > 0) plan.push({ kind: 'random', delayMs: Math.round(150 + rng.next() * 1500) });
      plan.push({ kind: 'hook', spec });
    });
    const kills: Array<{ how: string; phase: string; point: string | null; resumedAt: number | null }> = [];
    const outputs: string[] = [];
    let lockChecked = false;
    let halfWrittenChecked = false;
    let completed = false;
    for (const k of plan) {
      const p = spawnCli(
        args,
        k.kind === 'hook' ? { RLSTREAM_CRASH_AT: k.spec, RLSTREAM_CRASH_TRACE: '1' } : { RLSTREAM_CRASH_TRACE: '1' },
      );
      procs.push(p);
      if (k.kind === 'random') {
        const working = await p.waitFor(/^rlstream-crash-point /m, 90_000);
        if (working && !lockChecked) {
          // a live run directory cannot be opened by another process: the lock names the holder
          await assert.rejects(
            openDatabase({ kind: 'pglite', dir: join(dir, 'db') }),
            (e: Error) => e.message.includes(`PID ${p.pid}`) && /in use by another process/.test(e.message),
          );
          lockChecked = true;
        }
        await sleep(k.delayMs);
        await killHard(p);
      } else {
        const done = await Promise.race([p.exit, deadline(120_000)]);
        if (!done) {
          await killHard(p);
          assert.fail(`process with ${k.spec} neither crashed nor finished:\n${p.output().slice(-3000)}`);
        }
      }
      const ex = await p.exit;
      const out = p.output();
      console.log(
        `  process ${outputs.length + 1} (${k.kind === 'hook' ? k.spec : `random +${k.delayMs} ms`}): ${((Date.now() - p.startedAt) / 1000).toFixed(1)} s, ${ex.signal ?? `exit ${ex.code}`}`,
      );
      outputs.push(out);
      const resumed = resumeLines(out)[0]?.step ?? null;
      if (ex.code === 0) {
        completed = true;
        kills.push({
          how: k.kind === 'hook' ? `${k.spec} (not reached: run finished)` : 'random (run finished first)',
          phase: '-',
          point: null,
          resumedAt: resumed,
        });
        break;
      }
      assert.equal(
        ex.signal,
        'SIGKILL',
        `the process ended by itself (code ${ex.code}) instead of being killed:\n${out.slice(-3000)}`,
      );
      const point = k.kind === 'hook' ? selfKilledAt(out) : lastCrashPoint(out);
      if (k.kind === 'hook')
        assert.equal(point, k.spec.replace(/@\d+$/, '') + k.spec.slice(k.spec.indexOf('@')), `killed at ${k.spec}`);
      const bare = point?.replace(/@\d+$/, '') ?? null;
      kills.push({
        how: k.kind === 'hook' ? `RLSTREAM_CRASH_AT=${k.spec}` : `random +${k.delayMs} ms`,
        phase: phaseOf(bare),
        point: bare,
        resumedAt: resumed,
      });
      if (bare === 'checkpoint:half-written' && !halfWrittenChecked) {
        // the interrupted write left a temporary directory that is neither listed nor recorded
        const temps = readdirSync(join(dir, 'checkpoints')).filter((n) => n.startsWith('.global_step_'));
        assert.ok(temps.length > 0, 'a half-written checkpoint leaves its temporary directory');
        const s = Number(/^\.global_step_(\d+)\./.exec(temps[0])![1]);
        // global_step_s may exist from an earlier complete (renamed, not yet recorded) write: then it is whole
        if ((await listCheckpointSteps(dir)).includes(s))
          assert.ok(
            existsSync(join(dir, `checkpoints/global_step_${s}/trainer_state.json`)),
            `a listed global_step_${s} is complete`,
          );
        const st = await runState(dir);
        assert.ok(
          (st.latest?.step ?? 0) < s,
          `the last recorded checkpoint (${st.latest?.step}) is not the half-written global_step_${s}`,
        );
        halfWrittenChecked = true;
      }
    }
    if (!completed) {
      const p = spawnCli(args);
      procs.push(p);
      const done = await Promise.race([p.exit, deadline(150_000)]);
      if (!done) {
        await killHard(p);
        assert.fail(`the final run did not finish:\n${p.output().slice(-3000)}`);
      }
      outputs.push(p.output());
      assert.equal(done.code, 0, p.output().slice(-3000));
    }

    // report
    console.log(
      `crash test (seed ${SEED}): ${kills.filter((k) => k.phase !== '-').length} kills, ${((Date.now() - t0) / 1000).toFixed(0)} s`,
    );
    for (const [i, k] of kills.entries())
      console.log(
        `  #${i + 1} ${k.how.padEnd(44)} phase: ${k.phase.padEnd(26)} point: ${(k.point ?? '-').padEnd(26)} resumed at step ${k.resumedAt ?? '-'}`,
      );
    const phases = new Set(kills.map((k) => k.phase));
    for (const need of ['rollout', 'update', 'checkpoint write'])
      assert.ok(phases.has(need), `a kill hit the ${need} phase (hit: ${[...phases].join(', ')})`);
    for (const need of ['reward:scored', 'update:sealing'])
      assert.ok(
        kills.some((k) => k.point === need),
        `a kill hit ${need}`,
      );
    assert.ok(lockChecked, 'the lock was checked against a live process');
    assert.ok(halfWrittenChecked, 'a checkpoint write was interrupted half-way');

    // every restart says where it resumed, consistently with the plan (epochs are 0-based; after an
    // epoch's last step the next epoch starts at prompt 0)
    const resumes = outputs.slice(1).map((o) => resumeLines(o));
    assert.match(
      resumes[0][0]?.text ?? '',
      /^resumed at step 3, .* from checkpoint .*global_step_2 at step 2 \(sha256 [0-9a-f]{64}\), re-training steps 3–3 from the update stage's input log$/,
      'the restart after the kill between checkpoints re-trains step 3 from global_step_2',
    );
    assert.match(outputs[1], /re-trained steps 3–3 from the update stage's input log/);
    for (const [i, r] of resumes.entries()) {
      assert.equal(r.length, 1, `restart ${i + 1} logs one resume line`);
      const { step, epoch, prompt, of } = r[0];
      assert.deepEqual(
        { epoch, prompt, of },
        { epoch: Math.floor(step / SPE), prompt: (step % SPE) * BATCH, of: TRAIN },
        r[0].text,
      );
    }
    console.log(
      `  resume lines: ${resumes.map((r) => r[0].step).join(', ')}; e.g. "${resumes.find((r) => r[0].step % SPE === 0 && r[0].step > 0)?.[0].text ?? resumes[resumes.length - 1][0].text}"`,
    );

    const got = await runState(dir);
    assert.equal(got.latest?.step, STEPS);
    assert.equal(got.latest?.sha256, want.latest!.sha256, "the final checkpoint equals the uninterrupted run's");
    assert.deepEqual(
      got.checkpoints.map((c) => c.step),
      Array.from({ length: STEPS / SAVE_FREQ }, (_, i) => (i + 1) * SAVE_FREQ),
      'one row per saved step',
    );
    assert.deepEqual(
      got.checkpoints.map((c) => c.sha256),
      want.checkpoints.map((c) => c.sha256),
      "every checkpoint equals the uninterrupted run's",
    );
    assert.deepEqual(got.latest!.datasetPosition, want.latest!.datasetPosition);
    assert.deepEqual(await listCheckpointSteps(dir), [16, 18, 20], `save_limit ${SAVE_LIMIT} keeps the newest`);
    assert.deepEqual(
      readdirSync(join(dir, 'checkpoints')).filter((n) => n.startsWith('.')),
      [],
      'no temporary checkpoint is left',
    );
    assert.ok(existsSync(join(dir, 'checkpoints/global_step_20/trainer_state.json')));
    // policy versions hold weights only; the AdamW state is in the checkpoints (and their optimizer artifacts)
    const versionDirs = readdirSync(join(dir, 'policy')).filter((n) => /^v\d+$/.test(n));
    assert.ok(versionDirs.length > 0);
    for (const v of versionDirs)
      assert.ok(!existsSync(join(dir, 'policy', v, 'optimizer.safetensors')), `policy/${v} has no optimizer state`);
    assert.ok(existsSync(join(dir, 'checkpoints/global_step_20/actor/optimizer.safetensors')));
    assert.deepEqual(
      readdirSync(join(dir, 'optimizer')).sort(),
      ['v000016', 'v000018', 'v000020'],
      'optimizer states of the kept checkpoints only',
    );
    // exactly one trajectory row per (step, prompt, sample), equal to the uninterrupted run's
    assert.equal(got.rows.length, STEPS * BATCH * N, 'no gaps, no duplicates');
    const keys = new Set(got.rows.map((r) => `${r.step}/${r.prompt_index}/${r.sample_index}`));
    assert.equal(keys.size, STEPS * BATCH * N);
    for (const r of got.rows)
      assert.equal(
        r.epoch,
        Math.floor((r.step - 1) / SPE),
        `step ${r.step} is in epoch ${Math.floor((r.step - 1) / SPE)}`,
      );
    assert.deepEqual(got.rows, want.rows, "the trajectories equal the uninterrupted run's");
  },
);
