/**
 * pino logging. Every line carries `run_id` and `stage`. JSON lines on a non-TTY stderr (never
 * dropped: pino writes synchronously to fd 2), pretty output when stderr is a TTY.
 */
import pino, { type Logger } from 'pino';
import { prettyFactory } from 'pino-pretty';

export type { Logger };

export interface LogOptions {
  runId: string;
  /** The stage of every line; omit for a process that hosts several stages (each logs through `forStage`). */
  stage?: string;
  level?: string;
  /** Force pretty (true) or JSON (false); default: pretty iff stderr is a TTY and RLSTREAM_LOG_JSON is unset. */
  pretty?: boolean;
  /** Write to this file descriptor or path instead of stderr. */
  destination?: number | string;
  /**
   * Hand every line (formatted, ending in a newline) to this sink, synchronously in this thread,
   * instead of writing to a file descriptor: `rlstream train` prints them above its progress bar.
   */
  sink?: { write(line: string): void };
}

export function createLogger(opts: LogOptions): Logger {
  const level = opts.level ?? process.env.RLSTREAM_LOG_LEVEL ?? 'info';
  const pretty = opts.pretty ?? (process.stderr.isTTY === true && !process.env.RLSTREAM_LOG_JSON);
  const base = opts.stage ? { run_id: opts.runId, stage: opts.stage } : { run_id: opts.runId };
  const redact = {
    paths: ['*.password', '*.token', '*.authorization', 'config.pipeline.database_url', '*.database_url'],
    censor: '[redacted]',
  };
  if (opts.sink) {
    const sink = opts.sink;
    const format = pretty
      ? prettyFactory({ colorize: true, ignore: 'pid,hostname', translateTime: 'HH:MM:ss', singleLine: true })
      : null;
    const stream = { write: (line: string) => sink.write(format ? format(line) : line) };
    return pino(
      pretty ? { level, base, redact } : { level, base, redact, timestamp: pino.stdTimeFunctions.isoTime },
      stream,
    );
  }
  if (pretty) {
    const stream = pino.transport({
      target: 'pino-pretty',
      options: { destination: 2, colorize: true, ignore: 'pid,hostname', translateTime: 'HH:MM:ss' },
    });
    return pino({ level, base, redact }, stream);
  }
  const dest = pino.destination({ dest: opts.destination ?? 2, sync: true });
  return pino({ level, base, redact, timestamp: pino.stdTimeFunctions.isoTime }, dest);
}

/** A logger that drops everything (tests). Still a real pino logger, so child() etc. work. */
export function silentLogger(runId = 'test', stage = 'test'): Logger {
  return pino({ level: 'silent', base: { run_id: runId, stage } });
}

/**
 * The logger of one stage: a child carrying `stage`, unless the parent already carries one
 * (then it is returned as is, so no line has the key twice).
 */
export function forStage(log: Logger, stage: string): Logger {
  return 'stage' in log.bindings() ? log : log.child({ stage });
}
