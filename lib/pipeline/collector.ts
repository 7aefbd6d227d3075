/**
 * Collects the groups of one step (or one validation round) until the expected number has
 * arrived. A group is identified by its deterministic id, so redelivered duplicates are dropped.
 * Each entry remembers where it came from (topic/partition/offset) so the owning stage can keep
 * its consumer from committing past messages whose step is not finished yet: after a crash the
 * log redelivers them and the collector is rebuilt — in-flight work lives in the log, not only
 * in memory.
 */
export interface SourceRef {
  topic: string;
  partition: number;
  offset: number;
}

export interface Collected<G> {
  id: string;
  value: G;
  source: SourceRef;
}

export class StepCollector<G> {
  private readonly steps = new Map<string, Map<string, Collected<G>>>();

  /** Adds a group; returns false for a duplicate id (already collected for that key). */
  add(key: string, id: string, value: G, source: SourceRef): boolean {
    let m = this.steps.get(key);
    if (!m) {
      m = new Map();
      this.steps.set(key, m);
    }
    if (m.has(id)) return false;
    m.set(id, { id, value, source });
    return true;
  }

  count(key: string): number {
    return this.steps.get(key)?.size ?? 0;
  }

  /** The collected groups of a key, ordered by id (deterministic whatever the arrival order). */
  groups(key: string): Collected<G>[] {
    const m = this.steps.get(key);
    if (!m) return [];
    return [...m.values()].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  take(key: string): Collected<G>[] {
    const g = this.groups(key);
    this.steps.delete(key);
    return g;
  }

  keys(): string[] {
    return [...this.steps.keys()];
  }

  /**
   * Per (topic, partition): the lowest offset still held by an unfinished key — the consumer
   * must not commit at or past it.
   */
  lowWatermarks(): Map<string, number> {
    const low = new Map<string, number>();
    for (const m of this.steps.values()) {
      for (const c of m.values()) {
        const k = `${c.source.topic}:${c.source.partition}`;
        const cur = low.get(k);
        if (cur === undefined || c.source.offset < cur) low.set(k, c.source.offset);
      }
    }
    return low;
  }
}
