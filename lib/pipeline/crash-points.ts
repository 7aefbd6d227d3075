/**
 * TEST HOOK for the crash tests (test/e2e/crash*.test.ts, chaos*.test.ts) — never set in
 * production. The stages call `crashPoint(name)` at the points where a crash is most
 * interesting (mid-rollout, after an update, half-way through a checkpoint write, before a batch
 * commits). With neither variable below set, a call is one boolean check and does nothing.
 *
 *  - `RLSTREAM_CRASH_AT="<point>[@<n>][,…]"`: this process SIGKILLs itself the n-th time (default
 *    the 1st) it reaches `<point>` — a kill -9 at an exact place, with no cleanup of any kind.
 *  - `RLSTREAM_CRASH_STOP=1`: at that point the process stops itself (SIGSTOP) instead, so a test
 *    can fail the machine under it (abort its file system) before killing it: a machine crash.
 *  - `RLSTREAM_CRASH_TRACE=1`: every point reached is written to stderr as
 *    `rlstream-crash-point <point>` (synchronously), so a test that kills the process from
 *    outside at a random time can tell which phase the kill landed in.
 *
 * Points (see CRASH_POINTS): `<stage>:handled` is reached by every stage after its handler has
 * run and its outputs are buffered, before the batch commits; `bus:committed` right after a
 * batch of the embedded log committed (its outputs, state and offsets in one transaction).
 */
import { writeSync } from 'node:fs';
import { ConfigError } from '../errors.ts';

export const CRASH_POINTS = [
  'rollout:start',
  'rollout:generated',
  // multi-turn: an environment answered an episode's turn (episodes of the batch in flight)
  'rollout:env-answered',
  'reward:start',
  'reward:scored',
  'advantage:start',
  'advantage:computed',
  'update:start',
  'update:trained',
  // a policy version's files are in its temporary directory, not yet renamed into place
  'update:version-half-written',
  'update:version-written',
  // a version kept in memory only is being sealed (sha256, bf16 rounding) by the seal worker
  'update:sealing',
  // the prune after a batch has removed one stored version and may remove more
  'update:pruning',
  'checkpoint:start',
  'checkpoint:half-written',
  'checkpoint:renamed',
  'checkpoint:recorded',
  'controller:handled',
  'rollout:handled',
  'reward:handled',
  'advantage:handled',
  'update:handled',
  'bus:committed',
  // rlstream sft: after a step's update and metrics rows, before its checkpoint (if any)
  'sft:trained',
] as const;
export type CrashPointName = (typeof CRASH_POINTS)[number];

/** Parses RLSTREAM_CRASH_AT; unknown points are a ConfigError naming the valid ones. */
export function parseCrashSpec(spec: string | undefined): Map<string, number> {
  const out = new Map<string, number>();
  if (!spec) return out;
  for (const part of spec
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)) {
    const m = /^([a-z]+:[a-z-]+)(?:@(\d+))?$/.exec(part);
    if (!m || !(CRASH_POINTS as readonly string[]).includes(m[1]) || (m[2] !== undefined && Number(m[2]) < 1)) {
      throw new ConfigError(
        `RLSTREAM_CRASH_AT: "${part}" is not <point>[@n] with n ≥ 1; points: ${CRASH_POINTS.join(', ')}`,
      );
    }
    out.set(m[1], m[2] === undefined ? 1 : Number(m[2]));
  }
  return out;
}

const crashAt = parseCrashSpec(process.env.RLSTREAM_CRASH_AT);
const trace = process.env.RLSTREAM_CRASH_TRACE === '1';
const stopInstead = process.env.RLSTREAM_CRASH_STOP === '1';
const active = crashAt.size > 0 || trace;
const hits = new Map<string, number>();

export function crashPoint(point: CrashPointName, detail?: string): void {
  if (!active) return;
  const n = (hits.get(point) ?? 0) + 1;
  hits.set(point, n);
  if (trace) writeSync(2, `rlstream-crash-point ${point}${detail ? ` ${detail}` : ''}\n`);
  if (crashAt.get(point) === n) {
    const signal = stopInstead ? 'SIGSTOP' : 'SIGKILL';
    writeSync(2, `rlstream-crash-point: ${signal} at ${point}@${n}${detail ? ` ${detail}` : ''} (RLSTREAM_CRASH_AT)\n`);
    process.kill(process.pid, signal);
  }
}
