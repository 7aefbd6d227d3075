/**
 * Replay: re-runs the reward, advantage and update stages over the recorded trajectories of a run
 * into a new run, without generating anything (no controller, no rollout) — e.g. to compare
 * algorithm.adv_estimator=rloo with the original GRPO on identical rollouts, or to re-score with
 * a new reward function.
 *
 * What happens:
 *  1. The source run's config (its `runs` row) is loaded, the overrides applied on top, and a new
 *     run id chosen (`<source>.replay-<hash of the overrides>`, or pipeline.run_id=…); the new
 *     run has its own run_dir (next to the source's), tables and topics, and `runs.parent_run_id`
 *     names the source (v_checkpoint_lineage compares their checkpoints step by step).
 *  2. The source's `trajectories` topic is read from offset 0 (Kafka, or the embedded log of an
 *     embedded run) and its training groups (steps ≤ --until-step) are copied into the new run's
 *     topic, rewritten to the new run: run_id, the group and sample ids (which embed the run id)
 *     and group_uid = hashId(id). Ids keep their order (one common prefix), so batches are
 *     assembled in the same order as in the source. Validation groups are not copied. The
 *     source's prompt images (prompt_images) are copied to the new run.
 *  3. Policy v0 of the new run is the source's v0 (its weights, copied bytes-equal; a LoRA run of
 *     a language policy: its adapter, on the base at the source's actor.model.path), and the
 *     update stage is told the sha256 of each source policy version (a LoRA version's: its
 *     adapter file's), so the source's later versions need not exist: a recorded sample of version
 *     v is on-policy for the replay only while the replay's version v has exactly those bytes
 *     (then old log-probs are recomputed, as the source did); once the replay's weights differ
 *     (another estimator, another reward), the importance ratio uses the recorded behaviour
 *     log-probs (decoupled PPO, as for stale samples). Replaying with the original config
 *     therefore reproduces the source's checkpoints exactly.
 *  4. Reward → advantage → update run in this process until the update stage has trained the
 *     last step there are trajectories for. A step that cannot be completed from the recorded
 *     groups (online filtering under a new reward wants refills that were never generated) stops
 *     the replay with a message saying so.
 *
 * A replay that is interrupted resumes when the same command is run again (its state and log
 * are those of a normal run; the copy is not repeated). It keeps the source's choice of LoRA or
 * full fine-tuning; an image policy's LoRA run is refused.
 */
