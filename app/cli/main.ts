/**
 * `rlstream` — the command-line entry. Each command lives in app/cli/commands/<name>.ts and is
 * registered here. `rlstream --help` lists them; `rlstream <cmd> --help` prints that command's help.
 * Errors print one line (`rlstream: <reason>`) and exit non-zero.
 */
import type { Command } from './command.ts';
import { UsageError } from './command.ts';
import { commands } from './commands/index.ts';
import { errorMessage } from '../../lib/errors.ts';

function topHelp(): string {
  const width = Math.max(...commands.map((c) => c.name.length));
  return [
    'rlstream — event-sourced RL post-training (GRPO, PPO, RLOO, …)',
    '',
    'usage: rlstream <command> [options]',
    '',
    'commands:',
    ...commands.map((c) => `  ${c.name.padEnd(width)}  ${c.summary}`),
    '',
    "Run `rlstream <command> --help` for a command's options.",
  ].join('\n');
}

export function commandHelp(c: Command): string {
  return `usage: ${c.usage}\n\n${c.summary}\n\n${c.help}`.trimEnd();
}

export async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    console.log(topHelp());
    return name ? 0 : 2;
  }
  const cmd = commands.find((c) => c.name === name);
  if (!cmd) {
    console.error(`rlstream: unknown command "${name}" — valid: ${commands.map((c) => c.name).join(', ')}`);
    return 2;
  }
  if (rest.includes('--help') || rest.includes('-h')) {
    console.log(commandHelp(cmd));
    return 0;
  }
  try {
    return await cmd.run(rest);
  } catch (err) {
    if (err instanceof UsageError) {
      console.error(`rlstream ${cmd.name}: ${err.message} (see \`rlstream ${cmd.name} --help\`)`);
      return 2;
    }
    const msg = errorMessage(err);
    console.error(`rlstream ${cmd.name}: ${msg.split('\n')[0]}`);
    if (msg.includes('\n')) console.error(msg.split('\n').slice(1).join('\n'));
    if (process.env.RLSTREAM_DEBUG && err instanceof Error) console.error(err.stack);
    return 1;
  }
}
