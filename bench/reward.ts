/**
 * Reward benchmark: the HTTP reward client against 4 local `rlstream reward-server` processes
 * (one launcher, --count 4, the example scorer) on loopback.
 *
 *  - scored trajectories/s: 2 reward replicas (clients) score 2 × N trajectories at once, seed
 *    preset ({image: 64×64 PNG as base64, prompt}), concurrency_per_server 4; batch_size 1 (the
 *    seed's protocol) and 8 (batch form);
 *    Also the client's own CPU time per trajectory (this process runs both replicas);
 *  - the client's added latency: one-at-a-time `scoreBatch([item])` against the same request sent
 *    raw (node:http, keep-alive) to the same server, interleaved in rotating order; p50 of the
 *    paired differences —
 *    for the default node:http transport and for the fetch (undici) transport (which is why
 *    node:http is the default).
 *
 * Run: `node --import tsx bench/reward.ts` (prints a table). The machine's cores are shared by
 * the 4 servers, the clients and anything else running: read the numbers as orders of magnitude.
 */
import http from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { createRemoteRewardClient } from '../lib/reward/http-client.ts';
import { withRemoteDefaults, type RewardRequestItem } from '../lib/reward/types.ts';
import type { FetchLike } from '../lib/reward/transport.ts';
import { startRewardServers } from '../devkit/reward-procs.ts';
import { makePng } from '../devkit/reward-png.ts';

export interface Row {
  name: string;
  value: number;
  unit: string;
  goal?: number;
}

const PER_REPLICA = Number(process.env.RLSTREAM_BENCH_REWARD_N ?? 2000);
const LATENCY_N = 400;
const GOAL_TPS = 1000;

const round = (x: number, d = 1) => Math.round(x * 10 ** d) / 10 ** d;
const p50 = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
};

function items(prefix: string, n: number): RewardRequestItem[] {
  const png = makePng(64, 64, 7);
  return Array.from({ length: n }, (_, i) => ({
    id: `${prefix}-${i}`,
    step: 0,
    prompt_text: `draw the word ${i % 10 ? 'apple' : 'pear'} in red`,
    response_text: 'ok',
    ground_truth: 'apple',
    images: [png],
  }));
}

function rawPost(agent: http.Agent, url: string, body: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      url,
      {
        method: 'POST',
        agent,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
      },
      (res) => {
        res.on('data', () => {});
        res.on('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`HTTP ${res.statusCode}`))));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

export async function run(): Promise<Row[]> {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-bench-reward-'));
  const group = await startRewardServers({ count: 4, logDir: dir });
  const rows: Row[] = [];
  try {
    const urls = group.servers.map((s) => s.url);
    const globalFetch = globalThis.fetch as unknown as FetchLike;

    for (const batch_size of [1, 8]) {
      const opts = withRemoteDefaults({ enabled: true, urls, batch_size, concurrency_per_server: 4 });
      const clients = [0, 1].map((replicaIndex) => createRemoteRewardClient(opts, { replicaIndex }));
      await Promise.all(clients.map((c, r) => c.scoreBatch(items(`warm${batch_size}-${r}`, 200))));
      const batches = clients.map((_, r) => items(`run${batch_size}-${r}`, PER_REPLICA));
      const t0 = performance.now();
      const cpu0 = process.cpuUsage();
      const outs = await Promise.all(clients.map((c, r) => c.scoreBatch(batches[r])));
      const s = (performance.now() - t0) / 1000;
      const cpu = process.cpuUsage(cpu0);
      const failed = outs.flat().filter((o) => !o.ok).length;
      if (failed > 0) throw new Error(`bench/reward: ${failed} trajectories failed to score`);
      clients.forEach((c) => c.close());
      rows.push({
        name: `reward/http/4_servers_2_replicas/batch_${batch_size}/scored_trajectories_per_s`,
        value: round((2 * PER_REPLICA) / s, 0),
        unit: 'traj/s',
        goal: GOAL_TPS,
      });
      // the client's own CPU (this process: both replicas, request building, parsing, routing)
      rows.push({
        name: `reward/http/4_servers_2_replicas/batch_${batch_size}/client_cpu_per_trajectory`,
        value: round((cpu.user + cpu.system) / (2 * PER_REPLICA), 0),
        unit: 'µs',
      });
    }

    // added latency over a raw request to the same server, one request at a time; the three
    // variants are interleaved so that load from elsewhere affects them alike
    const item = items('lat', 1)[0];
    const body = JSON.stringify({ image: item.images![0].toString('base64'), prompt: item.prompt_text });
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const target = `${urls[0]}/score`;
    const variants = [
      ['node_http', undefined],
      ['fetch', globalFetch],
    ] as const;
    const latClients = variants.map(([, fetchImpl]) =>
      createRemoteRewardClient(withRemoteDefaults({ enabled: true, urls: [urls[0]] }), { replicaIndex: 0, fetchImpl }),
    );
    const rawMs: number[] = [];
    const clientMs: number[][] = variants.map(() => []);
    // one step = one request by one variant (-1 = raw); the order rotates every round so that no
    // variant always comes first (after the server has been idle the longest)
    const step = async (v: number, i: number) => {
      const t = performance.now();
      if (v < 0) await rawPost(agent, target, body);
      else {
        const [o] = await latClients[v].scoreBatch([{ ...item, id: `lat-${i}` }]);
        if (!o.ok) throw new Error(`bench/reward: ${o.reason}`);
      }
      if (i >= 50) (v < 0 ? rawMs : clientMs[v]).push(performance.now() - t);
    };
    const order = [-1, ...variants.map((_, v) => v)];
    for (let i = 0; i < LATENCY_N + 50; i++) {
      for (let k = 0; k < order.length; k++) await step(order[(i + k) % order.length], i);
    }
    agent.destroy();
    latClients.forEach((c) => c.close());
    rows.push({ name: 'reward/http/raw_request/latency_p50', value: round(p50(rawMs) * 1000, 0), unit: 'µs' });
    for (const [v, [name]] of variants.entries()) {
      rows.push({
        name: `reward/http/client_${name}/latency_p50`,
        value: round(p50(clientMs[v]) * 1000, 0),
        unit: 'µs',
      });
      // p50 of the paired differences: robust to slow phases of the machine
      const diffs = clientMs[v].map((x, i) => x - rawMs[i]);
      rows.push({
        name: `reward/http/client_${name}/added_latency_p50`,
        value: round(p50(diffs) * 1000, 0),
        unit: 'µs',
      });
    }
  } finally {
    await group.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  return rows;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const rows = await run();
  const w = Math.max(...rows.map((r) => r.name.length));
  console.log(`${'benchmark'.padEnd(w)}  ${'value'.padStart(9)}  ${'unit'.padEnd(6)}  goal`);
  for (const r of rows) {
    const goal = r.goal === undefined ? '' : `≥ ${r.goal} ${r.value >= r.goal ? '(met)' : '(NOT met)'}`;
    console.log(`${r.name.padEnd(w)}  ${String(r.value).padStart(9)}  ${r.unit.padEnd(6)}  ${goal}`);
  }
}
