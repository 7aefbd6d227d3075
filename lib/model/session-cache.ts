/**
 * ORT sessions cached by graph family: the key names everything that changes the graph (model
 * config, graph kind and options, weights version when weights are baked in) plus the session
 * options. Shapes are symbolic (B, T, …), so one session serves every batch and length. Least
 * recently used sessions are released beyond `maxEntries`.
 */
import { createHash } from 'node:crypto';
import { createSession, ort, type SessionOptions } from '../onnx/runtime.ts';

export class SessionCache {
  private readonly entries = new Map<string, Promise<ort.InferenceSession>>();
  private builds = 0;

  constructor(readonly maxEntries = 16) {}

  /** The cached session for `key`, building the model with `build()` on a miss. */
  async get(key: string, build: () => Uint8Array, opts: SessionOptions = {}): Promise<ort.InferenceSession> {
    const full = `${key}|threads=${opts.threads ?? ''}|device=${opts.device ?? 'cpu'}|opt=${opts.graphOptimizationLevel ?? 'all'}${opts.lowMemory ? '|lowmem' : ''}`;
    const hit = this.entries.get(full);
    if (hit) {
      this.entries.delete(full);
      this.entries.set(full, hit);
      return hit;
    }
    this.builds++;
    const p = createSession(build(), opts);
    this.entries.set(full, p);
    p.catch(() => this.entries.delete(full));
    while (this.entries.size > this.maxEntries) {
      const oldest = this.entries.keys().next().value as string;
      const s = this.entries.get(oldest)!;
      this.entries.delete(oldest);
      s.then((x) => x.release()).catch(() => undefined);
    }
    return p;
  }

  /** Number of sessions created so far (for tests and logs). */
  get sessionsBuilt(): number {
    return this.builds;
  }
  get size(): number {
    return this.entries.size;
  }

  async clear(): Promise<void> {
    const all = [...this.entries.values()];
    this.entries.clear();
    await Promise.all(all.map((p) => p.then((s) => s.release()).catch(() => undefined)));
  }
}

/** Process-wide default cache. */
export const defaultSessionCache = new SessionCache();

/** A short stable hash of a JSON-able value, for cache keys. */
export function keyOf(value: unknown): string {
  return createHash('sha256').update(JSON.stringify(value)).digest('hex').slice(0, 16);
}
