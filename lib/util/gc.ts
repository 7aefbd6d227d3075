/**
 * A full V8 garbage collection on demand. Arrays the process has let go of (a policy version no
 * reader holds any more) are freed only when V8 next collects, and onnxruntime's own allocations
 * (a training step's activations) are invisible to V8's heuristics: a step can reach its peak with
 * gigabytes of unreachable weights still resident. Callers that have just dropped such arrays
 * collect before the next large native allocation.
 */
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

let collect: (() => void) | null = null;

/** Runs a full garbage collection (V8's `gc()`, exposed at first use when node was not started with --expose-gc). */
export function collectGarbage(): void {
  if (!collect) {
    const exposed = (globalThis as { gc?: () => void }).gc;
    if (exposed) collect = exposed;
    else {
      setFlagsFromString('--expose-gc');
      // a new context created after the flag is set has `gc` on its global object
      collect = runInNewContext('gc') as () => void;
    }
  }
  collect();
}
