/**
 * Writes docs/dialects.md from the dialect tables (lib/config/dialects/).
 *   node --import tsx scripts/gen-dialect-docs.ts          # write the file
 *   node --import tsx scripts/gen-dialect-docs.ts --check  # exit 1 if the committed file is stale
 */
import { readFileSync, writeFileSync, existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { format } from 'prettier';
import { renderDialectDocs } from '../lib/config/dialects/docs.ts';

const target = join(dirname(fileURLToPath(import.meta.url)), '..', 'docs', 'dialects.md');
const text = await format(renderDialectDocs(), { parser: 'markdown', printWidth: 120, proseWrap: 'preserve' });

if (process.argv.includes('--check')) {
  const current = existsSync(target) ? readFileSync(target, 'utf8') : '';
  if (current !== text) {
    console.error(`${target} is out of date; run: node --import tsx scripts/gen-dialect-docs.ts`);
    process.exit(1);
  }
  console.log(`${target} is current`);
} else {
  writeFileSync(target, text);
  console.log(`wrote ${target}`);
}
