import type { Command } from '../command.ts';
import { configCommand } from './config.ts';
import { trainCommand } from './train.ts';
import { sftCommand } from './sft.ts';
import { serveCommand } from './serve.ts';
import { migrateCommand } from './migrate.ts';
import { sqlCommand } from './sql.ts';
import { runsCommand } from './runs.ts';
import { reportCommand } from './report.ts';
import { rewardServerCommand } from './reward-server.ts';
import { replayCommand } from './replay.ts';
import { exportCommand } from './export.ts';
import { generateCommand } from './generate.ts';
import { fetchCommand } from './fetch.ts';
import { checkCommand } from './check.ts';
import { servePolicyCommand } from './serve-policy.ts';

/** Every `rlstream` command, in the order `--help` lists them. */
export const commands: Command[] = [
  trainCommand,
  sftCommand,
  serveCommand,
  migrateCommand,
  configCommand,
  checkCommand,
  sqlCommand,
  runsCommand,
  reportCommand,
  rewardServerCommand,
  servePolicyCommand,
  replayCommand,
  exportCommand,
  generateCommand,
  fetchCommand,
];
