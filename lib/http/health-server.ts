/**
 * The HTTP endpoints of a served stage (node:http), for the kubelet and Prometheus:
 *
 *   GET /healthz  liveness: 200 `{"status":"ok"}` whenever the event loop answers
 *   GET /readyz   readiness: 200 `{"ready":true}` only when every condition holds (connected to
 *                 bus and store, migrations applied, consumer joined), else 503 with the reason
 *                 (`{"ready":false,"reason":"waiting for migrations …"}`), also once the run has
 *                 finished
 *   GET /metrics  Prometheus text (lib/metrics/prometheus.ts)
 *
 * Anything else is 404; methods other than GET/HEAD are 405.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface Readiness {
  /** null when ready; otherwise why not (one line). */
  notReadyReason(): string | null;
}

export interface MetricsSource {
  metrics(): Promise<string>;
  readonly contentType: string;
}

export interface HealthServer {
  readonly port: number;
  close(): Promise<void>;
}

export async function startHealthServer(opts: {
  port: number;
  host?: string;
  readiness: Readiness;
  metrics: MetricsSource;
}): Promise<HealthServer> {
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const send = (code: number, type: string, body: string) => {
      res.writeHead(code, { 'content-type': type, 'cache-control': 'no-store' });
      res.end(req.method === 'HEAD' ? undefined : body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      send(405, 'application/json', JSON.stringify({ error: 'method not allowed' }));
      return;
    }
    if (path === '/healthz') {
      send(200, 'application/json', JSON.stringify({ status: 'ok' }));
      return;
    }
    if (path === '/readyz') {
      const reason = opts.readiness.notReadyReason();
      send(
        reason === null ? 200 : 503,
        'application/json',
        JSON.stringify(reason === null ? { ready: true } : { ready: false, reason }),
      );
      return;
    }
    if (path === '/metrics') {
      opts.metrics.metrics().then(
        (text) => send(200, opts.metrics.contentType, text),
        (e: unknown) => send(500, 'text/plain', `metrics failed: ${(e as Error).message}\n`),
      );
      return;
    }
    send(
      404,
      'application/json',
      JSON.stringify({ error: 'not found', endpoints: ['/healthz', '/readyz', '/metrics'] }),
    );
  });
  server.keepAliveTimeout = 5000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host ?? '0.0.0.0', () => {
      server.off('error', reject);
      resolve();
    });
  });
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