import { mkdtempSync, rmSync, writeFileSync, existsSync, statSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import type { Logger } from 'pino';
import { sql } from 'kysely';
import { openPipeline, type Pipeline } from '../lib/pipeline/runtime.ts';
import { openDatabase } from '../lib/db/database.ts';
import { loadConfig, loadPipelineSection, redactSecrets, resolveRunDir, type Config } from '../lib/config/index.ts';
import { hashId, type ControlEvent, type TrajectoryGroup, type PolicyVersion } from '../lib/contracts/index.ts';
import { loadStageState, saveStageState } from '../lib/pipeline/stage-state.ts';
import { policyDir, tokenizerFor } from '../lib/pipeline/policy.ts';
import { loadRunData } from '../lib/pipeline/data.ts';
import { planFromConfig, totalSteps, valScheduled } from '../lib/pipeline/plan.ts';
import { startStage, type StartedStage } from '../services/index.ts';
import { startUpdate } from '../services/update/main.ts';
import { summaryTable } from './run.ts';
import { ConfigError, errorMessage } from '../lib/errors.ts';
import { weightsFileOf } from '../lib/model/checkpoint.ts';
import { policyKindOf } from '../lib/model/policy-kinds.ts';

export interface ReplayOptions {
  /** An embedded run directory (with db/), or a run id in the database of `pipeline.database_url=…` (given in overrides). */
  from: string;
  /** Replay steps 1..untilStep only. */
  untilStep?: number;
  /** a.b=c overrides applied to the source's config. */
  overrides: string[];
  /** The logger, or a factory given the replay's run id (so every line carries the new run's id). */
  log: Logger | ((runId: string) => Logger);
  signal?: AbortSignal;
  /** Fail when no step completes for this long while every stage is idle (default 20 s). */
  stallMs?: number;
  onWarning?: (m: string) => void;
}

export interface ReplayOutcome {
  status: 'completed' | 'failed' | 'stopped';
  message?: string;
  runId: string;
  runDir: string;
  sourceRunId: string;
  /** Last step trained by the replay. */
  finalStep: number;
  /** sha256 of the replay's policy at finalStep (= its checkpoint's when one was saved there). */
  finalSha256: string | null;
  /** Trajectory groups copied from the source (0 when a resumed replay had copied them before). */
  copied: number;
  summary: string;
}

interface Source {
  runId: string;
  config: Record<string, unknown>;
  runDir: string;
}

const isRunDir = (p: string) => existsSync(join(p, 'db', 'pgdata')) && statSync(p).isDirectory();

/** Finds the source run and its stored config. */
async function findSource(from: string, overrides: string[]): Promise<Source> {
  const dir = resolve(from);
  if (isRunDir(dir)) {
    const db = await openDatabase({ kind: 'pglite', dir: join(dir, 'db') });
    try {
      const rows = (
        await sql<{
          run_id: string;
          config: Record<string, unknown>;
        }>`select run_id, config from runs order by created_at`.execute(db.db)
      ).rows;
      if (rows.length === 0)
        throw new ConfigError(`replay --from ${from}: the run directory has no run recorded (was it ever started?)`);
      if (rows.length > 1)
        throw new ConfigError(
          `replay --from ${from}: the run directory holds several runs (${rows.map((r) => r.run_id).join(', ')}); replay one of them by id with pipeline.store=… and pipeline.database_url=… pointing at this store`,
        );
      return { runId: rows[0].run_id, config: rows[0].config, runDir: dir };
    } finally {
      await db.close();
    }
  }
  if (existsSync(dir) && statSync(dir).isDirectory()) {
    throw new ConfigError(
      `replay --from ${from}: ${dir} has no embedded store (db/pgdata); for a distributed run pass its run id and pipeline.database_url=postgres://… (plus its bus settings)`,
    );
  }
  // a run id in a PostgreSQL store named by the overrides
  const where = loadPipelineSection(overrides);
  if (where.store !== 'postgres' || !where.database_url) {
    throw new ConfigError(
      `replay --from ${from}: no run directory ${dir}; to replay a run stored in PostgreSQL by its id, add pipeline.store=postgres pipeline.database_url=postgres://…`,
    );
  }
  const db = await openDatabase({ kind: 'postgres', url: where.database_url, poolSize: 2 });
  try {
    const row = (
      await sql<{
        run_id: string;
        config: Record<string, unknown>;
      }>`select run_id, config from runs where run_id = ${from}`.execute(db.db)
    ).rows[0];
    if (!row) throw new ConfigError(`replay --from ${from}: no run ${from} in ${db.where} (see rlstream runs)`);
    const runDir = resolve(resolveRunDir(row.config as unknown as Config));
    return { runId: row.run_id, config: row.config, runDir };
  } finally {
    await db.close();
  }
}

/** The replay's config: the source's, with the user's overrides, a new run id and run directory. */
function replayConfig(src: Source, opts: ReplayOptions): { cfg: Config; srcCfg: Config } {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-replay-'));
  try {
    const file = join(dir, 'source-config.yaml');
    writeFileSync(file, JSON.stringify(src.config));
    const quiet = () => undefined;
    // the source as it ran (with the user's connection settings, since secrets are not stored)
    const conn = opts.overrides.filter((o) =>
      /^pipeline\.(database_url|brokers|store|bus|schema_registry_url)=/.test(o),
    );
    const srcCfg = loadConfig({ file, overrides: [`trainer.run_dir=${src.runDir}`, ...conn], onWarning: quiet });
    const tag = createHash('sha256')
      .update(JSON.stringify([opts.overrides, opts.untilStep ?? null]))
      .digest('hex')
      .slice(0, 8);
    const userSets = (key: string) => opts.overrides.some((o) => o.startsWith(`${key}=`));
    const runId = `${src.runId.slice(0, 110)}.replay-${tag}`;
    const names = [
      ...(userSets('pipeline.run_id') ? [] : [`pipeline.run_id=${runId}`]),
      ...(userSets('trainer.run_dir')
        ? []
        : [`trainer.run_dir=${join(dirname(src.runDir), `${basename(src.runDir)}.replay-${tag}`)}`]),
    ];
    // a replay starts from the source's v0 and resumes itself when run again
    const cfg = loadConfig({
      file,
      overrides: [
        ...names,
        ...opts.overrides,
        'trainer.load_checkpoint_path=null',
        'trainer.find_last_checkpoint=true',
      ],
      onWarning: opts.onWarning ?? quiet,
    });
    return { cfg, srcCfg };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Reads every message of a topic (all partitions, from offset 0). */
async function readAll(
  p: Pipeline,
  topic: string,
  each: (value: Buffer, headers: Record<string, string>) => Promise<void>,
): Promise<void> {
  const ends = await p.bus.endOffsets(topic);
  for (let part = 0; part < ends.length; part++) {
    for (let off = 0; off < ends[part];) {
      const batch = await p.bus.read(topic, part, off, 500);
      if (!batch.length) break;
      for (const m of batch) await each(m.value, m.headers);
      off = batch[batch.length - 1].offset + 1;
    }
  }
}

interface ReplayState {
  copied: number;
  sourceRunId: string;
  lastStep: number;
  behaviourSha: Record<string, string>;
}

export async function replayRun(opts: ReplayOptions): Promise<ReplayOutcome> {
  const src = await findSource(opts.from, opts.overrides);
  const { cfg, srcCfg } = replayConfig(src, opts);
  if (!srcCfg.actor.model.lora !== !cfg.actor.model.lora)
    throw new ConfigError(
      `replay: run ${src.runId} ${srcCfg.actor.model.lora ? 'trains LoRA adapters' : 'trains all weights'}; a replay keeps that (drop the actor.model.lora override)`,
    );
  if (cfg.actor.model.lora && policyKindOf(cfg.actor.model) === 'image')
    throw new ConfigError(
      `replay: run ${src.runId} trains LoRA adapters on an image policy, which replay does not support; start a new run instead`,
    );
  const log = typeof opts.log === 'function' ? opts.log(cfg.pipeline.run_id ?? src.runId) : opts.log;
  if (opts.untilStep !== undefined && !(Number.isInteger(opts.untilStep) && opts.untilStep >= 1))
    throw new ConfigError(`--until-step must be a positive integer, got ${opts.untilStep}`);
  const p = await openPipeline(cfg, { log, clientId: `rlstream-replay-${cfg.pipeline.run_id ?? ''}` });
  const stages: StartedStage[] = [];
  try {
    await p.store.upsertRun({
      runId: p.runId,
      project: cfg.trainer.project_name,
      experiment: cfg.trainer.experiment_name,
      config: redactSecrets(cfg) as never,
      parentRunId: src.runId,
    });
    let state = await loadStageState<ReplayState>(p.db.db, p.runId, 'replay');
    let copied = 0;
    if (!state) {
      // copy the source's training trajectories (and learn its policy versions' sha256)
      const s = await openPipeline(srcCfg, { log, clientId: `rlstream-replay-source-${src.runId}` });
      const out: Array<ReturnType<Pipeline['message']>> = [];
      const behaviourSha: Record<string, string> = {};
      let lastStep = 0;
      try {
        await readAll(s, s.topic('policy'), async (v, h) => {
          const r = (await s.codecs.policy.decode(v, h)) as PolicyVersion;
          behaviourSha[String(r.policy_version)] = r.sha256;
        });
        const v0 = policyDir(s.runDir, 0);
        if (!existsSync(join(v0, weightsFileOf(v0))))
          throw new ConfigError(`replay: the source's initial policy ${v0} is missing (replay starts from it)`);
        const seen = new Set<string>();
        await readAll(s, s.topic('trajectories'), async (v, h) => {
          const g = (await s.codecs.trajectories.decode(v, h)) as TrajectoryGroup;
          if (g.kind !== 'train' || (opts.untilStep !== undefined && g.step > opts.untilStep) || seen.has(g.id)) return;
          seen.add(g.id);
          const re = (id: string) => `${p.runId}${id.slice(src.runId.length)}`;
          const id = re(g.id);
          out.push(
            p.message('trajectories', {
              ...g,
              run_id: p.runId,
              id,
              group_uid: hashId(id),
              samples: g.samples.map((x) => ({ ...x, id: re(x.id) })),
              baseline: g.baseline ? { ...g.baseline, id: re(g.baseline.id) } : null,
            }),
          );
          lastStep = Math.max(lastStep, g.step);
        });
        // the prompts' images, so the replay's trajectories (image_hashes) join to them in its tables
        const images = await s.store.getPromptImages(src.runId);
        if (images.length)
          await p.store.insertPromptImages(
            images.map((i) => ({ runId: p.runId, hash: i.hash, width: i.width, height: i.height, png: i.png })),
          );
      } finally {
        await s.close();
      }
      if (!out.length)
        throw new ConfigError(
          `replay: run ${src.runId} has no training trajectories${opts.untilStep !== undefined ? ` up to step ${opts.untilStep}` : ''}`,
        );
      state = { copied: out.length, sourceRunId: src.runId, lastStep, behaviourSha };
      // policy v0 = the source's initial weights, before any stage starts
      await p.bus.produce(out);
      await saveStageState(p.db.db, p.runId, 'replay', state);
      copied = out.length;
      log.info(
        { source: src.runId, groups: copied, last_step: lastStep },
        `replay of ${src.runId}: copied ${copied} trajectory groups (steps 1-${lastStep}) into run ${p.runId}`,
      );
    } else {
      log.info({ source: state.sourceRunId }, `resuming replay ${p.runId} of ${state.sourceRunId}`);
    }
    const data = await loadRunData(cfg, tokenizerFor(cfg));
    const planned = totalSteps(planFromConfig(cfg, p.runId, data.train.length, data.val.length));
    const target = Math.min(planned, opts.untilStep ?? planned, state.lastStep);
    if (target < Math.min(planned, opts.untilStep ?? planned))
      log.warn(
        { target, planned },
        `the source has trajectories up to step ${state.lastStep} only; replaying steps 1-${target}`,
      );
    const behaviour = new Map(Object.entries(state.behaviourSha).map(([v, sha]) => [Number(v), sha]));
    stages.push({
      name: 'update',
      run: await startUpdate(p, {
        trainSize: data.train.length,
        behaviourSha: behaviour,
        initialWeightsDir: policyDir(src.runDir, 0),
      }),
      close: async () => {},
    });
    for (const name of ['reward', 'advantage']) stages.push(await startStage(p, name));
    // validation as in training (val_before_train, val_freq, the last step): the controller runs
    // only the validation rounds and the rollout generates their responses
    const plan = planFromConfig(cfg, p.runId, data.train.length, data.val.length);
    const valVersions = Array.from({ length: target + 1 }, (_, v) => v).filter((v) => valScheduled(plan, v));
    if (valVersions.length)
      for (const name of ['controller', 'rollout']) stages.push(await startStage(p, name, { replay: true }));
    const outcome = await waitFor(p, stages, target, { ...opts, valVersions });
    for (const st of stages) await st.run.consumer.stop().catch(() => undefined);
    await Promise.all(stages.map((st) => st.run.done.catch(() => undefined)));
    for (const st of stages) await st.close().catch(() => undefined);
    stages.length = 0;
    if (outcome.status !== 'stopped')
      await p.store
        .setRunStatus(
          p.runId,
          outcome.status,
          outcome.status === 'failed' ? { error: outcome.message ?? '' } : undefined,
        )
        .catch(() => undefined);
    return {
      ...outcome,
      runId: p.runId,
      runDir: p.runDir,
      sourceRunId: src.runId,
      copied,
      summary: await summaryTable(p),
    };
  } finally {
    for (const st of stages) await st.run.consumer.stop().catch(() => undefined);
    await p.close();
  }
}

/** Follows the replay's policy topic until version `target`; fails on a stage error or a stall. */
async function waitFor(
  p: Pipeline,
  stages: StartedStage[],
  target: number,
  opts: ReplayOptions & { valVersions: number[] },
): Promise<{ status: ReplayOutcome['status']; message?: string; finalStep: number; finalSha256: string | null }> {
  let version = 0,
    sha: string | null = null,
    pos = 0,
    idleSince = Date.now(),
    lastVersion = -1,
    ctlPos = 0;
  const valPending = new Set(opts.valVersions);
  const stallMs = opts.stallMs ?? 20_000;
  let failure: string | null = null;
  for (const st of stages)
    st.run.done.catch((e: unknown) => {
      failure = `${st.name}: ${errorMessage(e)}`;
    });
  const inputs: Record<string, string> = {
    reward: p.topic('trajectories'),
    advantage: p.topic('scored'),
    update: p.topic('updates'),
  };
  for (;;) {
    if (failure) return { status: 'failed', message: failure, finalStep: version, finalSha256: sha };
    if (opts.signal?.aborted)
      return { status: 'stopped', message: 'interrupted', finalStep: version, finalSha256: sha };
    for (const m of await p.bus.read(p.topic('policy'), 0, pos, 200)) {
      pos = m.offset + 1;
      const r = (await p.codecs.policy.decode(m.value, m.headers)) as PolicyVersion;
      if (r.policy_version >= version) {
        version = r.policy_version;
        sha = r.sha256;
      }
    }
    for (const m of valPending.size ? await p.bus.read(p.topic('control'), 0, ctlPos, 200) : []) {
      ctlPos = m.offset + 1;
      const c = (await p.codecs.control.decode(m.value, m.headers)) as ControlEvent;
      if (c.type === 'val_round_done') valPending.delete(c.val_round_done.round);
    }
    if (version >= target && valPending.size === 0)
      return { status: 'completed', finalStep: version, finalSha256: sha };
    if (version !== lastVersion) {
      lastVersion = version;
      idleSince = Date.now();
    }
    if (Date.now() - idleSince > stallMs) {
      // every stage has consumed everything and still no new version: the recorded groups cannot complete the next step
      let caughtUp = true;
      for (const st of stages) {
        if (!inputs[st.name]) continue; // controller and rollout: validation only
        const committed = await st.run.consumer.committed();
        const ends = await p.bus.endOffsets(inputs[st.name]);
        ends.forEach((end, part) => {
          if ((committed.find((c) => c.topic === inputs[st.name] && c.partition === part)?.offset ?? 0) < end)
            caughtUp = false;
        });
      }
      if (caughtUp && version >= target) {
        return {
          status: 'failed',
          finalStep: version,
          finalSha256: sha,
          message: `replay trained every step (${target}) but the validation rounds of policy versions ${[...valPending].join(', ')} did not finish within ${Math.round(stallMs / 1000)} s; see the rollout stage's errors in the log`,
        };
      }
      if (caughtUp) {
        return {
          status: 'failed',
          finalStep: version,
          finalSha256: sha,
          message: `replay stalled at step ${version + 1} of ${target}: the recorded trajectories of that step do not give data.rollout_batch_size kept groups under this config (online filtering or reward failures want refills the source never generated); replay up to --until-step ${version}, or relax the filter`,
        };
      }
      idleSince = Date.now();
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}
