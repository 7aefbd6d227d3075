/**
 * The README's "Your own data" walkthrough, run exactly as written: every ```sh block of that
 * section, in order, by bash in an empty directory inside the checkout (so `npx rlstream` finds
 * this project's bin, as in a user's checkout). README and test cannot drift: the commands are
 * read from the README. Also: every rlstream command in the README's shell blocks is written as
 * `npx rlstream …`, which works after `npm ci` (the project's own bin is on no PATH).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const README = readFileSync(join(ROOT, 'README.md'), 'utf8');
const cwd = join(ROOT, 'test/.tmp', `walkthrough-${process.pid}`);
after(() => rmSync(cwd, { recursive: true, force: true }));

/** The ```sh blocks of a README section (from its `## title` to the next `## `). */
export function shellBlocks(markdown: string, title: string): string[] {
  const start = markdown.indexOf(`\n## ${title}\n`);
  assert.ok(start >= 0, `README has a "## ${title}" section`);
  const end = markdown.indexOf('\n## ', start + 1);
  const section = markdown.slice(start, end < 0 ? undefined : end);
  return [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
}

test("every rlstream command in the README's shell blocks runs through npx", () => {
  const all = [...README.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!).join('\n');
  const bare = all.split('\n').filter((l) => /(^|[\s;&|(])rlstream [a-z]/.test(l) && !/npx rlstream [a-z]/.test(l));
  assert.deepEqual(bare, [], 'commands that would need rlstream on PATH');
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { bin: Record<string, string> };
  assert.ok(readFileSync(join(ROOT, pkg.bin.rlstream), 'utf8').startsWith('#!/usr/bin/env node'));
});

test('README blocks that start several `rlstream serve` processes on one host give each its own HTTP port', () => {
  for (const block of README.matchAll(/```sh\n([\s\S]*?)```/g)) {
    const serves = block[1]!.split('\n').filter((l) => /npx rlstream serve /.test(l));
    if (serves.length < 2) continue;
    const ports = serves.map((l) => /--http-port (\d+)/.exec(l)?.[1] ?? 'default 9464');
    assert.equal(new Set(ports).size, ports.length, `two serve processes would share a port:\n${serves.join('\n')}`);
  }
});

test('the README walkthrough "Your own data" runs as written', { timeout: 180_000 }, () => {
  const blocks = shellBlocks(README, 'Your own data');
  assert.ok(blocks.length >= 4, 'data, reward, config, commands');
  const script = ['set -euo pipefail', ...blocks].join('\n');
  assert.match(script, /npx rlstream train .*\nnpx rlstream sql .*\n.*\nnpx rlstream report .*\nnpx rlstream replay /);
  mkdirSync(cwd, { recursive: true });
  const r = spawnSync('bash', ['-c', script], {
    cwd,
    encoding: 'utf8',
    timeout: 170_000,
    env: { ...process.env, RLSTREAM_LOG_LEVEL: 'warn' },
  });
  assert.equal(r.status, 0, `the walkthrough failed:\n${r.stderr.slice(-4000)}\n${r.stdout.slice(-2000)}`);
  // train: a summary; sql: the steps with validation; report; replay into its own run
  assert.match(r.stdout, /run mine-my-task-[0-9a-f]{8}: \d+ trajectories/);
  assert.match(r.stdout, /step\s+\|?\s*reward_mean/);
  // the row's data_source and extra_info reached compute_score (in the reward worker) and its text detail was stored
  assert.match(r.stdout, /plus-one a=3[2-9]/);
  assert.match(r.stdout, /report written: .*runs\/my-task\/report\.html/);
  assert.match(
    r.stdout,
    /replay mine-my-task-[0-9a-f]{8}\.replay-[0-9a-f]{8} of mine-my-task-[0-9a-f]{8}: completed, step 4/,
  );
  assert.ok(existsSync(join(cwd, 'runs/my-task/report.html')));
  assert.ok(existsSync(join(cwd, 'runs/my-task/config.yaml')), 'the resolved config is kept in the run directory');
});
