import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import { openDatabase } from '../../../lib/db/database.ts';
import type { QueryResult } from '../../../lib/analysis/format.ts';
import { isDatabaseUrl } from '../../../lib/analysis/target.ts';
import { listRunsInDatabase, listRunsInDir, stagesText, type RunSummary } from '../../../lib/analysis/runs.ts';
import { outputFormat, printResult, processIo, type CommandIo } from './sql.ts';
import { basename } from 'node:path';

const mb = (b: number | null) => (b === null ? null : Math.round(b / 1e5) / 10);

const COLUMNS: Array<[string, (r: RunSummary) => unknown]> = [
  ['run_id', (r) => r.runId],
  ['status', (r) => r.status],
  ['steps', (r) => r.steps],
  ['last_step', (r) => r.lastStep],
  ['final_reward', (r) => r.finalRewardMean],
  ['best_val_acc', (r) => r.bestValAccuracy],
  ['best_val_step', (r) => r.bestValStep],
  ['checkpoints', (r) => r.checkpoints],
  ['trajectories', (r) => r.trajectories],
  ['dead_letters', (r) => r.deadLetters],
  ['versions_mb', (r) => mb(r.versionsBytes)],
  ['disk_mb', (r) => mb(r.dirBytes)],
  ['parent', (r) => r.parentRunId],
  ['updated_utc', (r) => r.updatedAt],
  ['error', (r) => r.error],
];

/** Run summaries as a result table (a `dir` column first when listing run directories). */
export function runsResult(runs: readonly RunSummary[], withDir: boolean): QueryResult {
  const cols: Array<[string, (r: RunSummary) => unknown]> = withDir
    ? [['dir', (r) => (r.dir ? basename(r.dir) : null)], ...COLUMNS]
    : [...COLUMNS, ['stages', (r) => stagesText(r.stages)]];
  return {
    columns: cols.map(([name]) => ({ name, typeId: 0 })),
    rows: runs.map((r) => cols.map(([, get]) => get(r) ?? null)),
    command: 'SELECT',
  };
}

/** `rlstream runs`: the runs found in a runs directory or a PostgreSQL, with status, steps, best validation score. */
export const runsCommand: Command = {
  name: 'runs',
  summary:
    'List runs (status, steps, final reward, best validation accuracy, checkpoints) from a runs directory or a PostgreSQL',
  usage: 'rlstream runs [--runs-dir DIR | --db postgres://…] [--csv | --json]',
  help: [
    'Without options, every subdirectory of ./runs that holds an embedded store (db/pgdata/) is opened in',
    'turn and summarised; a directory held by a live training process is read from its snapshot.',
    'status: running (its process is alive), finished (ended normally; v_runs.status "completed"),',
    '  failed (error says why), stopped (SIGTERM or Ctrl-C: the same command resumes it), stale (still',
    '  marked running, but no live process holds the run directory: it was killed; the same command resumes it).',
    'With --db, every row of the runs table of that PostgreSQL is listed. There each stage process holds a',
    '  lease it renews every pipeline.heartbeat_seconds: running (a stage holds its lease), stopped (every stage',
    '  stopped on SIGTERM), stale (still marked running, but every lease is older than pipeline.lease_seconds:',
    '  its processes were killed; starting the stages again resumes it). The stages column shows each stage',
    '  (stage#replica) as live, lost (heartbeat older than its lease, with its age), stopped, done or crashed.',
    '',
    'options:',
    '  --runs-dir DIR    parent directory of the run directories (default: runs)',
    '  --db URL          a PostgreSQL URL (postgres://user@host:5432/db) instead of run directories',
    '  --csv | --json    machine-readable output',
    '',
    'columns: steps = distinct steps with training metrics; final_reward = reward/mean at the last step;',
    "  versions_mb = the policy, critic and EMA versions and the kept checkpoints' optimizer states its policy store holds now (MB; trainer.keep_policy_versions",
    '  and the retention rule of docs/durability.md bound it); disk_mb = everything under the run directory',
    '  (run directories only; files a checkpoint hard-links to a version counted once).',
    '  best_val_acc = highest val/accuracy (at best_val_step). Same data: rlstream sql <run> "select * from v_runs".',
  ].join('\n'),
  run: (argv) => runRuns(argv, processIo),
};

/** `rlstream runs` with its output sent to `io`. */
export async function runRuns(argv: string[], io: CommandIo): Promise<number> {
  const { positionals, flags, booleans } = parseArgs(argv, { flags: ['runs-dir', 'db'], booleans: ['csv', 'json'] });
  const format = outputFormat(booleans);
  if (positionals.length)
    throw new UsageError(`unexpected argument "${positionals[0]}" (use --runs-dir DIR or --db URL)`);
  if (flags['runs-dir'] !== undefined && flags.db !== undefined)
    throw new UsageError('choose one of --runs-dir and --db');
  let runs: RunSummary[];
  if (flags.db !== undefined) {
    if (!isDatabaseUrl(flags.db)) throw new UsageError(`--db needs a postgres:// URL, got "${flags.db}"`);
    const database = await openDatabase({ kind: 'postgres', url: flags.db, poolSize: 2 }, { migrate: false });
    try {
      runs = await listRunsInDatabase(database);
    } finally {
      await database.close();
    }
  } else {
    runs = await listRunsInDir(flags['runs-dir'] ?? 'runs');
  }
  const withDir = flags.db === undefined;
  if (runs.length === 0 && format === 'table') {
    io.out(
      withDir
        ? `no run directories (with db/pgdata/) under ${flags['runs-dir'] ?? 'runs'}\n`
        : 'no runs in that database\n',
    );
    return 0;
  }
  printResult(io, runsResult(runs, withDir), format, { footer: false });
  for (const r of runs) if (r.note && format === 'table') io.err(`${r.dir ? basename(r.dir) : r.runId}: ${r.note}\n`);
  return 0;
}
