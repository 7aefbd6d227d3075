/**
 * CI check that the TypeScript types match the Avro schemas:
 *  1. generates TypeScript declarations from every `schemas/<topic>.v<N>.avsc` and compares them
 *     with the committed `lib/contracts/generated.ts` (prints a diff and fails when stale;
 *     `--write` regenerates it);
 *  2. compiles `lib/contracts/type-assertions.ts`, which asserts that each hand-written type in
 *     `lib/contracts/types.ts` and its generated type are mutually assignable;
 *  3. checks schema evolution: each version of a family in `schemas/` (and each fixture in
 *     `schemas/evolution/`) can read records written with the previous version.
 *
 *   node --import tsx scripts/check-schema-types.ts [--write]
 */
import { readFileSync, readdirSync, writeFileSync, existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { SchemaCatalogue, parseRef } from '../lib/contracts/schemas.ts';
import { checkCompatibility } from '../lib/contracts/compat.ts';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const SCHEMA_DIR = join(root, 'schemas');
export const EVOLUTION_DIR = join(SCHEMA_DIR, 'evolution');
export const GENERATED_FILE = join(root, 'lib', 'contracts', 'generated.ts');
export const ASSERTIONS_FILE = join(root, 'lib', 'contracts', 'type-assertions.ts');

const PRIMITIVE_TS: Record<string, string> = {
  null: 'null',
  boolean: 'boolean',
  int: 'number',
  long: 'number',
  float: 'number',
  double: 'number',
  string: 'string',
  bytes: 'Buffer',
};
const LOGICAL_TS: Record<string, string> = { 'int32-le': 'Int32Array', 'float32-le': 'Float32Array' };

const pascal = (s: string) =>
  s
    .split(/[^A-Za-z0-9]+/)
    .filter(Boolean)
    .map((p) => p[0].toUpperCase() + p.slice(1))
    .join('');

function docComment(doc: unknown, indent: string): string {
  if (typeof doc !== 'string' || doc === '') return '';
  return `${indent}/** ${doc.replace(/\*\//g, '*\\/')} */\n`;
}

/** TypeScript declarations for one schema file (`ref` = family.vN). */
function generateOne(ref: string, schema: Record<string, unknown>): string {
  const { family, version } = parseRef(ref)!;
  const prefix = `${pascal(family)}V${version}`;
  const defaultNs = String(schema.namespace ?? '');
  const named = new Map<string, string>(); // qualified Avro name → TS name
  const decls: string[] = [];

  const qualify = (name: string, ns: string) => (name.includes('.') ? name : ns ? `${ns}.${name}` : name);

  function tsType(s: unknown, ns: string, where: string): string {
    if (typeof s === 'string') {
      if (s in PRIMITIVE_TS) return PRIMITIVE_TS[s];
      const q = qualify(s, ns);
      const t = named.get(q);
      if (!t) throw new Error(`${ref}: ${where}: unknown type name ${s}`);
      return t;
    }
    if (Array.isArray(s)) {
      const branches = s.map((b, i) => tsType(b, ns, `${where}|${i}`));
      return branches.join(' | ');
    }
    if (!s || typeof s !== 'object') throw new Error(`${ref}: ${where}: invalid schema ${JSON.stringify(s)}`);
    const o = s as Record<string, any>;
    if (typeof o.logicalType === 'string' && LOGICAL_TS[o.logicalType]) {
      if (o.type !== 'bytes') throw new Error(`${ref}: ${where}: logical type ${o.logicalType} must annotate bytes`);
      return LOGICAL_TS[o.logicalType];
    }
    switch (o.type) {
      case 'record':
      case 'error': {
        const itsNs =
          typeof o.namespace === 'string'
            ? o.namespace
            : o.name.includes('.')
              ? o.name.slice(0, o.name.lastIndexOf('.'))
              : ns;
        const q = qualify(o.name, itsNs);
        const tsName = prefix + pascal(q.slice(q.lastIndexOf('.') + 1));
        named.set(q, tsName);
        const lines = (o.fields as Array<Record<string, any>>).map(
          (f) => `${docComment(f.doc, '  ')}  ${f.name}: ${tsType(f.type, itsNs, `${where}.${f.name}`)};`,
        );
        decls.push(`${docComment(o.doc, '')}export interface ${tsName} {\n${lines.join('\n')}\n}`);
        return tsName;
      }
      case 'enum': {
        const itsNs = typeof o.namespace === 'string' ? o.namespace : ns;
        const q = qualify(o.name, itsNs);
        const tsName = prefix + pascal(q.slice(q.lastIndexOf('.') + 1));
        named.set(q, tsName);
        decls.push(
          `${docComment(o.doc, '')}export type ${tsName} = ${(o.symbols as string[]).map((x) => JSON.stringify(x)).join(' | ')};`,
        );
        return tsName;
      }
      case 'fixed': {
        const q = qualify(o.name, typeof o.namespace === 'string' ? o.namespace : ns);
        named.set(q, 'Buffer');
        return 'Buffer';
      }
      case 'array': {
        const items = tsType(o.items, ns, `${where}[]`);
        return /[ |]/.test(items) ? `Array<${items}>` : `${items}[]`;
      }
      case 'map':
        return `Record<string, ${tsType(o.values, ns, `${where}{}`)}>`;
      default:
        if (typeof o.type === 'string' && o.type in PRIMITIVE_TS) return PRIMITIVE_TS[o.type];
        return tsType(o.type, ns, where);
    }
  }

  const top = tsType(schema, defaultNs, String(schema.name));
  return `// ---- ${ref} (schemas/${ref}.avsc); top-level record: ${top}\n\n${decls.join('\n\n')}\n`;
}

/** The content `lib/contracts/generated.ts` must have for the schemas in `dir`. */
export function generateTypes(dir = SCHEMA_DIR): string {
  const cat = SchemaCatalogue.load([dir]);
  const parts: string[] = [];
  const latest: string[] = [];
  for (const family of cat.families()) {
    for (const sv of cat.versions(family)) parts.push(generateOne(sv.ref, sv.json));
    const l = cat.latest(family);
    latest.push(`  ${family}: ${pascal(family)}V${l.version}${pascal(String(l.json.name))};`);
  }
  return [
    '// GENERATED by scripts/check-schema-types.ts --write from schemas/*.avsc — do not edit.',
    '// CI (and test/unit/contracts/schema-types.test.ts) fails when this file is stale.',
    '',
    ...parts,
    '/** The record type of the newest version of each schema family. */',
    'export interface GeneratedSchemaValues {',
    ...latest,
    '}',
    '',
  ].join('\n');
}

/**
 * A line diff from the committed file (`actual`, lines marked -) to the expected one (+), with
 * line numbers of the committed file; the first `max` changed lines. Common head and tail are
 * trimmed, the middle is aligned by longest common subsequence.
 */
export function lineDiff(expected: string, actual: string, max = 40): string {
  const e = expected.split('\n');
  const a = actual.split('\n');
  let head = 0;
  while (head < e.length && head < a.length && e[head] === a[head]) head++;
  let tail = 0;
  while (tail < e.length - head && tail < a.length - head && e[e.length - 1 - tail] === a[a.length - 1 - tail]) tail++;
  const em = e.slice(head, e.length - tail);
  const am = a.slice(head, a.length - tail);
  if (em.length * am.length > 4_000_000)
    return `${am.length} lines from line ${head + 1} differ (too many to align); regenerate the file`;
  // lcs[i][j] = LCS length of am[i..], em[j..]
  const w = em.length + 1;
  const lcs = new Int32Array((am.length + 1) * w);
  for (let i = am.length - 1; i >= 0; i--) {
    for (let j = em.length - 1; j >= 0; j--) {
      lcs[i * w + j] =
        am[i] === em[j] ? lcs[(i + 1) * w + j + 1] + 1 : Math.max(lcs[(i + 1) * w + j], lcs[i * w + j + 1]);
    }
  }
  const out: string[] = [];
  let i = 0;
  let j = 0;
  while ((i < am.length || j < em.length) && out.length < max) {
    if (i < am.length && j < em.length && am[i] === em[j]) {
      i++;
      j++;
      continue;
    }
    if (j < em.length && (i === am.length || lcs[i * w + j + 1] >= lcs[(i + 1) * w + j])) {
      out.push(`${head + i + 1}: + ${em[j]}`);
      j++;
    } else {
      out.push(`${head + i + 1}: - ${am[i]}`);
      i++;
    }
  }
  return out.join('\n');
}

/** Compares (or with write = true, rewrites) the generated file. */
export function checkGenerated(opts: { write?: boolean; dir?: string; file?: string } = {}): {
  ok: boolean;
  diff: string;
} {
  const file = opts.file ?? GENERATED_FILE;
  const expected = generateTypes(opts.dir ?? SCHEMA_DIR);
  const actual = existsSync(file) ? readFileSync(file, 'utf8') : '';
  if (expected === actual) return { ok: true, diff: '' };
  if (opts.write) {
    writeFileSync(file, expected);
    return { ok: true, diff: '' };
  }
  return { ok: false, diff: actual === '' ? `${file} is missing` : lineDiff(expected, actual) };
}

/** Compiles the type assertions (and what they import); returns the diagnostics as text lines. */
export function checkTypeAssertions(files: string[] = [ASSERTIONS_FILE]): string[] {
  const program = ts.createProgram(files, {
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    allowImportingTsExtensions: true,
    types: ['node'],
    lib: ['lib.es2023.d.ts'],
  });
  return ts.getPreEmitDiagnostics(program).map((d) => {
    const msg = ts.flattenDiagnosticMessageText(d.messageText, '\n');
    if (!d.file || d.start === undefined) return msg;
    const { line } = d.file.getLineAndCharacterOfPosition(d.start);
    return `${d.file.fileName.replace(root + '/', '')}:${line + 1}: ${msg}`;
  });
}

/** Each version must read the previous version's records; evolution fixtures must read the newest in schemas/. */
export function checkEvolution(dir = SCHEMA_DIR, evolutionDir = EVOLUTION_DIR): string[] {
  const problems: string[] = [];
  const cat = SchemaCatalogue.load([dir]);
  for (const family of cat.families()) {
    const vs = cat.versions(family);
    for (let i = 1; i < vs.length; i++) {
      const r = checkCompatibility(vs[i - 1].type, vs[i].type);
      for (const e of r.errors) problems.push(`${vs[i].ref} cannot read ${vs[i - 1].ref}: ${e}`);
    }
  }
  if (existsSync(evolutionDir)) {
    for (const name of readdirSync(evolutionDir)
      .filter((n) => n.endsWith('.avsc'))
      .sort()) {
      const fixture = new SchemaCatalogue().add(
        name.slice(0, -5),
        readFileSync(join(evolutionDir, name), 'utf8'),
        join(evolutionDir, name),
      );
      const prev = cat
        .versions(fixture.family)
        .filter((v) => v.version < fixture.version)
        .pop();
      if (!prev) {
        problems.push(`evolution/${name}: no older version of ${fixture.family} in schemas/`);
        continue;
      }
      for (const e of checkCompatibility(prev.type, fixture.type).errors)
        problems.push(`evolution/${name} cannot read ${prev.ref}: ${e}`);
    }
  }
  return problems;
}

export function main(argv: string[]): number {
  const write = argv.includes('--write');
  let failed = false;
  const gen = checkGenerated({ write });
  if (!gen.ok) {
    failed = true;
    console.error(
      `lib/contracts/generated.ts is stale (the .avsc files changed). Run: node --import tsx scripts/check-schema-types.ts --write\n${gen.diff}`,
    );
  } else if (write) {
    console.log('lib/contracts/generated.ts is up to date');
  }
  const diags = checkTypeAssertions();
  if (diags.length) {
    failed = true;
    console.error(
      `lib/contracts/types.ts does not match the schemas (lib/contracts/type-assertions.ts):\n${diags.join('\n')}`,
    );
  }
  const evo = checkEvolution();
  if (evo.length) {
    failed = true;
    console.error(`schema evolution problems:\n${evo.join('\n')}`);
  }
  if (!failed) console.log('schema types: generated.ts fresh, types.ts matches, evolution compatible');
  return failed ? 1 : 0;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exitCode = main(process.argv.slice(2));
}
