/**
 * A resume of the update stage between checkpoints, its I/O: the trainer starts from its base
 * (lib/pipeline/update-start.ts resumeBase: the last checkpoint, else the run's start) and the
 * committed steps after it are trained again from their groups in the update stage's input log,
 * read between the offsets recorded with the base and the committed positions (the consumer
 * group's position is not moved). Training is deterministic, so this gives the committed
 * version's weights, AdamW state and EMA again; nothing is written or published.
 */
import type { UpdateGroup } from '../contracts/index.ts';
import { parseTopicName } from '../contracts/topics.ts';
import { RlError } from '../errors.ts';
import { oldestSampledVersion } from '../policy-store/retention.ts';
import type { Logger } from '../log.ts';
import type { PolicyLearner } from './learner.ts';
import type { Pipeline } from './runtime.ts';
import { txOf, type Executor } from './stage-state.ts';
import { recordedSha, resumeBase, type ResumeBase, type UpdateState } from './update-start.ts';

/**
 * The logged groups of steps `after` + 1 … `upTo` (re-read from the update stage's input to
 * re-train them after a resume): this run's, one per id (a redelivered duplicate dropped), in id
 * order, by step.
 */
export function loggedSteps(
  groups: Iterable<UpdateGroup>,
  runId: string,
  after: number,
  upTo: number,
): Map<number, UpdateGroup[]> {
  const byId = new Map<string, UpdateGroup>();
  for (const g of groups)
    if (g.run_id === runId && g.step > after && g.step <= upTo && !byId.has(g.id)) byId.set(g.id, g);
  const out = new Map<number, UpdateGroup[]>();
  for (const g of [...byId.values()].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)))
    out.set(g.step, [...(out.get(g.step) ?? []), g]);
  return out;
}

/** This run's update groups in the update stage's input between `from` and `until` ("<topic>/<partition>" → offset; absent from: 0). */
export async function readLoggedGroups(
  p: Pipeline,
  from: Readonly<Record<string, number>>,
  until: Readonly<Record<string, number>>,
  db: Executor,
): Promise<UpdateGroup[]> {
  const read: UpdateGroup[] = [];
  for (const [key, end] of Object.entries(until)) {
    const cut = key.lastIndexOf('/');
    const topic = key.slice(0, cut),
      partition = Number(key.slice(cut + 1));
    if (parseTopicName(p.cfg.pipeline.topic_prefix, p.runId, topic) !== 'updates') continue;
    for (let off = from[key] ?? 0; off < end;) {
      const msgs = await p.bus.read(topic, partition, off, Math.min(500, end - off), txOf(db));
      if (!msgs.length) break;
      for (const m of msgs) {
        if (m.offset >= end) break;
        // a message no codec reads was dead-lettered when it was consumed: it trained nothing
        const g = await p.codecs.updates.decode(m.value, m.headers).catch(() => null);
        if (g) read.push(g);
      }
      off = msgs[msgs.length - 1].offset + 1;
    }
  }
  return read;
}

/** What re-training logged steps needs of the update stage: its learner and its training step. */
export interface Retrainer {
  p: Pipeline;
  learner: PolicyLearner;
  log: Logger;
  train: (at: UpdateState, groups: UpdateGroup[]) => Promise<void>;
}

/** A Retrainer with the committed state to reach. */
export interface RetrainArgs extends Retrainer {
  st: UpdateState;
  /** The batch's executor inside a batch. */
  db: Executor;
}

/**
 * Brings the learner to the committed version `st.version` when it is elsewhere: at a start (it
 * opened at the trainer base), or after a batch that trained and then failed (`reset`: it is
 * first put back to the base).
 */
export async function catchUpLearner(a: RetrainArgs & { reset: boolean }): Promise<void> {
  if (a.learner.version === a.st.version) return;
  const base = await resumeBase(a.p, a.st, a.db);
  if (a.reset) await a.learner.reset(base);
  await retrainLogged({ ...a, base });
  if (a.reset)
    a.log.warn(
      { version: a.st.version },
      `restored the trainer to the committed policy version ${a.st.version} (a batch failed after training)`,
    );
}

/**
 * Re-trains the committed steps after trainer base `base` (the learner is there) up to
 * `st.version` with `train` (the update stage's step: it advances `at.optimizerSteps`). Groups the
 * log no longer holds (a Kafka retention shorter than the run), or optimizer steps that differ
 * from the committed count, stop the stage saying so.
 */
export async function retrainLogged(a: RetrainArgs & { base: ResumeBase }): Promise<void> {
  const { p, learner, st, base, db } = a;
  const steps = loggedSteps(
    await readLoggedGroups(p, base.rereadFrom, st.positions ?? {}, db),
    p.runId,
    base.step,
    st.version,
  );
  const t0 = performance.now();
  const at: UpdateState = { ...st, version: base.step, optimizerSteps: base.optimizerSteps };
  const after = base.dir ? `checkpoint ${base.dir}` : "the run's start";
  for (let step = base.step + 1; step <= st.version; step++) {
    const groups = steps.get(step) ?? [];
    const kept = groups.filter((g) => !g.filtered).length;
    if (kept < p.cfg.data.rollout_batch_size)
      throw new RlError(
        `cannot resume the update stage at step ${st.version}: step ${step} is re-trained from its groups in the update stage's input log after ${after}, but the log holds ${kept} of its ${p.cfg.data.rollout_batch_size} groups from the offsets recorded there (${JSON.stringify(base.rereadFrom)}); keep the topic's messages for the whole run (Kafka retention), or checkpoint more often (trainer.save_freq)`,
        { retriable: false, code: 'ERR_RESUME_LOG' },
      );
    await a.train(at, groups);
    at.version = step;
    learner.advance(step, st.versionSha?.[String(step)] ?? (await recordedSha(p, step, db)));
    // a version kept in memory only when it was trained: the rollout may sample with it again
    if (step >= oldestSampledVersion(st.version, p.cfg.pipeline.max_staleness)) await learner.handOverUnstored(db);
  }
  if (at.optimizerSteps !== st.optimizerSteps)
    throw new RlError(
      `cannot resume the update stage at step ${st.version}: re-training steps ${base.step + 1}–${st.version} after ${after} took ${at.optimizerSteps - base.optimizerSteps} optimizer steps, the committed state says ${st.optimizerSteps - base.optimizerSteps}`,
      { retriable: false, code: 'ERR_RESUME_LOG' },
    );
  if (st.version > base.step)
    a.log.info(
      { from: base.step, to: st.version, ms: Math.round(performance.now() - t0) },
      `re-trained steps ${base.step + 1}–${st.version} from the update stage's input log (the trainer is at the committed version ${st.version})`,
    );
}
