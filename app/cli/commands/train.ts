import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import { loadConfig, formatResolvedConfig, resolveRunId, notApplicableLine } from '../../../lib/config/index.ts';
import type { Translation } from '../../../lib/config/dialects/index.ts';
import { createLogger } from '../../../lib/log.ts';
import { trainEmbedded } from '../../run.ts';
import { ConsoleSink, ProgressBar } from '../../../lib/console/progress.ts';

export function configArgs(positionals: string[]): { file?: string; overrides: string[] } {
  const file = positionals[0] && !positionals[0].includes('=') ? positionals[0] : undefined;
  const overrides = positionals.slice(file ? 1 : 0);
  for (const o of overrides) if (!o.includes('=')) throw new UsageError(`expected an override a.b.c=value, got "${o}"`);
  return { file, overrides };
}

/** A dialect config's not-applicable keys, once, on stderr ("not applicable here: …"). */
export function printNotApplicable(t: Translation): void {
  const line = notApplicableLine(t);
  if (line) console.error(line);
}

/**
 * Ctrl-C (SIGINT) or SIGTERM: says at once that the run is stopping, calls `onStop` (the log is
 * muted from here on), aborts the signal and remembers which (exit code 130 / 143). The stop is
 * bounded: `graceMs` later, or on a second signal, the process exits with that code whatever is
 * still busy (a reward batch retrying against failing servers) — nothing committed is lost, and
 * the same command continues the run.
 */
export function interruption(
  graceMs: number,
  command: string,
  onStop?: () => void,
  io: { err(line: string): void; exit(code: number): void } = {
    err: (l) => process.stderr.write(`${l}\n`),
    exit: (c) => process.exit(c),
  },
): { signal: AbortSignal; exitCode(): number } {
  const ac = new AbortController();
  let code = 1;
  const what = (sig: NodeJS.Signals) => (sig === 'SIGINT' ? 'Ctrl-C' : sig);
  const on = (sig: NodeJS.Signals) => {
    if (ac.signal.aborted) {
      io.err(
        `rlstream ${command}: second ${what(sig)}: exiting now (nothing committed is lost; run the same command again to continue)`,
      );
      io.exit(code);
      return;
    }
    code = sig === 'SIGINT' ? 130 : 143;
    onStop?.();
    io.err(
      `rlstream ${command}: ${what(sig)}: stopping the run (at most ${graceMs / 1000} s, pipeline.grace_seconds; ${what(sig)} again exits at once)`,
    );
    ac.abort();
    setTimeout(() => {
      io.err(
        `rlstream ${command}: still stopping after ${graceMs / 1000} s: exiting now (nothing committed is lost; run the same command again to continue)`,
      );
      io.exit(code);
    }, graceMs).unref();
  };
  process.on('SIGINT', on);
  process.on('SIGTERM', on);
  return { signal: ac.signal, exitCode: () => code };
}

/**
 * What `rlstream train` and `rlstream sft` share before their run: the config from the arguments,
 * on a terminal a progress bar with the log lines above it (warnings and errors unless --verbose),
 * --print-config, and Ctrl-C / SIGTERM as an abort after which nothing the stopping run logs is
 * printed, bounded by pipeline.grace_seconds (exit code 130 / 143).
 */
export function consoleRun(argv: string[], command: 'train' | 'sft') {
  const { positionals, booleans, flags } = parseArgs(argv, {
    booleans: ['verbose', 'print-config', 'break-lock'],
    flags: ['dialect'],
  });
  if (positionals.length === 0) throw new UsageError('missing the config file');
  const { file, overrides } = configArgs(positionals);
  const cfg = loadConfig({
    file,
    overrides,
    ...(command === 'sft' ? { command } : {}),
    ...(flags.dialect !== undefined ? { dialect: flags.dialect } : {}),
    onWarning: (m) => console.error(`warning: ${m}`),
    onTranslation: printNotApplicable,
  });
  const tty = process.stderr.isTTY === true;
  const bar = tty ? new ProgressBar(process.stderr) : null;
  const sink = new ConsoleSink(bar);
  const level = process.env.RLSTREAM_LOG_LEVEL || (tty && !booleans.has('verbose') ? 'warn' : 'info');
  const log = createLogger({ runId: resolveRunId(cfg), level, sink });
  if (booleans.has('print-config')) process.stderr.write(`# resolved config\n${formatResolvedConfig(cfg)}\n`);
  const stop = interruption(cfg.pipeline.grace_seconds * 1000, command, () => sink.mute());
  return { cfg, log, bar, stop, breakLock: booleans.has('break-lock') };
}

export const trainCommand: Command = {
  name: 'train',
  summary: 'Train a policy: all five stages in this process (embedded default) over the configured bus and store',
  usage:
    'rlstream train <config.yaml> [a.b.c=value …] [--dialect easyr1|verl|mtrl] [--verbose] [--print-config] [--break-lock]',
  help: [
    'Loads the config (defaults → file → overrides), writes it resolved to <run_dir>/config.yaml',
    '(secrets redacted), and runs the controller, rollout, reward, advantage and update stages until',
    'the run is done. A run that was interrupted continues where it stopped when started again with',
    'the same command; a finished one says so, or trains on when trainer.total_epochs / max_steps grew.',
    '',
    'On a terminal: one progress bar redrawn in place, warnings and errors above it, the summary',
    'at the end. Off a terminal: JSON log lines (info and up) on stderr. Ctrl-C stops the run within',
    'pipeline.grace_seconds, a second Ctrl-C at once (exit code 130; run the command again to continue).',
    '',
    'An EasyR1, verl or MTRL config is translated first (recognised by its sections, or named with',
    '--dialect; docs/dialects.md); its overrides use its own key names (Hydra-style, e.g.',
    'actor_rollout_ref.rollout.n=5). Keys that cannot apply here are listed once at start.',
    '',
    'arguments:',
    '  config.yaml     run config (see docs/config.md)',
    '  a.b.c=value     override, value parsed as a YAML scalar (e.g. trainer.max_steps=20)',
    '',
    'options:',
    '  --dialect NAME  read the config as easyr1, verl or mtrl (default: recognised by its sections)',
    '  --verbose       on a terminal, also print the info log lines (steps, validation rounds)',
    '  --print-config  also print the resolved config (it is always written to <run_dir>/config.yaml)',
    "  --break-lock    take over the run directory's lock when another host holds it (a shared",
    '                  volume) and you know no process there uses the directory any more',
  ].join('\n'),
  async run(argv) {
    // after Ctrl-C nothing the stopping stages log is printed: the stop message is the last line
    const { cfg, log, bar, stop, breakLock } = consoleRun(argv, 'train');
    const out = await trainEmbedded(cfg, log, { progress: bar ?? false, signal: stop.signal, breakLock });
    bar?.finish();
    if (out.status === 'completed' && out.message) console.error(out.message);
    console.log(out.summary);
    if (out.status === 'stopped') {
      console.error(
        `rlstream train: run stopped: ${out.message ?? 'interrupted'}; run the same command again to continue`,
      );
      return stop.exitCode();
    }
    if (out.status !== 'completed') {
      console.error(`rlstream train: run ${out.status}${out.message ? `: ${out.message}` : ''}`);
      return 1;
    }
    return 0;
  },
};
