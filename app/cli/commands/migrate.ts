import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import { loadConfig } from '../../../lib/config/index.ts';
import { openDatabase } from '../../../lib/db/database.ts';
import { migrate, migrationStatus } from '../../../lib/db/migrate.ts';
import { ConfigError } from '../../../lib/errors.ts';
import { configArgs } from './train.ts';

export const migrateCommand: Command = {
  name: 'migrate',
  summary: 'Apply the database migrations to the configured store (idempotent, safe to run concurrently)',
  usage: 'rlstream migrate <config.yaml> [a.b.c=value …]',
  help: [
    'Applies the migrations this rlstream has and pipeline.database_url lacks (each in its own',
    'transaction, under a PostgreSQL advisory lock, so several pods may run it at once), then prints',
    'one line. Run it as a Kubernetes Job or init container before the stages; `rlstream serve` over',
    'PostgreSQL waits until it has. Config as for serve (file, RLSTREAM_* environment, overrides).',
  ].join('\n'),
  async run(argv) {
    const { positionals } = parseArgs(argv);
    if (positionals.length === 0) throw new UsageError('missing the config file');
    const { file, overrides } = configArgs(positionals);
    const cfg = loadConfig({ file, overrides, onWarning: (m) => console.error(`warning: ${m}`) });
    if (cfg.pipeline.store !== 'postgres' || !cfg.pipeline.database_url) {
      throw new ConfigError(
        'rlstream migrate applies migrations to PostgreSQL: set pipeline.store=postgres and pipeline.database_url (the embedded store migrates itself when a run opens it)',
      );
    }
    const db = await openDatabase(
      { kind: 'postgres', url: cfg.pipeline.database_url, poolSize: 1 },
      { migrate: false },
    );
    try {
      const applied = await migrate(db.db);
      const s = await migrationStatus(db.db);
      console.log(
        applied.length
          ? `migrated ${db.where}: applied ${applied.length} (${applied.join(', ')}); schema at ${s.applied.at(-1)}`
          : `migrated ${db.where}: nothing to apply; schema at ${s.applied.at(-1)} (${s.applied.length} migrations)`,
      );
      return 0;
    } finally {
      await db.close();
    }
  },
};
