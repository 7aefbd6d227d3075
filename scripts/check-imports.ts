/**
 * Import graph checks run by `npm run lint` (and `npm run check:cycles`):
 *  1. no import cycles among the project's own modules (lib/, services/, bin/);
 *  2. no service imports another service (services/<a>/… → services/<b>/…);
 *  3. services/<stage>/logic.ts imports nothing that does I/O (only lib/ and other pure modules);
 *  4. the floors: lib/ imports neither services/ nor app/, services/ does not import app/, and bench/
 *     and devkit/ import nothing from test/.
 * It reads `import … from '…'` / `export … from '…'` / `import('…')` specifiers with a regex,
 * which is enough for this codebase's style (no require, no computed specifiers).
 */
import { readdirSync, readFileSync, statSync, existsSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';

const root = resolve(dirname(new URL(import.meta.url).pathname), '..');
const roots = ['app', 'lib', 'services', 'bin', 'bench', 'devkit'];
const cyclesOnly = process.argv.includes('--cycles-only');

function walk(dir: string, out: string[] = []): string[] {
  if (!existsSync(dir)) return out;
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) walk(p, out);
    else if (/\.(ts|mts|mjs|js)$/.test(name) && !name.endsWith('.d.ts')) out.push(p);
  }
  return out;
}

const files = roots.flatMap((r) => walk(join(root, r)));
const importRe =
  /(?:import|export)\s[^'"]*?from\s*['"]([^'"]+)['"]|import\s*\(\s*['"]([^'"]+)['"]\s*\)|import\s+['"]([^'"]+)['"]/g;

function resolveSpec(from: string, spec: string): string | null {
  if (!spec.startsWith('.')) return null;
  const base = resolve(dirname(from), spec);
  for (const cand of [base, base.replace(/\.js$/, '.ts'), `${base}.ts`, join(base, 'index.ts')]) {
    if (existsSync(cand) && statSync(cand).isFile()) return cand;
  }
  return null;
}

const graph = new Map<string, string[]>();
const problems: string[] = [];
for (const f of files) {
  const src = readFileSync(f, 'utf8')
    .replace(/\/\*[\s\S]*?\*\//g, '')
    .replace(/^\s*\/\/.*$/gm, '');
  const deps: string[] = [];
  for (const m of src.matchAll(importRe)) {
    const spec = m[1] ?? m[2] ?? m[3];
    const target = resolveSpec(f, spec);
    if (target) deps.push(target);
    if (cyclesOnly) continue;
    const relFrom = relative(root, f);
    const svcFrom = /^services\/([^/]+)\//.exec(relFrom)?.[1];
    if (svcFrom && target) {
      const svcTo = /^services\/([^/]+)\//.exec(relative(root, target))?.[1];
      if (svcTo && svcTo !== svcFrom)
        problems.push(
          `${relFrom}: imports ${relative(root, target)} — a service must not import another service; move shared code to lib/`,
        );
    }
    const floorTo = target ? relative(root, target).split('/')[0] : undefined;
    const floorFrom = relFrom.split('/')[0];
    const forbidden: Record<string, string[]> = {
      lib: ['services', 'app', 'test'],
      services: ['app', 'test'],
      bench: ['test'],
      devkit: ['test'],
    };
    if (floorTo && forbidden[floorFrom]?.includes(floorTo))
      problems.push(
        `${relFrom}: imports ${relative(root, target!)} — ${floorFrom}/ sits below ${floorTo}/ and must not import it`,
      );
    if (
      svcFrom &&
      relFrom.endsWith('/logic.ts') &&
      !target &&
      /^(node:)?(fs|net|http|https|child_process|dgram)(\/|$)|^(pg|kafkajs|@electric-sql\/pglite|onnxruntime-node)$/.test(
        spec,
      )
    ) {
      problems.push(`${relFrom}: imports '${spec}' — logic.ts must be pure (no I/O)`);
    }
  }
  graph.set(f, deps);
}

// Tarjan's SCC to report every cycle once.
let index = 0;
const idx = new Map<string, number>(),
  low = new Map<string, number>(),
  onStack = new Set<string>(),
  stack: string[] = [];
function strong(v: string): void {
  idx.set(v, index);
  low.set(v, index);
  index++;
  stack.push(v);
  onStack.add(v);
  for (const w of graph.get(v) ?? []) {
    if (!graph.has(w)) continue;
    if (!idx.has(w)) {
      strong(w);
      low.set(v, Math.min(low.get(v)!, low.get(w)!));
    } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, idx.get(w)!));
  }
  if (low.get(v) === idx.get(v)) {
    const comp: string[] = [];
    let w: string;
    do {
      w = stack.pop()!;
      onStack.delete(w);
      comp.push(w);
    } while (w !== v);
    const selfLoop = comp.length === 1 && (graph.get(v) ?? []).includes(v);
    if (comp.length > 1 || selfLoop) problems.push(`import cycle: ${comp.map((c) => relative(root, c)).join(' → ')}`);
  }
}
for (const f of graph.keys()) if (!idx.has(f)) strong(f);

if (problems.length) {
  for (const p of problems) console.error(p);
  console.error(`check-imports: ${problems.length} problem(s) in ${files.length} files`);
  process.exit(1);
}
console.log(
  `check-imports: ${files.length} files, no cycles${cyclesOnly ? '' : ', no cross-service imports, pure logic.ts'}`,
);
