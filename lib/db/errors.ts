/**
 * Database errors that mean "the connection went away" (a PostgreSQL restart, a failover, a
 * dropped socket): retry with backoff. node-postgres reports several of them without an error
 * code (`Connection terminated unexpectedly`, pool timeouts), which `isRetriable` alone cannot
 * see; raw SQL outside the store (stage state, the embedded log) goes through `retriableDbError`.
 */
import { TransientError, errorMessage, isRetriable } from '../errors.ts';

const CONNECTION_MESSAGES =
  /Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Client was closed and is not queryable|terminating connection due to administrator command|the database system is (starting up|shutting down|in recovery mode)|Connection refused|connect ECONNREFUSED|read ECONNRESET|write EPIPE/i;

/** Whether `err` (or a cause of it) says the database connection was lost or refused. */
export function isConnectionError(err: unknown): boolean {
  for (let e = err, depth = 0; e && typeof e === 'object' && depth < 8; e = (e as { cause?: unknown }).cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && /^(57P0[123]|08\d\d\d|ECONNREFUSED|ECONNRESET|EPIPE|ETIMEDOUT)$/.test(code))
      return true;
    if (CONNECTION_MESSAGES.test(errorMessage(e))) return true;
  }
  return false;
}

/**
 * `err` itself when it carries its own `retriable` flag (that flag wins) or is not a connection
 * error; else a TransientError wrapping it.
 */
export function retriableDbError(err: unknown, what: string): unknown {
  if (typeof (err as { retriable?: unknown })?.retriable === 'boolean' || isRetriable(err) || !isConnectionError(err))
    return err;
  return new TransientError(`${what}: lost the database connection (${errorMessage(err)}); retrying`, {
    cause: err,
    code: 'ERR_DB_CONNECTION',
  });
}
