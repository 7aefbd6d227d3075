/**
 * Errors carry a `retriable` flag; retry and dead-letter logic read only that flag (as kafkajs does).
 *  - retriable: a transient condition (connection refused, timeout, lock busy, 5xx); retry with backoff.
 *  - not retriable: bad input or a bug; retrying cannot help — dead-letter the message or stop with the message.
 */
export class RlError extends Error {
  readonly retriable: boolean;
  readonly code: string;
  readonly details?: Record<string, unknown>;
  constructor(message: string, opts: { retriable?: boolean; code?: string; cause?: unknown; details?: Record<string, unknown> } = {}) {
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

const TRANSIENT_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'EAI_AGAIN', 'ENOTFOUND', 'EHOSTUNREACH', '57P01', '57P02', '57P03', '08000', '08003', '08006', '08001', '08004', '40001', '40P01', '53300']);

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

export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
