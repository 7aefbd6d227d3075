/**
 * The state `rlstream runs` shows for a run over PostgreSQL, from its stored status and its stages'
 * heartbeats (table stage_heartbeats, lib/pipeline/heartbeat.ts). Pure: the clock (`nowMs`, the
 * database's now() when listing) is passed in.
 *
 *  - completed → finished; failed → failed: the stored end is the truth, whatever the heartbeats say.
 *  - running or stopped, with a stage live (state running, heartbeat younger than its lease) →
 *    running: a stopped or killed run that was resumed is running again.
 *  - running, no heartbeat row at all → running (nothing to judge by: a run without stage processes
 *    over PostgreSQL, or written by an rlstream without heartbeats).
 *  - running, no stage live, every row stopped (SIGTERM) or done → stopped.
 *  - running, no stage live, a row still running past its lease or crashed → stale: its processes
 *    were killed (SIGKILL, a lost node) or died; starting the stages again resumes it.
 *  - stopped (stored by `rlstream train` on SIGTERM), no stage live → stopped.
 */

export const LEASE_STATES = ['running', 'stopped', 'done', 'crashed'] as const;
export type LeaseState = (typeof LEASE_STATES)[number];

export interface StageLease {
  stage: string;
  replica: number;
  /** host:pid of the process that holds (or held) the lease. */
  holder: string;
  state: LeaseState;
  heartbeatAtMs: number;
  leaseMs: number;
  error: string | null;
}

export type StageLiveness = 'live' | 'lost' | 'stopped' | 'done' | 'crashed';

export interface StageView {
  /** `stage` or `stage#replica` when the stage has replicas. */
  name: string;
  liveness: StageLiveness;
  /** Seconds since the stage's last heartbeat. */
  ageS: number;
  holder: string;
  error: string | null;
}

export interface RunStateView {
  /** Shown status: running, finished, failed, stopped, stale. */
  status: string;
  /** One entry per stage and replica (empty when the run has no heartbeat rows). */
  stages: StageView[];
  /** Why a run is shown stale, naming the stages; else null. */
  note: string | null;
}

/** The status a listing shows for a stored status: `completed` is shown as `finished`. */
export function shownStatus(stored: string): string {
  return stored === 'completed' ? 'finished' : stored;
}

export function stageLiveness(l: StageLease, nowMs: number): StageLiveness {
  if (l.state !== 'running') return l.state;
  return nowMs - l.heartbeatAtMs <= l.leaseMs ? 'live' : 'lost';
}

export function runState(stored: string, leases: readonly StageLease[], nowMs: number): RunStateView {
  const replicas = new Map<string, number>();
  for (const l of leases) replicas.set(l.stage, (replicas.get(l.stage) ?? 0) + 1);
  const stages = [...leases]
    .sort((a, b) => a.stage.localeCompare(b.stage) || a.replica - b.replica)
    .map((l): StageView => ({
      name: (replicas.get(l.stage) ?? 0) > 1 || l.replica > 0 ? `${l.stage}#${l.replica}` : l.stage,
      liveness: stageLiveness(l, nowMs),
      ageS: Math.max(0, Math.round((nowMs - l.heartbeatAtMs) / 1000)),
      holder: l.holder,
      error: l.error,
    }));
  const view = (status: string, note: string | null = null): RunStateView => ({ status, stages, note });
  if (stored !== 'running' && stored !== 'stopped') return view(shownStatus(stored));
  if (stages.some((s) => s.liveness === 'live')) return view('running');
  if (stages.length === 0) return view(stored);
  if (stored === 'stopped' || stages.every((s) => s.liveness === 'stopped' || s.liveness === 'done'))
    return view('stopped');
  const gone = stages.filter((s) => s.liveness === 'lost' || s.liveness === 'crashed');
  return view(
    'stale',
    `still marked running, but no stage holds its lease: ${gone.map(describeGone).join('; ')} (killed?); start the stages again to resume it`,
  );
}

function describeGone(s: StageView): string {
  return s.liveness === 'crashed'
    ? `${s.name} (${s.holder}) exited with an error${s.error ? `: ${s.error}` : ''}`
    : `${s.name} (${s.holder}) last heartbeat ${s.ageS} s ago`;
}

/** The stages column of `rlstream runs`: `controller live, rollout#1 lost 42 s, update stopped`. */
export function stagesText(stages: readonly StageView[]): string | null {
  if (stages.length === 0) return null;
  return stages.map((s) => `${s.name} ${s.liveness}${s.liveness === 'lost' ? ` ${s.ageS} s` : ''}`).join(', ');
}
