/**
 * `rlstream reward-server`: HTTP reward servers speaking the `/score` protocol, with a
 * pluggable scorer (a JS/TS module or an ONNX sequence scorer). The implementation, its flags
 * and its process handling (one process per port with `--count N`, SIGTERM drains) live in
 * lib/reward/server-cli.ts; this file only mounts it as a CLI command.
 */
import type { Command } from '../command.ts';
import { main as rewardServerMain, REWARD_SERVER_HELP, REWARD_SERVER_USAGE } from '../../../lib/reward/server-cli.ts';

export const rewardServerCommand: Command = {
  name: 'reward-server',
  summary: 'Serve rewards over HTTP (POST /score, GET /healthz) with a scorer module or an ONNX reward model',
  usage: REWARD_SERVER_USAGE,
  help: REWARD_SERVER_HELP,
  // server-cli prints its own one-line errors (exit 2 for usage, 1 otherwise) and resolves the
  // exit code once every server has stopped (SIGTERM/SIGINT drain in-flight requests first).
  run: (argv) => rewardServerMain(argv),
};
