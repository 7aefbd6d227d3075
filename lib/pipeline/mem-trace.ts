/**
 * Memory trace for profiling (off unless RLSTREAM_MEM_TRACE=1): `memMark(label)` writes one line
 * `memtrace {...}` to stderr with the wall time, the process's resident set (VmRSS) and its peak
 * (VmHWM) from /proc/self/status, and V8's heap, external and ArrayBuffer bytes. The stages mark
 * their phase boundaries with it, so a trace shows which copies of the weights coexist where the
 * peak is (bench/pipeline.ts reads the lines). Disabled, a mark is one boolean test.
 */
import { readFileSync } from 'node:fs';

const ON = process.env.RLSTREAM_MEM_TRACE === '1';

/** The prefix of a mark's line on stderr (bench/pipeline.ts reads the lines that start with it). */
export const MEM_TRACE_PREFIX = 'memtrace ';

/** A kB field (VmRSS, VmHWM, …) of a /proc/<pid>/status text, in kB (NaN when absent). */
export function statusKb(field: string, text: string): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

/** Writes a memory mark when RLSTREAM_MEM_TRACE=1; `detail`: extra numbers for the line. */
export function memMark(label: string, detail?: Record<string, number | string>): void {
  if (!ON) return;
  let status = '';
  try {
    status = readFileSync('/proc/self/status', 'utf8');
  } catch {
    // not Linux: the V8 numbers only
  }
  const u = process.memoryUsage();
  const gb = (b: number) => Math.round(b / 1e6) / 1e3;
  process.stderr.write(
    `${MEM_TRACE_PREFIX}${JSON.stringify({
      t: Date.now(),
      label,
      rss_gb: gb(statusKb('VmRSS', status) * 1024),
      hwm_gb: gb(statusKb('VmHWM', status) * 1024),
      array_buffers_gb: gb(u.arrayBuffers),
      external_gb: gb(u.external),
      heap_gb: gb(u.heapUsed),
      ...detail,
    })}\n`,
  );
}
