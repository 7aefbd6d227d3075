/**
 * Writes docs/config.md from the config schema (lib/config/schema.ts).
 *   node --import tsx scripts/gen-config-docs.ts          # write the file
 *   node --import tsx scripts/gen-config-docs.ts --check  # exit 1 if the committed file is stale
 */
import { readFileSync, writeFileSync, existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { renderConfigDocs } from '../lib/config/index.ts';

const target = join(dirname(fileURLToPath(import.meta.url)), '..', 'docs', 'config.md');
const text = renderConfigDocs();

if (process.argv.includes('--check')) {
  const current = existsSync(target) ? readFileSync(target, 'utf8') : '';
  if (current !== text) {
    console.error(`${target} is out of date; run: node --import tsx scripts/gen-config-docs.ts`);
    process.exit(1);
  }
  console.log(`${target} is current`);
} else {
  writeFileSync(target, text);
  console.log(`wrote ${target}`);
}
