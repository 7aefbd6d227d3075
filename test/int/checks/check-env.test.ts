/**
 * Uses the shared test database (RLSTREAM_TEST_PG_URL): this file runs alone (@runs-alone).
 * `rlstream check env`: PostgreSQL (RLSTREAM_TEST_PG_URL) and Kafka brokers reachable or not, the
 * Python interpreter/module/function of a Python reward, the CPU provider, memory and disk for the
 * configured model — each one line with its status; a failure fails the command.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type AddressInfo, type Server } from 'node:net';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../../lib/config/index.ts';
import { checkEnv, formatEnvReport } from '../../../lib/checks/env.ts';
import { ROOT } from '../../../devkit/pipeline-procs.ts';

const PG = process.env.RLSTREAM_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const PYTHON = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
const dir = join(ROOT, 'test/.tmp', `check-env-${process.pid}`);
mkdirSync(dir, { recursive: true });
writeFileSync(join(dir, 'score.py'), 'def compute_score(*a):\n    return 1.0\n');
const servers: Server[] = [];
after(() => {
  rmSync(dir, { recursive: true, force: true });
  for (const s of servers) s.close();
});

async function listening(): Promise<number> {
  const s = createServer((c) => c.destroy());
  servers.push(s);
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  return (s.address() as AddressInfo).port;
}

async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

const byName = (checks: Awaited<ReturnType<typeof checkEnv>>, name: string) => checks.filter((c) => c.name === name);

test('reachable PostgreSQL and broker, a working Python reward: ok lines', { timeout: 60_000 }, async () => {
  const port = await listening();
  const cfg = loadConfig({
    overrides: [
      'data.task=number_game',
      'pipeline.store=postgres',
      `pipeline.database_url=${PG}`,
      'pipeline.bus=kafka',
      `pipeline.brokers=[127.0.0.1:${port}]`,
      `reward.reward_fn_path=${join(dir, 'score.py')}`,
      `reward.python=${PYTHON}`,
      `trainer.run_dir=${join(dir, 'run')}`,
    ],
    env: {},
  });
  const checks = await checkEnv(cfg);
  const text = formatEnvReport(checks);
  assert.match(byName(checks, 'postgres')[0]!.detail, /PostgreSQL \d+/, text);
  assert.equal(byName(checks, 'postgres')[0]!.status, 'ok');
  assert.deepEqual(
    byName(checks, 'kafka').map((c) => c.status),
    ['ok'],
  );
  assert.equal(byName(checks, 'python')[0]!.status, 'ok', text);
  assert.match(byName(checks, 'python')[0]!.detail, /Python 3\.\d+.* imports .*score\.py and finds compute_score/);
  assert.equal(byName(checks, 'provider cpu')[0]!.status, 'ok');
  assert.match(byName(checks, 'node')[0]!.detail, /^Node v\d+/);
  assert.match(byName(checks, 'memory')[0]!.detail, /M parameters: .* to train/);
  assert.match(byName(checks, 'disk')[0]!.detail, /free at .*check-env-/, 'the nearest existing directory of run_dir');
  assert.ok(!checks.some((c) => c.status === 'fail'), text);
  assert.match(text, /check env: ok\n$/);
});

test(
  'unreachable PostgreSQL and broker, a missing interpreter: fail lines saying why',
  { timeout: 60_000 },
  async () => {
    const dead = await closedPort();
    const cfg = loadConfig({
      overrides: [
        'data.task=number_game',
        'pipeline.store=postgres',
        `pipeline.database_url=postgres://postgres:secret@127.0.0.1:${dead}/x`,
        'pipeline.bus=kafka',
        `pipeline.brokers=[127.0.0.1:${dead}]`,
        `reward.reward_fn_path=${join(dir, 'score.py')}`,
        'reward.python=python3-that-does-not-exist',
      ],
      env: {},
    });
    const checks = await checkEnv(cfg);
    const text = formatEnvReport(checks);
    const pg = byName(checks, 'postgres')[0]!;
    assert.equal(pg.status, 'fail');
    assert.match(pg.detail, /ECONNREFUSED/);
    assert.ok(!pg.detail.includes('secret'), 'the password is not printed');
    assert.equal(byName(checks, 'kafka')[0]!.status, 'fail');
    assert.match(byName(checks, 'kafka')[0]!.detail, new RegExp(`broker 127\\.0\\.0\\.1:${dead}: .*ECONNREFUSED`));
    assert.equal(byName(checks, 'python')[0]!.status, 'fail');
    assert.match(
      byName(checks, 'python')[0]!.detail,
      /^reward\.python: interpreter "python3-that-does-not-exist" not found/,
    );
    assert.match(text, /check env: 3 check\(s\) failed\n$/);
  },
);
