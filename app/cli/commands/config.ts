import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import { loadConfig, formatResolvedConfig } from '../../../lib/config/index.ts';
import { preflightProblems } from '../../../lib/config/preflight.ts';
import { formatTranslation } from '../../../lib/config/dialects/index.ts';
import { printNotApplicable } from './train.ts';

/** `rlstream config <config.yaml> [a.b=c …]`: validate a config and print it resolved (secrets redacted). */
export const configCommand: Command = {
  name: 'config',
  summary: 'Validate a run config and print it resolved (defaults → file → overrides), secrets redacted',
  usage: 'rlstream config [config.yaml] [a.b.c=value …] [--dialect easyr1|verl|mtrl] [--print-translation]',
  help: [
    'Loads the config exactly as `train` would and prints the resolved YAML, or every problem found',
    '(unknown keys with the closest valid key, wrong types, inconsistent batch sizes, …), then checks',
    'what a run needs before it starts, one line per problem on stderr (exit code 1): model directories',
    'readable and complete (config.json, every weight file or shard), data files present, the reward',
    'module loadable, the checkpoint to start from present, the run directory writable.',
    '',
    'arguments:',
    '  config.yaml     run config (optional: defaults alone when omitted)',
    '  a.b.c=value     override, value parsed as a YAML scalar (e.g. rollout.n=8, actor.optim.betas=[0.9,0.95])',
    '',
    'options:',
    '  --dialect NAME        read the config as easyr1, verl or mtrl (default: recognised by its sections)',
    "  --print-translation   for such a config, print every key's mapping (source key: value → rlstream",
    '                        keys) before the resolved config (docs/dialects.md)',
  ].join('\n'),
  async run(argv) {
    const { positionals, flags, booleans } = parseArgs(argv, { flags: ['dialect'], booleans: ['print-translation'] });
    const file = positionals[0] && !positionals[0].includes('=') ? positionals[0] : undefined;
    const overrides = positionals.slice(file ? 1 : 0);
    for (const o of overrides)
      if (!o.includes('=')) throw new UsageError(`expected an override a.b.c=value, got "${o}"`);
    let translated = false;
    const cfg = loadConfig({
      file,
      overrides,
      ...(flags.dialect !== undefined ? { dialect: flags.dialect } : {}),
      onWarning: (m) => console.error(`warning: ${m}`),
      onTranslation: (t) => {
        translated = true;
        if (booleans.has('print-translation')) process.stdout.write(formatTranslation(t, file) + '\n');
        else printNotApplicable(t);
      },
    });
    if (booleans.has('print-translation') && !translated)
      console.error('rlstream config: not a dialect config (an rlstream config needs no translation)');
    process.stdout.write(formatResolvedConfig(cfg));
    const problems = await preflightProblems(cfg);
    for (const p of problems) console.error(`error: ${p}`);
    return problems.length ? 1 : 0;
  },
};
