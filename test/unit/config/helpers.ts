/** Shared helpers for the config tests: temp YAML files and "this load fails with exactly these problems". */
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after } from 'node:test';
import { ConfigError } from '../../../lib/errors.ts';
import { loadConfig, type LoadConfigOptions, type Config } from '../../../lib/config/index.ts';

const dir = mkdtempSync(join(tmpdir(), 'rlstream-config-'));
after(() => rmSync(dir, { recursive: true, force: true }));

let n = 0;
/** Writes `text` to a fresh temp .yaml file and returns its path. */
export function yamlFile(text: string): string {
  const p = join(dir, `run-${n++}.yaml`);
  writeFileSync(p, text);
  return p;
}

/** The smallest valid run: the built-in number game with default batch sizes. */
export const BASE = ['data.task=number_game'];

/** Loads with the BASE overrides first; warnings are collected instead of emitted. */
export function load(opts: LoadConfigOptions = {}, warnings: string[] = []): Config {
  return loadConfig({
    env: {},
    onWarning: (w) => warnings.push(w),
    ...opts,
    overrides: [...BASE, ...(opts.overrides ?? [])],
  });
}

/** The problems of a failing load (asserts it fails with a ConfigError). */
export function problemsOf(fn: () => unknown): string[] {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof ConfigError, `expected a ConfigError, got ${String(err)}`);
    const problems = (err.details?.problems as string[] | undefined) ?? [err.message];
    // the message lists every problem, one per line
    for (const p of problems) assert.ok(err.message.includes(p), `message lacks problem line: ${p}`);
    return problems;
  }
  assert.fail('expected the configuration to be rejected');
}

/** Asserts the load fails with exactly one problem and that it contains every fragment. */
export function expectOneProblem(fn: () => unknown, ...fragments: string[]): string {
  const problems = problemsOf(fn);
  assert.equal(problems.length, 1, `expected exactly one problem, got:\n${problems.join('\n')}`);
  for (const f of fragments) assert.ok(problems[0].includes(f), `problem\n  ${problems[0]}\nlacks\n  ${f}`);
  return problems[0];
}
