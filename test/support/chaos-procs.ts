/**
 * Helpers for the crash and chaos tests: `rlstream` child processes with their whole output kept
 * (bounded), SIGKILL by PID, the crash-point trace (lib/pipeline/crash-points.ts) read back into
 * "which phase was the process in when it died", and a seeded, bounded chaos harness that kills
 * and restarts the stage processes of a distributed run.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { mkdirSync, writeFileSync } from 'node:fs';
import { Rng } from '../../lib/util/rng.ts';
import { ROOT, SERVE_ENV } from '../../devkit/pipeline-procs.ts';

export interface CliProc {
  child: ChildProcess;
  pid: number;
  startedAt: number;
  exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  output(): string;
  /** Resolves when the output contains `pattern` (or the process exits: then false). */
  waitFor(pattern: RegExp, timeoutMs: number): Promise<boolean>;
}

const MAX_OUTPUT = 4 * 1024 * 1024;

/** Starts `node bin/rlstream.mjs …args` with JSON logs and `env` added. */
export function spawnCli(args: string[], env: NodeJS.ProcessEnv = {}): CliProc {
  const child = spawn(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), ...args], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, RLSTREAM_LOG_JSON: '1', ...SERVE_ENV, ...env },
  });
  let out = '';
  const listeners = new Set<() => void>();
  const onData = (d: Buffer) => {
    out += d.toString('utf8');
    if (out.length > MAX_OUTPUT) out = out.slice(-MAX_OUTPUT);
    for (const l of listeners) l();
  };
  child.stdout!.on('data', onData);
  child.stderr!.on('data', onData);
  const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) =>
    child.on('close', (code, signal) => {
      for (const l of listeners) l();
      r({ code, signal });
    }),
  );
  let exited = false;
  void exit.then(() => {
    exited = true;
  });
  return {
    child,
    pid: child.pid!,
    startedAt: Date.now(),
    exit,
    output: () => out,
    waitFor(pattern, timeoutMs) {
      return new Promise((resolve) => {
        const check = () => {
          if (pattern.test(out)) {
            done(true);
            return;
          }
          if (exited || child.exitCode !== null || child.signalCode !== null) done(false);
        };
        const timer = setTimeout(() => done(false), timeoutMs);
        const done = (v: boolean) => {
          clearTimeout(timer);
          listeners.delete(check);
          resolve(v);
        };
        listeners.add(check);
        check();
      });
    },
  };
}

/** SIGKILLs a child by PID (if still running) and waits for it. */
export async function killHard(p: CliProc): Promise<void> {
  if (p.child.exitCode === null && p.child.signalCode === null) {
    try {
      process.kill(p.pid, 'SIGKILL');
    } catch {
      /* already gone */
    }
  }
  await p.exit;
}

/** The phase a crash point belongs to. */
export function phaseOf(point: string | null): string {
  if (!point) return 'before its first batch';
  const [stage, at] = point.split(':');
  if (at === 'handled') return `between batches (${stage})`;
  if (stage === 'checkpoint') return 'checkpoint write';
  return stage;
}

/** The last crash point a traced process reached (RLSTREAM_CRASH_TRACE=1), or null. */
export function lastCrashPoint(output: string): string | null {
  const all = [...output.matchAll(/^rlstream-crash-point ([a-z]+:[a-z-]+)$/gm)];
  return all.length ? all[all.length - 1][1] : null;
}

/** Whether the process killed itself at a RLSTREAM_CRASH_AT point, and which. */
export function selfKilledAt(output: string): string | null {
  return /rlstream-crash-point: SIGKILL at ([a-z]+:[a-z-]+@\d+)/.exec(output)?.[1] ?? null;
}

/** "resumed at step S, epoch E, prompt P of T, from …" lines of a process's log. */
export function resumeLines(
  output: string,
): Array<{ step: number; epoch: number; prompt: number; of: number; text: string }> {
  const out: Array<{ step: number; epoch: number; prompt: number; of: number; text: string }> = [];
  for (const m of output.matchAll(/"msg":"(resumed at step (\d+), epoch (\d+), prompt (\d+) of (\d+), from [^"]*)"/g)) {
    out.push({ text: m[1], step: Number(m[2]), epoch: Number(m[3]), prompt: Number(m[4]), of: Number(m[5]) });
  }
  return out;
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Resolves to null after `ms` without keeping the process alive (for Promise.race deadlines). */
export const deadline = (ms: number) => new Promise<null>((r) => setTimeout(() => r(null), ms).unref());

