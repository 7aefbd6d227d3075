import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import {
  formatResultCsv,
  formatResultJson,
  formatResultTable,
  type QueryResult,
} from '../../../lib/analysis/format.ts';
import { describeRelations, READER_ROLE, runReadOnlyQuery, superuserRole } from '../../../lib/analysis/query.ts';
import { RlError } from '../../../lib/errors.ts';
import { locateRun, openRun } from '../../../lib/analysis/target.ts';

/** Where a command prints (tests pass collectors; the CLI uses the process streams). */
export interface CommandIo {
  out(text: string): void;
  err(text: string): void;
}

export const processIo: CommandIo = {
  out: (t) => {
    process.stdout.write(t);
  },
  err: (t) => {
    process.stderr.write(t);
  },
};

/** Prints a result in the chosen format (shared by `sql` and `runs`). */
export function printResult(
  io: CommandIo,
  res: QueryResult,
  format: 'table' | 'csv' | 'json',
  opts: { maxWidth?: number; footer?: boolean } = {},
): void {
  if (format === 'csv') io.out(formatResultCsv(res));
  else if (format === 'json') io.out(formatResultJson(res));
  else {
    io.out(formatResultTable(res, { maxWidth: opts.maxWidth }) + '\n');
    if (opts.footer ?? true) io.out(`(${res.rows.length} row${res.rows.length === 1 ? '' : 's'})\n`);
  }
}

/** --csv / --json (at most one) → the output format. */
export function outputFormat(booleans: Set<string>): 'table' | 'csv' | 'json' {
  if (booleans.has('csv') && booleans.has('json')) throw new UsageError('choose one of --csv and --json');
  return booleans.has('csv') ? 'csv' : booleans.has('json') ? 'json' : 'table';
}

/** statement_timeout of `rlstream sql` unless --timeout-s says otherwise. */
export const DEFAULT_TIMEOUT_S = 300;

function nonNegative(v: string | undefined, flag: string): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0) throw new UsageError(`${flag} must be a number ≥ 0, got "${v}"`);
  return n;
}

/** `rlstream sql <run-or-url> "<query>"`: one read-only query against a run's store. */
export const sqlCommand: Command = {
  name: 'sql',
  summary: "Run a read-only SQL query against a run's store (embedded run directory or PostgreSQL) and print the rows",
  usage:
    'rlstream sql <run-dir | postgres://…> "<query>" [--csv | --json] [--max-width N] [--timeout-s S]\n       rlstream sql <run-dir | postgres://…> --views',
  help: [
    'The query runs inside BEGIN TRANSACTION READ ONLY and is rolled back: it can read every table and',
    'view but never change the run. One statement per call. A run directory held by a live training',
    'process is read through a snapshot that process takes when asked (the numbers of that moment).',
    '',
    'arguments:',
    '  run-dir           a run directory with db/pgdata/ (e.g. runs/number-game), or a run name under runs/',
    '  postgres://…      a PostgreSQL URL (one database may hold many runs: filter with where run_id = …)',
    '  query             one SQL statement, quoted',
    '',
    'options:',
    '  --csv             print CSV (full arrays and text) instead of a table',
    '  --json            print a JSON array of row objects (NaN/Infinity as strings)',
    '  --max-width N     cut table cells longer than N characters with … (default 60, 0 = never)',
    '  --timeout-s S     cancel the query after S seconds (default 300; 0: no limit)',
    '  --views           list the analysis views and tables with their columns',
    '',
    'views: v_step_metrics_wide, v_step_times, v_reward_by_prompt, v_response_length, v_kl_entropy,',
    '  v_filtered_groups, v_reward_failures, v_staleness, v_checkpoint_lineage, v_dead_letters, v_runs;',
    '  tables: runs, trajectories, step_metrics, checkpoints, val_generations, dead_letters.',
    '  Example queries: docs/queries.md.',
    '',
    'example:',
    '  rlstream sql runs/number-game "select step, reward_mean, kl_mean from v_step_metrics_wide order by step"',
  ].join('\n'),
  run: (argv) => runSql(argv, processIo),
};

/** `rlstream sql` with its output sent to `io`. */
export async function runSql(argv: string[], io: CommandIo): Promise<number> {
  const { positionals, flags, booleans } = parseArgs(argv, {
    flags: ['max-width', 'timeout-s'],
    booleans: ['csv', 'json', 'views'],
  });
  const format = outputFormat(booleans);
  const maxWidth = nonNegative(flags['max-width'], '--max-width');
  // a statement_timeout always, so a runaway analysis query cannot hold a run's database (--timeout-s 0 lifts it)
  const timeoutS = nonNegative(flags['timeout-s'], '--timeout-s') ?? DEFAULT_TIMEOUT_S;
  const [spec, query, ...extra] = positionals;
  if (!spec) throw new UsageError('give the run directory (or postgres:// URL) and the query');
  if (booleans.has('views')) {
    if (query !== undefined) throw new UsageError('--views takes no query');
  } else {
    if (query === undefined) throw new UsageError('give the query as one quoted argument after the run');
    if (extra.length) throw new UsageError(`unexpected argument "${extra[0]}": quote the whole query as one argument`);
  }
  const database = await openRun(locateRun(spec), { onSnapshot: (note) => io.err(`${note}\n`) });
  try {
    const su = await superuserRole(database);
    if (su)
      throw new RlError(
        `rlstream sql does not run queries as the superuser ${su}: a query could switch roles and then signal other sessions or read and write server files. Connect as the read-only role migrate created: ALTER ROLE ${READER_ROLE} LOGIN PASSWORD '…', then rlstream sql postgres://${READER_ROLE}:…@host/db (docs/queries.md, "A read-only role")`,
        { code: 'ERR_SQL_ROLE' },
      );
    const res = booleans.has('views')
      ? await describeRelations(database)
      : await runReadOnlyQuery(database, query!, { timeoutS });
    if (res.columns.length === 0) {
      io.out(`${res.command || 'OK'} (no rows returned)\n`);
      return 0;
    }
    printResult(io, res, format, { maxWidth: booleans.has('views') && maxWidth === undefined ? 0 : maxWidth });
    return 0;
  } finally {
    await database.close();
  }
}
