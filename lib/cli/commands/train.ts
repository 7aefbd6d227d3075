import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import { loadConfig, formatResolvedConfig, resolveRunId } from '../../config/index.ts';
import { createLogger } from '../../log.ts';
import { trainEmbedded } from '../../app/run.ts';

export function configArgs(positionals: string[]): { file?: string; overrides: string[] } {
  const file = positionals[0] && !positionals[0].includes('=') ? positionals[0] : undefined;
  const overrides = positionals.slice(file ? 1 : 0);
  for (const o of overrides) if (!o.includes('=')) throw new UsageError(`expected an override a.b.c=value, got "${o}"`);
  return { file, overrides };
}

function interruptSignal(): AbortSignal {
  const ac = new AbortController();
  const on = () => ac.abort();
  process.once('SIGINT', on);
  process.once('SIGTERM', on);
  return ac.signal;
}

export const trainCommand: Command = {
  name: 'train',
  summary: 'Train a policy: all five stages in this process (embedded default) over the configured bus and store',
  usage: 'rlstream train <config.yaml> [a.b.c=value …]',
  help: [
    'Loads the config (defaults → file → overrides), prints it resolved (secrets redacted), and runs',
    'the controller, rollout, reward, advantage and update stages until the run is done. A run that',
    'was interrupted continues where it stopped when started again with the same command.',
    '',
    'arguments:',
    '  config.yaml     run config (see docs/config.md)',
    '  a.b.c=value     override, value parsed as a YAML scalar (e.g. trainer.max_steps=20)',
  ].join('\n'),
  async run(argv) {
    const { positionals } = parseArgs(argv);
    if (positionals.length === 0) throw new UsageError('missing the config file');
    const { file, overrides } = configArgs(positionals);
    const cfg = loadConfig({ file, overrides, onWarning: (m) => console.error(`warning: ${m}`) });
    const log = createLogger({ runId: resolveRunId(cfg) });
    process.stderr.write(`# resolved config\n${formatResolvedConfig(cfg)}\n`);
    const out = await trainEmbedded(cfg, log, { progress: process.stderr.isTTY === true, signal: interruptSignal() });
    console.log(out.summary);
    if (out.status !== 'completed') { console.error(`rlstream train: run ${out.status}${out.message ? `: ${out.message}` : ''}`); return 1; }
    return 0;
  },
};