export { Rng };

// ------------------------------------------------------------------------------------------------
// Distributed chaos: the five stages as `rlstream serve` processes, killed and restarted.

export interface ChaosKill {
  at_s: number;
  stage: string;
  pid: number;
  how: string;
  phase: string;
  point: string | null;
  uptime_s: number;
}

export interface ChaosOptions {
  configFile: string;
  overrides: string[];
  stages: readonly string[];
  seed: number;
  /** Stop killing after this many kills (external SIGKILLs and crash-point self-kills together). */
  maxKills: number;
  /** Delay between external kills, uniform in [min, max] ms. */
  intervalMs: [number, number];
  /** A process is killed from outside only once it has been up this long (startup takes seconds). */
  minUptimeMs: number;
  /**
   * Crash points per stage, in order: the k-th process of a stage (the first one, then each
   * restart) arms RLSTREAM_CRASH_AT with the k-th point of its list (while there are any), so some kills land exactly in rollout, update
   * or a checkpoint write rather than wherever the clock says. An armed process is not killed
   * from outside: it dies at its point (or finishes if the run ends first).
   */
  hooks?: Record<string, string[]>;
  /** Restart a killed stage after this delay (ms). */
  restartDelayMs: number;
  /** Hard limit on the whole run (ms): everything is killed then. */
  timeoutMs: number;
  env?: NodeJS.ProcessEnv;
  log?: (line: string) => void;
  /**
   * A fault the test injects that makes a stage exit with an error by design (a full disk): a
   * process whose output matches `pattern` when it exits non-zero is recorded as a kill, `fix()`
   * runs (space is freed), and the stage is restarted with the same command.
   */
  expectedFault?: { pattern: RegExp; fix(): Promise<void> };
}

interface Slot {
  stage: string;
  proc: CliProc;
  hook: string | null;
  killedByUs: boolean;
  outputs: string[];
}

/**
 * Runs the stages until every one exits with code 0 after the run is done, killing a seeded
 * random stage (SIGKILL, at a seeded random time) and letting seeded crash points kill others,
 * at most `maxKills` times in all, restarting each killed process. Bounded: after `timeoutMs`
 * everything is killed and `run()` rejects with the outputs.
 */
export class ChaosHarness {
  readonly kills: ChaosKill[] = [];
  private readonly slots: Slot[] = [];
  private readonly rng: Rng;
  private stopped = false;
  private readonly t0 = Date.now();
  /** Called about every 100 ms while the run goes on (e.g. a PostgreSQL restart once the run has progressed). */
  onTick?: () => Promise<void>;
  private readonly starts = new Map<string, number>();

  constructor(private readonly o: ChaosOptions) {
    this.rng = Rng.fromSeed(`chaos:${o.seed}`);
  }

  private start(stage: string): Slot {
    const k = this.starts.get(stage) ?? 0;
    this.starts.set(stage, k + 1);
    const hook = this.kills.length < this.o.maxKills ? (this.o.hooks?.[stage]?.[k] ?? null) : null;
    const env: NodeJS.ProcessEnv = {
      RLSTREAM_CRASH_TRACE: '1',
      ...(this.o.env ?? {}),
      ...(hook ? { RLSTREAM_CRASH_AT: hook } : {}),
    };
    return {
      stage,
      proc: spawnCli(['serve', stage, this.o.configFile, ...this.o.overrides, '--replica', '0'], env),
      hook,
      killedByUs: false,
      outputs: [],
    };
  }

  /** All output of a stage's processes so far (oldest first). */
  outputs(stage: string): string[] {
    const s = this.slots.find((x) => x.stage === stage)!;
    return [...s.outputs, s.proc.output()];
  }

