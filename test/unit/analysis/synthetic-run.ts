/**
 * A small synthetic run written through the store port (lib/store): trajectories with real[]
 * log-probs, step metrics, validation generations, checkpoints and dead letters, plus (optionally)
 * a replay run whose checkpoints point back at it. Everything is a deterministic function of the
 * run id and the step, and the generated rows are returned so the tests compute every expected
 * view value from them in JS (the oracle), not from hard-coded numbers.
 */
import { createHash } from 'node:crypto';
import type {
  CheckpointRow,
  DeadLetterRow,
  MetricRow,
  Store,
  TrajectoryRow,
  ValGenerationRow,
} from '../../../lib/store/index.ts';

export const PROMPTS = [
  { text: 'Guess the number: 3 + 4 = ?', answer: '7' },
  { text: 'Guess the number: 12 - 5 = ?', answer: '7' },
  { text: 'Guess the number: 6 * 2 = ?', answer: '12' },
  { text: 'Guess the number: 9 + 9 = ?', answer: '18' },
  { text: 'Guess the number: 100 / 4 = ?', answer: '25' },
  { text: 'Guess the number: 17 * 23 = ?', answer: '391' }, // never solved
];
export const NEVER_SOLVED = PROMPTS[5].text;
export const STAGES = ['rollout', 'reward', 'advantage', 'update'] as const;
export const MAX_NEW_TOKENS = 11;
export const GROUPS_PER_STEP = 4;
export const N_PER_GROUP = 4;
export const KL_OFFSET = 0.02;

export interface SyntheticRun {
  runId: string;
  replayRunId?: string;
  steps: number;
  trajectories: TrajectoryRow[];
  metrics: MetricRow[];
  valGenerations: ValGenerationRow[];
  checkpoints: CheckpointRow[];
  replayCheckpoints: CheckpointRow[];
  deadLetters: DeadLetterRow[];
}

const sha = (s: string) => createHash('sha256').update(s).digest('hex');

function logprobs(n: number, seed: number): Float32Array {
  const a = new Float32Array(n);
  for (let t = 0; t < n; t++) a[t] = -0.3 - 0.05 * ((seed + t) % 7);
  return a;
}

