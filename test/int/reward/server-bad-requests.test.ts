/**
 * `rlstream reward-server` (a real process on loopback) answers bad requests with 400 (413 for an
 * oversize body) and a reason, and keeps serving; /healthz and unknown routes behave.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { mkdtempSync, readFileSync, rmSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { startRewardServers, type ServerGroup } from '../../../devkit/reward-procs.ts';
import { makePng } from '../../../devkit/reward-png.ts';

const MAX_BODY = 64 * 1024;
let group: ServerGroup | undefined;
let base = '';
let dir = '';

before(async () => {
  mkdirSync('test/.tmp', { recursive: true });
  dir = mkdtempSync(join('test/.tmp', 'reward-bad-'));
  group = await startRewardServers({ logDir: dir, args: ['--max-body-bytes', String(MAX_BODY), '--max-batch', '4'] });
  base = group.servers[0].url;
});

after(async () => {
  if (group) await group.stop();
  rmSync(dir, { recursive: true, force: true });
});

/** A raw request (node:http, no keep-alive) so odd bodies and missing Content-Length are possible. */
function raw(
  method: string,
  path: string,
  body?: string | Buffer,
  opts: { chunked?: boolean } = {},
): Promise<{ status: number; body: any; text: string }> {
  return new Promise((resolve, reject) => {
    const u = new URL(path, base);
    const headers: Record<string, string | number> = { 'content-type': 'application/json', connection: 'close' };
    if (body !== undefined && !opts.chunked) headers['content-length'] = Buffer.byteLength(body);
    const req = http.request(u, { method, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        let parsed: unknown;
        try {
          parsed = JSON.parse(text);
        } catch {
          parsed = undefined;
        }
        resolve({ status: res.statusCode ?? 0, body: parsed, text });
      });
    });
    req.on('error', reject);
    if (body !== undefined && opts.chunked) {
      // stream in pieces without a Content-Length (chunked transfer encoding)
      const buf = Buffer.from(body);
      for (let i = 0; i < buf.length; i += 16 * 1024) req.write(buf.subarray(i, i + 16 * 1024));
      req.end();
    } else {
      req.end(body);
    }
  });
}

async function assertStillServing(): Promise<void> {
  const r = await raw('POST', '/score', JSON.stringify({ prompt: 'the cat sat', response: 'the cat sat' }));
  assert.equal(r.status, 200, r.text);
  assert.equal(r.body.vlm_score, 1);
}

const cases: [string, string | Buffer, number, RegExp][] = [
  ['not JSON', '{"prompt": "a",', 400, /body is not valid JSON/],
  ['JSON but not an object', '[1, 2]', 400, /body must be a JSON object/],
  ['missing prompt', JSON.stringify({ response: 'x' }), 400, /^prompt: is required/],
  ['prompt of the wrong type', JSON.stringify({ prompt: 42 }), 400, /^prompt: must be a string, got number/],
  ['invalid base64 image', JSON.stringify({ prompt: 'a', image: 'iVBORw0KGgo$$$' }), 400, /^image: not valid base64/],
  [
    'base64 that is not a PNG',
    JSON.stringify({ prompt: 'a', image: Buffer.from('GIF89a-not-a-png').toString('base64') }),
    400,
    /^image: decodes to 16 bytes that are not a PNG/,
  ],
  [
    'batch with a bad item',
    JSON.stringify({ items: [{ prompt: 'a' }, { prompt: 'b', image: 'x' }] }),
    400,
    /^items\.1\.image: not valid base64/,
  ],
  [
    'batch over --max-batch',
    JSON.stringify({ items: Array.from({ length: 5 }, () => ({ prompt: 'a' })) }),
    400,
    /^items: has more than 4 requests/,
  ],
  [
    'oversize body (Content-Length)',
    JSON.stringify({ prompt: 'x'.repeat(MAX_BODY + 10) }),
    413,
    /exceeds the limit of 65536 bytes/,
  ],
];

for (const [name, body, status, reason] of cases) {
  test(`${name} → ${status} with a reason; the server keeps serving`, async () => {
    const r = await raw('POST', '/score', body);
    assert.equal(r.status, status, r.text);
    assert.match(r.body.error, reason);
    await assertStillServing();
  });
}

test('oversize body streamed without Content-Length → 413; the server keeps serving', async () => {
  const r = await raw('POST', '/score', JSON.stringify({ prompt: 'y'.repeat(4 * MAX_BODY) }), { chunked: true });
  assert.equal(r.status, 413, r.text);
  assert.match(r.body.error, /exceeds the limit of 65536 bytes/);
  await assertStillServing();
});