  private async record(slot: Slot, how: string, point: string | null): Promise<void> {
    const uptime = (Date.now() - slot.proc.startedAt) / 1000;
    const bare = point?.replace(/@\d+$/, '') ?? null;
    this.kills.push({
      at_s: Math.round((Date.now() - this.t0) / 100) / 10,
      stage: slot.stage,
      pid: slot.proc.pid,
      how,
      phase: phaseOf(bare),
      point: bare,
      uptime_s: Math.round(uptime * 10) / 10,
    });
    this.o.log?.(
      `chaos: kill #${this.kills.length} ${slot.stage} (pid ${slot.proc.pid}, up ${uptime.toFixed(1)} s, ${how}) in ${phaseOf(bare)}${bare ? ` [${bare}]` : ''}`,
    );
    await sleep(this.o.restartDelayMs);
    const next = this.start(slot.stage);
    slot.outputs.push(slot.proc.output());
    slot.proc = next.proc;
    slot.hook = next.hook;
    slot.killedByUs = false;
  }

  async run(): Promise<void> {
    for (const stage of this.o.stages) this.slots.push(this.start(stage));
    const deadline = this.t0 + this.o.timeoutMs;
    const [lo, hi] = this.o.intervalMs;
    let nextKillAt = Date.now() + lo + this.rng.next() * (hi - lo);
    try {
      while (Date.now() < deadline) {
        await sleep(100);
        const ended = (s: Slot) => s.proc.child.exitCode !== null || s.proc.child.signalCode !== null;
        // processes that ended by themselves: 0 = the run is done for it; a crash point's SIGKILL = a kill; else failure
        for (const s of this.slots) {
          if (!ended(s) || s.killedByUs) continue;
          const ex = await s.proc.exit;
          if (ex.code === 0) continue;
          const self = selfKilledAt(s.proc.output());
          if (ex.signal === 'SIGKILL' && self) {
            await this.record(s, `RLSTREAM_CRASH_AT=${s.hook}`, self);
            continue;
          }
          const fault = this.o.expectedFault;
          if (fault && fault.pattern.test(s.proc.output())) {
            await fault.fix();
            await this.record(
              s,
              `exit ${ex.code}: ${fault.pattern.exec(s.proc.output())![0]}`,
              lastCrashPoint(s.proc.output()),
            );
            continue;
          }
          throw new Error(`${s.stage} exited with ${JSON.stringify(ex)}:\n${s.proc.output().slice(-4000)}`);
        }
        if (this.slots.every((s) => s.proc.child.exitCode === 0)) return;
        if (this.onTick) await this.onTick();
        const runDone = this.slots.some((s) => s.proc.child.exitCode === 0);
        if (this.stopped || runDone || this.kills.length >= this.o.maxKills || Date.now() < nextKillAt) continue;
        const candidates = this.slots.filter(
          (s) => !ended(s) && !s.hook && Date.now() - s.proc.startedAt >= this.o.minUptimeMs,
        );
        if (!candidates.length) continue;
        const victim = candidates[this.rng.int(candidates.length)];
        victim.killedByUs = true;
        await killHard(victim.proc);
        await this.record(victim, 'random SIGKILL', lastCrashPoint(victim.proc.output()));
        nextKillAt = Date.now() + lo + this.rng.next() * (hi - lo);
      }
      throw new Error(
        `chaos run did not finish within ${this.o.timeoutMs} ms (${this.kills.length} kills); last output:\n${this.slots.map((s) => `--- ${s.stage}\n${s.proc.output().slice(-2500)}`).join('\n')}`,
      );
    } finally {
      await this.stop();
    }
  }

  /** Kills every process still running (by PID); with RLSTREAM_CHAOS_DUMP=<dir>, writes every process's output there. */
  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all(this.slots.map((s) => killHard(s.proc)));
    const dump = process.env.RLSTREAM_CHAOS_DUMP;
    if (dump) {
      mkdirSync(dump, { recursive: true });
      for (const s of this.slots)
        writeFileSync(
          join(dump, `${s.stage}.log`),
          this.outputs(s.stage)
            .map((o, i) => `===== process ${i + 1}\n${o}`)
            .join('\n'),
        );
    }
  }
}
