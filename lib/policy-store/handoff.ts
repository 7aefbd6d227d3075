/**
 * In-process hand-off of the newest policy version's weights, from the writer (the update stage)
 * to readers in the same process (the rollout, embedded mode): a reader that would load version v
 * from the store takes the writer's arrays instead when the store's manifest records the same
 * sha256 for v's weights file as the writer computed while writing them. No file is re-read, no
 * sha256 recomputed, and the sampler keeps its session (weights are graph inputs).
 *
 * Keyed by the PolicyStore object: the stages of one embedded process share one store object, so
 * they share one hand-off; a distributed stage has its own store and reads the version from it.
 * The manifest check makes the hand-off safe against a version that was rewritten after a failed
 * batch (other bytes, other sha256) and against a version that never committed (no manifest row
 * visible to the reader). The arrays handed off are a copy the writer no longer modifies.
 */
import type { Weights } from '../model/params.ts';
import type { ArtifactFile, Executor, PolicyStore } from './port.ts';

interface Handed {
  version: number;
  /** sha256 of the weights file the writer stored these weights as. */
  sha256: string;
  /** Name of that file (model.safetensors). */
  file: string;
  weights: Weights;
}

const handoffs = new WeakMap<PolicyStore, Handed>();

/** Hands `weights` (stored as `file` with `sha256`) to readers of `store` in this process; replaces the previous version. */
export function handOff(store: PolicyStore, version: number, file: string, sha256: string, weights: Weights): void {
  handoffs.set(store, { version, sha256, file, weights });
}

/** Forgets what was handed off for `store` (a writer that restores an older version). */
export function dropHandOff(store: PolicyStore): void {
  handoffs.delete(store);
}

/**
 * The handed-off weights of policy version `version`, when they are the bytes the store records
 * for it (checked against the manifest through `db`); null otherwise (read the store).
 */
export async function takeHandOff(store: PolicyStore, version: number, db?: Executor): Promise<Weights | null> {
  const h = handoffs.get(store);
  if (!h || h.version !== version) return null;
  const recorded: ArtifactFile[] = await store.files('policy', version, db);
  const f = recorded.find((x) => x.name === h.file);
  return f && f.sha256 === h.sha256 ? h.weights : null;
}
