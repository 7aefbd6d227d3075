#!/usr/bin/env node
// rlstream CLI entry: registers the TypeScript loader (tsx) and runs app/cli/main.ts.
import { register } from 'tsx/esm/api';
register();
const { main } = await import('../app/cli/main.ts');
const code = await main(process.argv.slice(2));
if (typeof code === 'number') process.exitCode = code;
// The command has finished: exit when the event loop drains, and at the latest after 5 s. A handle
// left open under load (seen rarely after Ctrl-C stopped a run: the stop message printed, then no
// exit, with SIGTERM caught by the run's own handler) must not keep a finished command alive.
setTimeout(() => process.exit(), 5000).unref();
