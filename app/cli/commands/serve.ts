import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import { loadConfig, redactSecrets, resolveRunId } from '../../../lib/config/index.ts';
import { createLogger } from '../../../lib/log.ts';
import { serve, gracefulStop, DEFAULT_HTTP_PORT } from '../../serve.ts';
import { STAGES } from '../../../services/index.ts';
import { configArgs } from './train.ts';

function intFlag(
  flags: Record<string, string>,
  name: string,
  min: number,
  max = Number.MAX_SAFE_INTEGER,
): number | undefined {
  if (flags[name] === undefined) return undefined;
  const v = Number(flags[name]);
  if (!Number.isInteger(v) || v < min || v > max)
    throw new UsageError(`--${name} must be an integer from ${min} to ${max}, got ${flags[name]}`);
  return v;
}

export const serveCommand: Command = {
  name: 'serve',
  summary: 'Run one pipeline stage in this process (distributed mode: one process or pod per stage)',
  usage: `rlstream serve <${STAGES.join('|')}> <config.yaml> [--replica N] [--http-port ${DEFAULT_HTTP_PORT}] [--grace-seconds S] [a.b.c=value …]`,
  help: [
    'Runs one stage against the configured bus (pipeline.bus: kafka, or the embedded log over a',
    'shared PostgreSQL) and store, logging JSON lines to stdout (the resolved config, secrets',
    'redacted, is the first line). Several rollout or reward processes may serve one run (give each',
    'its own --replica index). Config: the file, then RLSTREAM_<SECTION>__<KEY>=value environment',
    'overrides (e.g. RLSTREAM_PIPELINE__DATABASE_URL), then a.b.c=value arguments.',
    '',
    'HTTP: GET /healthz (liveness), /readyz (200 only when connected to bus and store, migrations',
    'applied and the consumer joined; 503 with a JSON reason otherwise), /metrics (Prometheus).',
    'Over PostgreSQL the stage waits until `rlstream migrate` has applied the migrations it needs.',
    'SIGTERM: stops fetching, abandons the batch in hand uncommitted, leaves the consumer group,',
    'closes bus and store and exits 0 within the grace period; a second signal exits at once.',
    'When the run has finished (or failed) the stage stays up idle (pipeline.on_run_end = idle):',
    '/readyz says so and rlstream_run_finished = 1; on_run_end = exit returns instead.',
    '',
    'options:',
    '  --replica N         replica index of this process (reward replicas prefer server N mod count)',
    `  --http-port P       port of /healthz, /readyz, /metrics (default pipeline.http_port, ${DEFAULT_HTTP_PORT}; 0 = any free port)`,
    '  --grace-seconds S   most seconds a SIGTERM stop takes (default pipeline.grace_seconds, 25)',
  ].join('\n'),
  async run(argv) {
    const { positionals, flags } = parseArgs(argv, { flags: ['replica', 'http-port', 'grace-seconds'] });
    const [stage, ...rest] = positionals;
    if (!stage) throw new UsageError('missing the stage name');
    if (!(STAGES as readonly string[]).includes(stage))
      throw new UsageError(`unknown stage "${stage}" — valid: ${STAGES.join(', ')}`);
    if (rest.length === 0) throw new UsageError('missing the config file');
    const { file, overrides } = configArgs(rest);
    const replica = intFlag(flags, 'replica', 0) ?? 0;
    const httpPort = intFlag(flags, 'http-port', 0, 65535);
    let grace: number | undefined;
    if (flags['grace-seconds'] !== undefined) {
      grace = Number(flags['grace-seconds']);
      if (!Number.isFinite(grace) || grace <= 0)
        throw new UsageError(`--grace-seconds must be a positive number, got ${flags['grace-seconds']}`);
    }
    const cfg = loadConfig({ file, overrides, onWarning: (m) => console.error(`warning: ${m}`) });
    // containers: JSON lines on stdout, one per event
    const log = createLogger({ runId: resolveRunId(cfg), stage, destination: 1 });
    log.info(
      { replica, config: redactSecrets(cfg) },
      `resolved config (${stage}${replica ? ` replica ${replica}` : ''}; defaults → file → RLSTREAM_* environment → overrides; secrets redacted)`,
    );
    const signal = gracefulStop((grace ?? cfg.pipeline.grace_seconds) * 1000, log);
    const out = await serve(cfg, stage, log, { replica, httpPort: httpPort ?? cfg.pipeline.http_port, signal });
    const code = out.status === 'failed' ? 1 : 0;
    if (code) {
      log.error({ status: out.status }, `run failed: ${out.message ?? ''}`);
      console.error(`rlstream serve ${stage}: run failed: ${out.message}`);
    }
    // bus and store are closed; a handle a client library left open must not keep the pod in Terminating
    setTimeout(() => {
      log.warn(
        { resources: process.getActiveResourcesInfo() },
        'handles still open 2 s after closing bus and store; exiting anyway',
      );
      process.exit(code);
    }, 2000).unref();
    return code;
  },
};
