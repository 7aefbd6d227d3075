/**
 * TEST FIXTURE — a deliberately broken reward server, as a third-party server might be: it answers
 * every POST /score with a fixed fault. `rlstream reward-server` never produces these bodies, so
 * they are emulated here at the HTTP level (real node:http on loopback, in the test process).
 *   malformed   200 with a body that is not JSON (an HTML error page);
 *   nan         200 {"vlm_score": NaN, "ocr_confidence": 0.9} (Python's json.dumps does this);
 *   range       200 {"vlm_score": 1.7, "ocr_confidence": 0.9};
 *   missing     200 {"ocr_confidence": 0.9};
 *   500         500 {"error": "boom"};
 *   429         429 with Retry-After: 0, then healthy answers (after `failFirst` requests).
 * GET /healthz answers 200 so breakers can half-open and re-test the server.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';

export type HttpFault = 'malformed' | 'nan' | 'range' | 'missing' | '500' | '429';

export interface FaultyServer {
  url: string;
  key: string;
  hits(): number;
  close(): Promise<void>;
}

export async function startFaultyServer(fault: HttpFault, opts: { failFirst?: number } = {}): Promise<FaultyServer> {
  let hits = 0;
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.url === '/healthz') {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{"status":"ok"}');
        return;
      }
      hits++;
      const send = (status: number, body: string, headers: Record<string, string> = {}) => {
        res.writeHead(status, { 'content-type': 'application/json', ...headers });
        res.end(body);
      };
      switch (fault) {
        case 'malformed':
          return send(200, '<html><body>502 Bad Gateway</body></html>', { 'content-type': 'text/html' });
        case 'nan':
          return send(200, '{"vlm_score": NaN, "ocr_confidence": 0.9}');
        case 'range':
          return send(200, '{"vlm_score": 1.7, "ocr_confidence": 0.9}');
        case 'missing':
          return send(200, '{"ocr_confidence": 0.9}');
        case '500':
          return send(500, '{"error": "boom"}');
        case '429':
          if (hits <= (opts.failFirst ?? 1)) return send(429, '{"error": "slow down"}', { 'retry-after': '0' });
          return send(200, '{"vlm_score": 0.25, "ocr_confidence": 0.75}');
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    key: `127.0.0.1:${port}`,
    hits: () => hits,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
