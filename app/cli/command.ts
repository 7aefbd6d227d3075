/** A CLI command: `rlstream <name> …`. Every command has `--help`; errors exit non-zero with one line. */
export interface Command {
  name: string;
  summary: string;
  usage: string;
  /** Longer help text printed after the usage line. */
  help: string;
  run(argv: string[]): Promise<number>;
}

/** A usage error: printed as one line plus a hint to run --help; exit code 2. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}

/**
 * Splits argv into positionals, `--flag value` / `--flag=value` / boolean flags. `a.b=c` stays
 * positional. A repeated flag's last value is in `flags`, every value in order in `lists`.
 */
export function parseArgs(
  argv: string[],
  spec: { flags?: string[]; booleans?: string[] } = {},
): { positionals: string[]; flags: Record<string, string>; lists: Record<string, string[]>; booleans: Set<string> } {
  const flags: Record<string, string> = {};
  const lists: Record<string, string[]> = {};
  const booleans = new Set<string>();
  const positionals: string[] = [];
  const known = new Set(spec.flags ?? []);
  const knownBool = new Set([...(spec.booleans ?? []), 'help']);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '-h') {
      booleans.add('help');
      continue;
    }
    if (a.startsWith('--')) {
      const eq = a.indexOf('=');
      const name = eq > 0 ? a.slice(2, eq) : a.slice(2);
      if (knownBool.has(name)) {
        booleans.add(name);
        continue;
      }
      if (!known.has(name)) throw new UsageError(`unknown option --${name}`);
      const value = eq > 0 ? a.slice(eq + 1) : argv[++i];
      if (value === undefined) throw new UsageError(`option --${name} needs a value`);
      flags[name] = value;
      (lists[name] ??= []).push(value);
      continue;
    }
    positionals.push(a);
  }
  return { positionals, flags, lists, booleans };
}
