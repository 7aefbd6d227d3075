#!/usr/bin/env node
// rlstream CLI entry: registers the TypeScript loader (tsx) and runs lib/cli/main.ts.
import { register } from 'tsx/esm/api';
register();
const { main } = await import('../lib/cli/main.ts');
const code = await main(process.argv.slice(2));
if (typeof code === 'number') process.exitCode = code;
