/**
 * In-process hand-off of policy versions' weights, from the writer (the update stage) to readers
 * in the same process (the rollout, embedded mode): a reader that would load version v from the
 * store takes the writer's arrays instead. No file is re-read, no sha256 recomputed, and the
 * sampler keeps its session (weights are graph inputs).
 *
 * Two kinds of version are handed off:
 *  - stored: the writer wrote the version to the store too. The reader takes the arrays when the
 *    store's manifest records the same sha256 for v's weights file as the writer computed while
 *    writing them (safe against a version rewritten after a failed batch, other bytes, and against
 *    one that never committed, no manifest row visible to the reader). Only the newest stored
 *    version is kept: a reader of an older one reads the store.
 *  - in memory only (policy.version_files = checkpoints): the version has no file; these arrays are
 *    the only copy. A reader asks for a version only once its `policy` record has committed (the
 *    controller names it in a prompt batch), and training is deterministic, so a version handed
 *    off again after a failed batch has the same bytes. The writer drops them (`retainHandOffs`)
 *    once no reader can still ask for them.
 *
 * Keyed by the PolicyStore object: the stages of one embedded process share one store object, so
 * they share one hand-off; a distributed stage has its own store and reads the version from it.
 * The arrays handed off are a copy the writer no longer modifies.
 */
import type { Weights } from '../model/params.ts';
import type { ArtifactFile, Executor, PolicyStore } from './port.ts';

interface Handed {
  /** sha256 of the weights file the writer stored (or, in memory only, would store) these weights as. */
  sha256: string;
  /** Name of that file (model.safetensors). */
  file: string;
  weights: Weights;
  /** Written to the store too (checked against its manifest); false: in memory only. */
  stored: boolean;
}

const handoffs = new WeakMap<PolicyStore, Map<number, Handed>>();

/**
 * Hands version `version`'s `weights` (stored as `file` with `sha256`, or in memory only when
 * `stored` is false) to readers of `store` in this process; a stored hand-off replaces the
 * previous stored one.
 */
export function handOff(
  store: PolicyStore,
  version: number,
  file: string,
  sha256: string,
  weights: Weights,
  stored = true,
): void {
  let m = handoffs.get(store);
  if (!m) handoffs.set(store, (m = new Map()));
  if (stored) for (const [v, h] of m) if (h.stored) m.delete(v);
  m.set(version, { sha256, file, weights, stored });
}

/** Forgets the versions handed off for `store` that `keep` rejects (readers can no longer ask for them); returns how many. */
export function retainHandOffs(store: PolicyStore, keep: (version: number) => boolean): number {
  const m = handoffs.get(store);
  let dropped = 0;
  if (m)
    for (const v of [...m.keys()])
      if (!keep(v)) {
        m.delete(v);
        dropped++;
      }
  return dropped;
}

/** The versions handed off for `store` in memory only (no file), oldest first. */
export function inMemoryVersions(store: PolicyStore): number[] {
  const m = handoffs.get(store);
  return m
    ? [...m]
        .filter(([, h]) => !h.stored)
        .map(([v]) => v)
        .sort((a, b) => a - b)
    : [];
}

/** sha256 of policy version `version` when it is handed off in memory only; null otherwise. */
export function inMemorySha(store: PolicyStore, version: number): string | null {
  const h = handoffs.get(store)?.get(version);
  return h && !h.stored ? h.sha256 : null;
}

/**
 * The handed-off weights of policy version `version`: in memory only, or the bytes the store
 * records for it (checked against the manifest through `db`); null otherwise (read the store).
 */
export async function takeHandOff(store: PolicyStore, version: number, db?: Executor): Promise<Weights | null> {
  const h = handoffs.get(store)?.get(version);
  if (!h) return null;
  if (!h.stored) return h.weights;
  const recorded: ArtifactFile[] = await store.files('policy', version, db);
  const f = recorded.find((x) => x.name === h.file);
  return f && f.sha256 === h.sha256 ? h.weights : null;
}
