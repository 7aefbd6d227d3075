/**
 * `npm run bench [-- name …]`: runs the benchmarks (each measures its own ratios side by side in
 * one run) and prints one table; with `--markdown` also writes bench/out/results.md for the README.
 * Modules: avro, bus, store, rl, model, reward, python-reward, pipeline, images, image-policy, vision, durability, agents.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { formatTable } from '../lib/console/progress.ts';

interface AnyRow {
  name: string;
  value: number;
  unit: string;
  goal?: number | string;
  better?: 'higher' | 'lower';
}
const MODULES = [
  'avro',
  'bus',
  'store',
  'rl',
  'model',
  'reward',
  'python-reward',
  'pipeline',
  'images',
  'image-policy',
  'vision',
  'durability',
  'inference',
  'agents',
] as const;

function goalText(r: AnyRow): string {
  if (r.goal === undefined) return '';
  if (typeof r.goal === 'string') return r.goal;
  return `${r.better === 'lower' ? '≤' : '≥'} ${r.goal}`;
}

function met(r: AnyRow): string {
  if (typeof r.goal !== 'number') return '';
  return (r.better === 'lower' ? r.value <= r.goal : r.value >= r.goal) ? 'yes' : 'no';
}

const args = process.argv.slice(2);
const markdown = args.includes('--markdown');
const wanted = args.filter((a) => !a.startsWith('--'));
for (const w of wanted)
  if (!(MODULES as readonly string[]).includes(w)) {
    console.error(`unknown benchmark "${w}" — valid: ${MODULES.join(', ')}`);
    process.exit(2);
  }
const rows: Array<[string, AnyRow]> = [];
for (const m of MODULES) {
  if (wanted.length && !wanted.includes(m)) continue;
  const t0 = performance.now();
  console.error(`# bench ${m} …`);
  const mod = (await import(`./${m}.ts`)) as { run(): Promise<AnyRow[]> };
  for (const r of await mod.run()) rows.push([m, r]);
  console.error(`# bench ${m} done in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}
const header = `${cpus().length} cores (${cpus()[0]?.model ?? '?'}), load average ${loadavg()[0].toFixed(1)}, Node ${process.version}`;
console.log(header);
console.log(
  formatTable([
    ['bench', 'measure', 'value', 'unit', 'goal', 'met'],
    ...rows.map(([m, r]) => [m, r.name, r.value, r.unit, goalText(r), met(r)]),
  ]),
);
if (markdown) {
  mkdirSync(new URL('./out/', import.meta.url), { recursive: true });
  const fmt = (v: number) =>
    Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-2)
      ? v.toExponential(2)
      : Number.isInteger(v)
        ? String(v)
        : v.toFixed(3);
  const md = [
    `_${header}_`,
    '',
    '| bench | measure | value | unit | goal | met |',
    '|---|---|---|---|---|---|',
    ...rows.map(([m, r]) => `| ${m} | ${r.name} | ${fmt(r.value)} | ${r.unit} | ${goalText(r)} | ${met(r)} |`),
  ].join('\n');
  writeFileSync(new URL('./out/results.md', import.meta.url), `${md}\n`);
}
