import { join, resolve } from 'node:path';
import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import { resolveRunId } from '../../../lib/analysis/query.ts';
import { writeReport } from '../../../lib/analysis/report.ts';
import { exportRunToTensorBoard } from '../../../lib/analysis/tensorboard.ts';
import { locateRun, openRun } from '../../../lib/analysis/target.ts';
import { processIo, type CommandIo } from './sql.ts';

/** `rlstream report <run>`: a self-contained HTML report, optionally TensorBoard event files. */
export const reportCommand: Command = {
  name: 'report',
  summary:
    'Write a self-contained HTML report of a run (summary, SVG plots, checkpoints, failures) and optionally TensorBoard event files',
  usage: 'rlstream report <run-dir | postgres://…> [--run RUN_ID] [--out FILE] [--tensorboard] [--tensorboard-dir DIR]',
  help: [
    'Plots reward, validation accuracy, KL, entropy, response length, clip fraction and step time by',
    'stage against the step, with a summary table (steps, final/best validation accuracy, final reward,',
    'status, checkpoints), the checkpoint lineage, filtered groups, reward failures and dead letters;',
    'for a multi-turn run, a few episodes of the last round as conversations (role, text, tool, reward).',
    'The HTML has no scripts and loads nothing from the network.',
    '',
    'options:',
    '  --run RUN_ID        which run, when the database holds several (a PostgreSQL usually does)',
    '  --out FILE          where to write (default: <run-dir>/report.html; report-<run>.html for a URL)',
    '  --tensorboard       also export every step metric as a TensorBoard event file',
    '  --tensorboard-dir D where to write it (default: <run-dir>/tensorboard; tensorboard/<run> for a URL);',
    '                      view with: tensorboard --logdir D',
  ].join('\n'),
  run: (argv) => runReport(argv, processIo),
};

/** `rlstream report` with its output sent to `io`. */
export async function runReport(argv: string[], io: CommandIo): Promise<number> {
  const { positionals, flags, booleans } = parseArgs(argv, {
    flags: ['run', 'out', 'tensorboard-dir'],
    booleans: ['tensorboard'],
  });
  const [spec, ...extra] = positionals;
  if (!spec) throw new UsageError('give the run directory (or postgres:// URL)');
  if (extra.length) throw new UsageError(`unexpected argument "${extra[0]}"`);
  if (flags['tensorboard-dir'] !== undefined) booleans.add('tensorboard');
  const loc = locateRun(spec);
  const database = await openRun(loc, { onSnapshot: (note) => io.err(`${note}\n`) });
  try {
    const runId = await resolveRunId(database, flags.run);
    const out = resolve(flags.out ?? (loc.runDir ? join(loc.runDir, 'report.html') : `report-${runId}.html`));
    const rep = await writeReport(database, runId, out, { generatedAt: new Date() });
    const empty = rep.plots.filter((p) => p.series === 0).map((p) => p.id);
    io.out(`report written: ${rep.path}${empty.length ? ` (no data for: ${empty.join(', ')})` : ''}\n`);
    if (booleans.has('tensorboard')) {
      const dir = resolve(
        flags['tensorboard-dir'] ?? (loc.runDir ? join(loc.runDir, 'tensorboard') : join('tensorboard', runId)),
      );
      const tb = await exportRunToTensorBoard(database.db, runId, dir);
      io.out(
        `tensorboard events written: ${tb.path} (${tb.scalars} scalars, ${tb.tags.length} tags); view with: tensorboard --logdir ${dir}\n`,
      );
    }
    return 0;
  } finally {
    await database.close();
  }
}
