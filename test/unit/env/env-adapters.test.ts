/**
 * Environment adapters: the contract suite (test/support/env-contract.ts) against the JS module
 * adapter (examples/guess-number/env.ts) and the HTTP adapter (examples/guess-number/env_server.py,
 * standard-library Python), and each adapter's failures: timeout, crash, bad reply, unreachable.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { once } from 'node:events';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createEnvironment, EnvError } from '../../../lib/env/index.ts';
import { envContract, row } from '../../support/env-contract.ts';

const EXAMPLE = join(import.meta.dirname, '../../../examples/guess-number');

envContract('module adapter', async () => ({
  env: await createEnvironment({
    type: 'module',
    path: join(EXAMPLE, 'env.ts'),
    url: null,
    timeout_s: 5,
    max_retries: 0,
  }),
  close: async () => {},
}));

/** The Python server on a free port. */
async function pythonServer(): Promise<{ url: string; stop(): Promise<void> }> {
  const p = spawn('/usr/bin/python3', [join(EXAMPLE, 'env_server.py'), '--port', '0'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const [line] = (await once(p.stdout!, 'data')) as [Buffer];
  const url = /listening on (\S+)/.exec(line.toString())![1];
  return {
    url,
    async stop() {
      p.kill('SIGTERM');
      await once(p, 'exit');
    },
  };
}

envContract('HTTP adapter (Python standard-library server)', async () => {
  const s = await pythonServer();
  return {
    env: await createEnvironment({ type: 'http', path: null, url: s.url, timeout_s: 5, max_retries: 2 }),
    close: () => s.stop(),
  };
});

test('module adapter: a step that throws, hangs or answers the wrong shape is an EnvError of that kind', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'env-faults-'));
  const file = join(dir, 'faulty.mjs');
  writeFileSync(
    file,
    `export const start = (row) => ({ mode: row.kwargs.mode });
export function step(s) {
  if (s.mode === 'throw') throw new Error('boom');
  if (s.mode === 'hang') return new Promise(() => {});
  if (s.mode === 'shape') return { messages: 'higher', done: 'yes' };
  return { messages: [{ role: 'user', content: 'ok' }], done: true, reward: 2 };
}`,
  );
  const env = await createEnvironment({ type: 'module', path: file, url: null, timeout_s: 0.2, max_retries: 0 });
  const stepWith = async (mode: string) =>
    (await env.start({ ...row(1), kwargs: { mode } })).step({ role: 'assistant', content: 'x' });
  assert.deepEqual(await stepWith('ok'), {
    messages: [{ role: 'user', content: 'ok' }],
    reward: 2,
    done: true,
    metrics: {},
  });
  for (const [mode, kind, re] of [
    ['throw', 'crash', /threw: boom/],
    ['hang', 'timeout', /no answer within 200 ms/],
    ['shape', 'bad_reply', /messages: /],
  ] as const) {
    await assert.rejects(stepWith(mode), (e: unknown) => {
      assert.ok(e instanceof EnvError);
      assert.equal(e.kind, kind);
      assert.match(e.message, re);
      return true;
    });
  }
  await assert.rejects(
    createEnvironment({ type: 'module', path: join(dir, 'missing.mjs'), url: null, timeout_s: 1, max_retries: 0 }),
    /does not exist/,
  );
  await assert.rejects(
    createEnvironment({ type: 'carrier-pigeon', path: null, url: null, timeout_s: 1, max_retries: 0 }),
    /valid: module, http/,
  );
});

test('HTTP adapter: 5xx is retried, bad JSON / 4xx fail at once, a hang times out, a closed port is unreachable', async () => {
  let calls = 0;
  const server: Server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      const mode = JSON.parse(body).episode_id as string;
      if (req.url === '/reset') return res.end('{}');
      calls++;
      if (mode === 'flaky' && calls % 2 === 1) {
        res.statusCode = 503;
        return res.end('busy');
      }
      if (mode === 'json') return res.end('{"messages": [');
      if (mode === 'gone') {
        res.statusCode = 404;
        return res.end('no such episode');
      }
      if (mode === 'hang') return;
      res.end(JSON.stringify({ messages: [], done: true, reward: 1 }));
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as { port: number }).port;
  try {
    const env = await createEnvironment({
      type: 'http',
      path: null,
      url: `http://127.0.0.1:${port}/`,
      timeout_s: 0.3,
      max_retries: 2,
    });
    const stepWith = async (id: string) => (await env.start(row(1, id))).step({ role: 'assistant', content: '1' });
    assert.equal((await stepWith('flaky')).reward, 1);
    for (const [id, kind, re] of [
      ['json', 'bad_reply', /not JSON/],
      ['gone', 'bad_reply', /HTTP 404/],
      ['hang', 'timeout', /no answer within 300 ms/],
    ] as const) {
      await assert.rejects(stepWith(id), (e: unknown) => {
        assert.ok(e instanceof EnvError);
        assert.equal(e.kind, kind);
        assert.match(e.message, re);
        return true;
      });
    }
  } finally {
    server.closeAllConnections();
    server.close();
  }
  const down = await createEnvironment({
    type: 'http',
    path: null,
    url: `http://127.0.0.1:${port}`,
    timeout_s: 0.3,
    max_retries: 1,
  });
  await assert.rejects(down.start(row(1)), (e: unknown) => e instanceof EnvError && e.kind === 'unreachable');
});
