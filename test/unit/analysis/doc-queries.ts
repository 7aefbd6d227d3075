/**
 * The example queries of docs/queries.md: every ```sh block's `rlstream sql <run> "<query>"`, with
 * the heading it answers. The tests run each one against a populated store.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export const QUERIES_DOC = fileURLToPath(new URL('../../../docs/queries.md', import.meta.url));

export interface DocQuery {
  title: string;
  target: string;
  sql: string;
}

export function docQueries(path = QUERIES_DOC): DocQuery[] {
  const text = readFileSync(path, 'utf8');
  const out: DocQuery[] = [];
  let title = '';
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    if (lines[i].startsWith('## ')) title = lines[i].slice(3).trim();
    if (lines[i].trim() !== '```sh' || !title) continue;
    const block: string[] = [];
    for (i++; i < lines.length && lines[i].trim() !== '```'; i++) block.push(lines[i]);
    const m = /^npx rlstream sql (\S+) "([^"]*)"\s*$/s.exec(block.join('\n').trim());
    if (!m)
      throw new Error(
        `docs/queries.md, section "${title}": the block is not one \`npx rlstream sql <run> "<query>"\` command`,
      );
    out.push({ title, target: m[1], sql: m[2].trim() });
  }
  return out;
}
