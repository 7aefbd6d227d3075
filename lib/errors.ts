/**
 * Errors carry a `retriable` flag; retry and dead-letter logic read only that flag (as kafkajs does).
 *  - retriable: a transient condition (connection refused, timeout, lock busy, 5xx); retry with backoff.
 *  - not retriable: bad input or a bug; retrying cannot help — dead-letter the message or stop with the message.
 */
export class RlError extends Error {
  readonly retriable: boolean;
  readonly code: string;
  readonly details?: Record<string, unknown>;
  constructor(
    message: string,
    opts: { retriable?: boolean; code?: string; cause?: unknown; details?: Record<string, unknown> } = {},
  ) {
    super(message, opts.cause !== undefined ? { cause: opts.cause } : undefined);
    this.name = 'RlError';
    this.retriable = opts.retriable ?? false;
    this.code = opts.code ?? 'ERR_RLSTREAM';
    this.details = opts.details;
  }
}

/** Bad configuration or input: the message says what to change. Never retriable. */
export class ConfigError extends RlError {
  constructor(message: string, details?: Record<string, unknown>) {
    super(message, { retriable: false, code: 'ERR_CONFIG', details });
    this.name = 'ConfigError';
  }
}

/** A transient failure: retry with backoff. */
export class TransientError extends RlError {
  constructor(message: string, opts: { cause?: unknown; code?: string; details?: Record<string, unknown> } = {}) {
    super(message, { ...opts, retriable: true, code: opts.code ?? 'ERR_TRANSIENT' });
    this.name = 'TransientError';
  }
}

/** A message that can never be processed (undecodable, unknown schema, unknown run): dead-letter it. */
export class PoisonMessageError extends RlError {
  constructor(message: string, opts: { cause?: unknown; details?: Record<string, unknown> } = {}) {
    super(message, { ...opts, retriable: false, code: 'ERR_POISON' });
    this.name = 'PoisonMessageError';
  }
}

const STORAGE_CODES: Record<string, string> = {
  ENOSPC: 'no space left on device',
  EDQUOT: 'disk quota exceeded',
  EROFS: 'read-only file system',
  EIO: 'input/output error',
};

const WASI_ERRNO: Record<number, string> = { 51: 'ENOSPC', 19: 'EDQUOT', 69: 'EROFS', 29: 'EIO' };

/**
 * A stage could not write its own files (policy versions, checkpoints, its database): a full,
 * read-only or failing disk. Not retriable in place and not the message's fault either, so the
 * delivery policy never dead-letters or commits past it: the stage stops with its batch
 * uncommitted (`stopsStage`), and the same command continues once the disk is fixed.
 */
export class StorageError extends RlError {
  readonly stopsStage = true;
  readonly path: string;
  constructor(path: string, errno: string, cause?: unknown) {
    super(
      `cannot write ${path}: ${STORAGE_CODES[errno] ?? errno} (${errno}); free space on (or fix) that file system, then run the same command again: the run continues where it stopped, nothing was committed past this point`,
      { retriable: false, code: 'ERR_STORAGE', cause, details: { path, errno } },
    );
    this.name = 'StorageError';
    this.path = path;
  }
}

/**
 * The StorageError `err` stands for (it or a cause of it is one, or carries a storage errno such
 * as ENOSPC), naming `path` — or the failing call's own path — as where; null for other errors.
 */
export function storageFault(err: unknown, path?: string): StorageError | null {
  for (let e = err, depth = 0; e && typeof e === 'object' && depth < 8; e = (e as { cause?: unknown }).cause, depth++) {
    if (e instanceof StorageError) return e;
    const x = e as { code?: unknown; path?: unknown; dest?: unknown; name?: unknown; errno?: unknown };
    // PGlite (Emscripten) throws {name: 'ErrnoError', errno} with WASI numbers and no path
    if (x.name === 'ErrnoError' && typeof x.errno === 'number' && WASI_ERRNO[x.errno])
      return new StorageError(path ?? 'the embedded database', WASI_ERRNO[x.errno], err);
    if (typeof x.code === 'string' && x.code in STORAGE_CODES) {
      const where =
        path ??
        (typeof x.dest === 'string' ? x.dest : typeof x.path === 'string' ? x.path : null) ??
        `a file (${errorMessage(e)})`;
      return new StorageError(where, x.code, err);
    }
  }
  return null;
}

/**
 * A fault of the stage's own environment, not of the message it was processing: a storage
 * failure (`storageFault`), or an error that says so itself (`stopsStage`, e.g. a stored file
 * whose bytes are not the ones recorded). The delivery policy never dead-letters or commits past
 * it: the stage stops with its batch uncommitted, and the same command continues once it is fixed.
 */
export function stageFault(err: unknown): RlError | null {
  const storage = storageFault(err);
  if (storage) return storage;
  for (let e = err, depth = 0; e && typeof e === 'object' && depth < 8; e = (e as { cause?: unknown }).cause, depth++)
    if (e instanceof RlError && (e as { stopsStage?: unknown }).stopsStage === true)
      return err instanceof RlError ? err : e; // the outermost message says the most (e.g. where to resume from)
  return null;
}

/** `err` as a StorageError naming `path` when it is a storage failure, else `err` unchanged. */
export function withStoragePath(err: unknown, path: string): unknown {
  return storageFault(err, path) ?? err;
}

const TRANSIENT_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'EAI_AGAIN',
  'ENOTFOUND',
  'EHOSTUNREACH',
  '57P01',
  '57P02',
  '57P03',
  '08000',
  '08003',
  '08006',
  '08001',
  '08004',
  '40001',
  '40P01',
  '53300',
]);

/** Whether an arbitrary thrown value is worth retrying. Reads only the `retriable` flag when present. */
export function isRetriable(err: unknown): boolean {
  if (err && typeof err === 'object') {
    const e = err as { retriable?: unknown; code?: unknown; cause?: unknown };
    if (typeof e.retriable === 'boolean') return e.retriable;
    if (typeof e.code === 'string' && TRANSIENT_CODES.has(e.code)) return true;
    if (e.cause) return isRetriable(e.cause);
  }
  return false;
}

/** The message of any thrown value: an Error's, an error-like object's (`message`), else its JSON — never "[object Object]". */
export function errorMessage(err: unknown): string {
  if (err instanceof Error) return err.message;
  if (err && typeof err === 'object') {
    const m = (err as { message?: unknown }).message;
    if (typeof m === 'string' && m) return m;
    try {
      return JSON.stringify(err) ?? String(err);
    } catch {
      return String(err);
    }
  }
  return String(err);
}