/** Builds the rows of a run with `steps` training steps (validation at 0, 3, 6, …). */
export function buildSyntheticRun(runId: string, steps = 6, opts: { replay?: boolean } = {}): SyntheticRun {
  const trajectories: TrajectoryRow[] = [];
  const metrics: MetricRow[] = [];
  const valGenerations: ValGenerationRow[] = [];
  for (let step = 1; step <= steps; step++) {
    const rewards: number[] = [];
    const lengths: number[] = [];
    for (let p = 0; p < GROUPS_PER_STEP; p++) {
      const promptNo = (step * GROUPS_PER_STEP + p) % PROMPTS.length;
      const prompt = PROMPTS[promptNo];
      const groupUid = sha(`${runId}/train/s${step}/p${p}`).slice(0, 16);
      const hopeless = promptNo === 5;
      for (let k = 0; k < N_PER_GROUP; k++) {
        const len = 2 + ((step * 7 + p * 3 + k * 5) % (MAX_NEW_TOKENS - 1));
        const correct = !hopeless && (step + p + k) % 3 !== 0;
        const failed = step === 3 && p === 1 && k === 2;
        const behaviour = logprobs(len, step + p + k);
        const ref = Float32Array.from(behaviour, (x) => x - KL_OFFSET);
        const staleness = step > 1 ? k % 2 : 0;
        const reward = failed ? null : (correct ? 1 : 0) + 0.1;
        if (reward !== null) rewards.push(reward);
        lengths.push(len);
        trajectories.push({
          id: `${runId}/train/s${step}/p${p}/n${k}`,
          runId,
          step,
          epoch: Math.floor((step - 1) / 3),
          kind: 'train',
          groupUid,
          promptIndex: p,
          sampleIndex: k,
          policyVersion: step - 1 - staleness,
          promptTokens: [1, 2, 3, promptNo],
          responseTokens: Array.from({ length: len }, (_, t) => 10 + t),
          promptText: prompt.text,
          responseText: correct ? prompt.answer : `${Number(prompt.answer) + 1 + k}\nmaybe`,
          groundTruth: prompt.answer,
          behaviourLogprobs: behaviour,
          refLogprobs: ref,
          oldLogprobs: null,
          advantages: new Float32Array(len).fill(correct ? 0.5 : -0.5),
          advantage: correct ? 0.5 : -0.5,
          returns: null,
          reward,
          rewardDetails: failed ? null : { accuracy: correct ? 1 : 0, format: 1 },
          rewardFailure: failed ? 'reward function threw: division by zero' : null,
          finishReason: len === MAX_NEW_TOKENS ? 'length' : 'stop',
          filtered: hopeless,
          filterReason: hopeless ? 'dapo: all rewards equal (std = 0)' : null,
          staleness,
        });
      }
    }
    const mean = rewards.reduce((s, r) => s + r, 0) / rewards.length;
    const std = Math.sqrt(rewards.reduce((s, r) => s + (r - mean) ** 2, 0) / rewards.length);
    const m = (name: string, value: number, stage: string | null = null) =>
      metrics.push({ runId, step, name, value, stage });
    m('reward/mean', mean, 'advantage');
    m('reward/std', std, 'advantage');
    m('reward/max', Math.max(...rewards), 'advantage');
    m('reward/min', Math.min(...rewards), 'advantage');
    m('response_length/mean', lengths.reduce((s, x) => s + x, 0) / lengths.length, 'advantage');
    m('kl/mean', KL_OFFSET + 0.001 * step, 'advantage');
    m('kl/coef', 0.001, 'advantage');
    m('actor/pg_loss', -0.1 / step, 'update');
    m('actor/approx_kl', 0.0005 * step, 'update');
    m('actor/clipfrac', 0.02 * (step % 4), 'update');
    m('actor/entropy', 2 - 0.15 * step, 'update');
    m('actor/grad_norm', step === 4 ? Number.NaN : 1 / step, 'update');
    m('actor/lr', 1e-6, 'update');
    m('perf/tokens_per_second', 1000 + 10 * step, 'update');
    STAGES.forEach((stage, i) => {
      m(`perf/step_time_s/${stage}`, 0.5 + i * 0.25 + 0.01 * step, stage);
      m(`timing/${stage}/wait_s`, 0.05 * (i + 1), stage);
      m(`timing/${stage}/compute_s`, 0.4 + i * 0.25 + 0.01 * step, stage);
    });
    // Phases the pipeline also times (lib/pipeline/metrics.ts: timing/<stage>/<phase>_s).
    m('timing/rollout/generate_s', 0.3 + 0.01 * step, 'rollout');
    m('timing/update/checkpoint_s', step % 3 === 0 ? 0.2 : 0, 'update');
  }
  for (let step = 0; step <= steps; step += 3) {
    metrics.push({
      runId,
      step,
      name: 'val/accuracy',
      value: [0.2, 0.6, 0.5, 0.55][(step / 3) % 4],
      stage: 'controller',
    });
    metrics.push({
      runId,
      step,
      name: 'val/reward_score',
      value: [0.3, 0.7, 0.6, 0.65][(step / 3) % 4],
      stage: 'controller',
    });
    for (let idx = 0; idx < 3; idx++) {
      const failed = step === 3 && idx === 2;
      valGenerations.push({
        runId,
        step,
        idx,
        prompt: PROMPTS[idx].text,
        response: PROMPTS[idx].answer,
        groundTruth: PROMPTS[idx].answer,
        reward: failed ? null : 1.1,
        rewardFailure: failed ? 'reward server timeout after 3 attempts' : null,
      });
    }
  }
  const checkpoints: CheckpointRow[] = [];
  for (let step = 3; step <= steps; step += 3) {
    checkpoints.push({
      runId,
      step,
      path: `checkpoints/step_${String(step).padStart(6, '0')}/model.safetensors`,
      sha256: sha(`${runId}/ckpt/${step}`),
      policyVersion: step,
      consumedOffsets: { 'scored/0': step * 16 },
      datasetPosition: { epoch: 0, index: step * 4 },
    });
  }
  const deadLetters: DeadLetterRow[] = [
    {
      stage: 'reward',
      topic: `${runId}.rollouts`,
      partition: 0,
      offset: 17,
      runId,
      reason: 'undecodable Avro message: unexpected end of buffer',
      errorCode: 'ERR_POISON',
      payload: Uint8Array.from([1, 2, 3]),
    },
    {
      stage: 'advantage',
      topic: `${runId}.scored`,
      partition: 1,
      offset: 42,
      runId,
      reason: 'unknown schema id 99',
      errorCode: 'ERR_POISON',
      payload: null,
    },
  ];
  let replayRunId: string | undefined;
  const replayCheckpoints: CheckpointRow[] = [];
  if (opts.replay) {
    replayRunId = `${runId}-replay`;
    for (const c of checkpoints) {
      // The replay reproduces step 3 bit for bit and diverges afterwards.
      replayCheckpoints.push({
        ...c,
        runId: replayRunId,
        sha256: c.step === 3 ? c.sha256 : sha(`${replayRunId}/ckpt/${c.step}`),
      });
    }
  }
  return {
    runId,
    replayRunId,
    steps,
    trajectories,
    metrics,
    valGenerations,
    checkpoints,
    replayCheckpoints,
    deadLetters,
  };
}

/** Writes the run (and its replay) through the store port. */
export async function writeSyntheticRun(store: Store, run: SyntheticRun): Promise<void> {
  await store.upsertRun({
    runId: run.runId,
    project: 'analysis-test',
    experiment: 'number-game',
    config: { trainer: { total_epochs: 2 } },
  });
  await store.insertTrajectories(run.trajectories);
  await store.insertMetrics(run.metrics);
  await store.recordValGenerations(run.valGenerations);
  for (const c of run.checkpoints) await store.recordCheckpoint(c);
  for (const d of run.deadLetters) await store.recordDeadLetter(d);
  await store.setRunStatus(run.runId, 'completed', { steps: run.steps });
  if (run.replayRunId) {
    await store.upsertRun({
      runId: run.replayRunId,
      project: 'analysis-test',
      experiment: 'number-game-replay',
      config: {},
      parentRunId: run.runId,
      status: 'stopped',
    });
    for (const c of run.replayCheckpoints) await store.recordCheckpoint(c);
  }
}