test('valid requests: single with a PNG image, batch form; /healthz; unknown path and wrong method', async () => {
  const png = makePng(7, 5);
  const one = await raw('POST', '/score', JSON.stringify({ prompt: 'a red square', image: png.toString('base64') }));
  assert.equal(one.status, 200, one.text);
  assert.deepEqual(one.body, { vlm_score: 1, ocr_confidence: 1, words: 3, image_width: 7, image_height: 5 });
  const batch = await raw(
    'POST',
    '/score',
    JSON.stringify({
      items: [
        { prompt: 'a b', response: 'a' },
        { prompt: 'q', response: '', ground_truth: 'q' },
      ],
    }),
  );
  assert.equal(batch.status, 200, batch.text);
  assert.equal(batch.body.results.length, 2);
  assert.ok(Math.abs(batch.body.results[0].vlm_score - 2 / 3) < 1e-12);
  assert.equal(batch.body.results[1].vlm_score, 0);
  assert.equal(batch.body.results[1].ocr_confidence, 0);
  const h = await raw('GET', '/healthz');
  assert.equal(h.status, 200);
  assert.equal(h.body.status, 'ok');
  assert.equal(h.body.max_batch, 4);
  assert.ok(h.body.bad_requests >= cases.length + 1, `bad requests counted: ${h.body.bad_requests}`);
  const nf = await raw('GET', '/nope');
  assert.equal(nf.status, 404);
  assert.match(nf.body.error, /use POST \/score or GET \/healthz/);
  const wm = await raw('GET', '/score');
  assert.equal(wm.status, 405);
});

test("every rejection is in the server's own log file", () => {
  const log = readFileSync(group!.servers[0].log, 'utf8');
  const lines = log
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  assert.ok(lines.some((l) => l.msg === 'reward server listening' && l.url === base));
  const rejected = lines.filter((l) => l.msg === 'rejected /score request');
  assert.ok(rejected.length >= cases.length + 1);
  assert.ok(rejected.some((l) => l.status === 413));
  assert.ok(lines.every((l) => l.run_id && l.stage === 'reward-server'));
});

test('CLI errors: missing --scorer and unknown flags exit 2 with usage; a busy port exits 1 naming it', async () => {
  const { spawnSync } = await import('node:child_process');
  const { SERVER_CLI } = await import('../../../devkit/reward-procs.ts');
  const cli = (args: string[]) =>
    spawnSync(process.execPath, ['--import', 'tsx', SERVER_CLI, ...args], { encoding: 'utf8', timeout: 30_000 });
  const noScorer = cli(['--port', '0']);
  assert.equal(noScorer.status, 2);
  assert.match(noScorer.stderr, /--scorer is required.*see `rlstream reward-server --help`/);
  const unknown = cli(['--scorer', 'x.ts', '--prot', '1']);
  assert.equal(unknown.status, 2);
  assert.match(unknown.stderr, /--prot/);
  const port = new URL(base).port;
  const busy = cli(['--scorer', 'examples/reward-server/overlap-scorer.ts', '--port', port, '--log-dir', dir]);
  assert.equal(busy.status, 1);
  assert.match(busy.stderr, new RegExp(`port ${port} on 127\\.0\\.0\\.1 is already in use — pick another --port`));
  const help = cli(['--help']);
  assert.equal(help.status, 0);
  assert.match(help.stdout, /--count N/);
  await assertStillServing();
});

test('a client that disconnects mid-body leaves nothing in flight; the server keeps serving', async () => {
  const net = await import('node:net');
  const u = new URL(base);
  const sock = net.connect(Number(u.port), u.hostname);
  await new Promise((r) => sock.once('connect', r));
  sock.write(
    'POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"prompt": "abc',
  );
  // wait (bounded) until the server has the request in flight, then hang up
  let h = (await raw('GET', '/healthz')).body;
  for (let i = 0; i < 100 && h.in_flight === 0; i++) {
    await new Promise((r) => setTimeout(r, 10));
    h = (await raw('GET', '/healthz')).body;
  }
  assert.equal(h.in_flight, 1);
  sock.destroy();
  for (let i = 0; i < 100 && h.in_flight !== 0; i++) {
    await new Promise((r) => setTimeout(r, 10));
    h = (await raw('GET', '/healthz')).body;
  }
  assert.equal(h.in_flight, 0);
  assert.match(readFileSync(group!.servers[0].log, 'utf8'), /"msg":"client went away"/);
  await assertStillServing();
});
