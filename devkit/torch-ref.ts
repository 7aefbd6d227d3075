/**
 * Runs the PyTorch reference drivers in test/torch/ from parity tests and the benchmark.
 *
 * The interpreter is `RLSTREAM_TORCH_PYTHON` (an error if it cannot import torch), else the first
 * of /usr/bin/python3 and `python3` on PATH that can `import torch`. `torchPython()` returns null
 * (with the reason) when none can, so tests skip with that message; anything else is an error.
 */
import { execFile, execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { decodeSafetensors, encodeSafetensors, type StTensor } from '../lib/model/safetensors.ts';

export const TORCH_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '../test/torch');

let cached: { python: string | null; reason: string } | undefined;

export function torchPython(): { python: string | null; reason: string } {
  if (cached) return cached;
  const explicit = process.env.RLSTREAM_TORCH_PYTHON;
  const candidates = explicit ? [explicit] : ['/usr/bin/python3', 'python3'];
  const tried: string[] = [];
  for (const py of candidates) {
    try {
      const v = execFileSync(py, ['-c', 'import torch; print(torch.__version__)'], {
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'pipe'],
      }).trim();
      cached = { python: py, reason: `torch ${v} via ${py}` };
      return cached;
    } catch (e) {
      tried.push(`${py}: ${String((e as Error).message).split('\n')[0]}`);
    }
  }
  // an interpreter named explicitly that cannot import torch is a setup error, not a reason to skip
  if (explicit) throw new Error(`RLSTREAM_TORCH_PYTHON=${explicit} cannot import torch (${tried.join('; ')})`);
  cached = {
    python: null,
    reason: `PyTorch is not installed (tried ${tried.join('; ')}); install python3-torch or set RLSTREAM_TORCH_PYTHON`,
  };
  return cached;
}

/** Runs test/torch/<script> with args; resolves with the JSON object it prints last. */
export function runTorch(script: string, args: string[], opts: { timeoutMs?: number } = {}): Promise<any> {
  const { python, reason } = torchPython();
  if (!python) return Promise.reject(new Error(reason));
  return new Promise((res, rej) => {
    execFile(
      python,
      [join(TORCH_DIR, script), ...args],
      { encoding: 'utf8', timeout: opts.timeoutMs ?? 600_000, maxBuffer: 64 << 20 },
      (err, stdout, stderr) => {
        if (err) {
          rej(new Error(`${script} ${args.join(' ')} failed: ${err.message}\n${stderr}`));
          return;
        }
        const lines = stdout.trim().split('\n');
        try {
          res(JSON.parse(lines[lines.length - 1]));
        } catch {
          rej(new Error(`${script} printed no JSON result:\n${stdout}\n${stderr}`));
        }
      },
    );
  });
}

/** A temporary directory removed by the returned cleanup function. */
export function tempDir(prefix = 'rlstream-torch-'): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

export function writeJson(path: string, obj: unknown): void {
  writeFileSync(path, JSON.stringify(obj));
}

// ── tensors for the drivers' safetensors inputs and outputs (lib/model/safetensors.ts) ──

export function writeTensors(path: string, tensors: Record<string, StTensor>): void {
  writeFileSync(path, encodeSafetensors(Object.entries(tensors)));
}

export function readTensors(path: string): Map<string, StTensor> {
  return decodeSafetensors(readFileSync(path), path).tensors;
}

export const f32 = (data: ArrayLike<number>, shape: number[]): StTensor => ({
  dtype: 'F32',
  shape,
  data: data instanceof Float32Array ? data : Float32Array.from(data),
});
export const i64 = (data: ArrayLike<number>, shape: number[]): StTensor => ({
  dtype: 'I64',
  shape,
  data: BigInt64Array.from(Array.from(data, (v) => BigInt(v))),
});
