import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import { loadConfig, type Config } from '../../../lib/config/index.ts';
import { checkData, formatDataReport } from '../../../lib/checks/data.ts';
import { checkEnv, formatEnvReport } from '../../../lib/checks/env.ts';

function configArgs(positionals: string[]): { file: string | undefined; overrides: string[] } {
  const file = positionals[0] && !positionals[0].includes('=') ? positionals[0] : undefined;
  const overrides = positionals.slice(file ? 1 : 0);
  for (const o of overrides) if (!o.includes('=')) throw new UsageError(`expected an override a.b.c=value, got "${o}"`);
  return { file, overrides };
}

function intFlag(flags: Record<string, string>, k: string, dflt: number): number {
  if (flags[k] === undefined) return dflt;
  const v = Number(flags[k]);
  if (!Number.isInteger(v) || v < 0) throw new UsageError(`--${k} must be a non-negative integer, got "${flags[k]}"`);
  return v;
}

/**
 * `rlstream check data <config>` and `rlstream check env [config]`: what a run would make of its
 * data and whether this machine can run it, before the run (docs/checks.md).
 */
export const checkCommand: Command = {
  name: 'check',
  summary:
    "Check a run's data (lengths, rendered prompts, the reward on the ground truths) or this machine, before a run",
  usage:
    'rlstream check data <config.yaml> [a.b.c=value …] [--samples N] [--reward-rows N] [--as-response TEMPLATE]\n       rlstream check env [config.yaml] [a.b.c=value …]',
  help: [
    'check data: per split, rows read, used and left out (with the reasons and file:line examples),',
    'prompt token lengths after the chat template and ground-truth token lengths as histograms against',
    'data.max_prompt_length / max_response_length, a few prompts exactly as the model sees them, and the',
    "run's reward function called on the ground truths (each must score as correct) and on empty responses.",
    'Exits 1 when it finds a problem that would spoil the run.',
    '',
    'check env: Node, onnxruntime-node and the execution providers that start here, CPU threads, free',
    "memory and disk against the configured policy's size, PostgreSQL and Kafka when configured, and the",
    'Python interpreter, module and function of a Python reward. Exits 1 when a check fails.',
    '',
    'options (check data):',
    '  --samples N            prompts shown per split (default 2)',
    '  --reward-rows N        rows per split whose ground truth is scored (default 256)',
    '  --as-response TEMPLATE how a ground truth is written as a response, {answer} replaced',
    "                         (e.g. '\\boxed{{answer}}' for a reward that reads boxed answers; default {answer})",
  ].join('\n'),
  async run(argv) {
    const { positionals, flags } = parseArgs(argv, { flags: ['samples', 'reward-rows', 'as-response'] });
    const [what, ...rest] = positionals;
    if (what !== 'data' && what !== 'env')
      throw new UsageError(`expected \`check data <config>\` or \`check env [config]\`, got "${what ?? ''}"`);
    const { file, overrides } = configArgs(rest);
    const warn = (m: string) => console.error(`warning: ${m}`);
    if (what === 'data') {
      if (!file) throw new UsageError('check data needs the run config: rlstream check data <config.yaml>');
      const cfg = loadConfig({ file, overrides, onWarning: warn });
      const report = await checkData(cfg, {
        samples: intFlag(flags, 'samples', 2),
        rewardRows: intFlag(flags, 'reward-rows', 256),
        asResponse: flags['as-response'],
        warn,
        stderr: (l) => console.error(l),
      });
      process.stdout.write(formatDataReport(report));
      return report.problems.length ? 1 : 0;
    }
    const cfg: Config | null = file || overrides.length ? loadConfig({ file, overrides, onWarning: warn }) : null;
    const checks = await checkEnv(cfg);
    process.stdout.write(formatEnvReport(checks));
    return checks.some((c) => c.status === 'fail') ? 1 : 0;
  },
};
