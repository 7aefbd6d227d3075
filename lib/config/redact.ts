/**
 * Secrets are never printed. What counts as one:
 *  - the password in any URL's userinfo (`postgres://user:pw@host` → `postgres://user:***@host`),
 *    wherever the URL appears (database_url, brokers, reward server URLs, kwargs);
 *  - URL query parameters that carry credentials (password, sslpassword, token, secret, key, …);
 *  - the value of any key named like a secret (…password, …secret, …token, …api_key,
 *    …credentials), except `…_env` keys, which hold the *name* of an environment variable.
 * Reward-server tokens are never in the config at all (only `auth_token_env`, the variable name).
 */
import { stringify } from 'yaml';
import type { Config } from './schema.ts';

export const REDACTED = '***';

const SECRET_KEY = /(password|passwd|pwd|secret|token|api[_-]?key|apikey|credentials?|private[_-]?key)$/i;
const SECRET_PARAM =
  /^(password|sslpassword|passwd|pwd|token|access_token|secret|api[_-]?key|apikey|key|sig|signature)$/i;

/** Whether a key names a secret value (and not an environment variable's name). */
export function isSecretKey(key: string): boolean {
  return SECRET_KEY.test(key) && !/_env$/i.test(key);
}

/** Redacts credentials inside a string: URL userinfo passwords and credential query parameters. */
export function redactString(s: string): string {
  // scheme://user:password@host — also inside longer strings (e.g. a DSN in free text).
  // The password runs to the last '@' of the token, so an unescaped '@' inside it is covered too.
  let out = s.replace(/([a-z][a-z0-9+.-]*:\/\/[^\s/@:]*):(\S*)@/gi, (_m, pre: string) => `${pre}:${REDACTED}@`);
  // ?password=… &token=… and libpq-style "password=…" pairs.
  out = out.replace(/(^|[?&;\s])([^=&;#\s?/]+)=([^&;#\s]*)/g, (m, sep: string, name: string) =>
    SECRET_PARAM.test(name) ? `${sep}${name}=${REDACTED}` : m,
  );
  return out;
}

function redactValue(value: unknown, key: string | null): unknown {
  if (key !== null && isSecretKey(key) && value !== null && value !== undefined && typeof value !== 'object')
    return REDACTED;
  if (typeof value === 'string') return redactString(value);
  if (Array.isArray(value)) return value.map((v) => redactValue(v, null));
  if (value && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) out[k] = redactValue(v, k);
    return out;
  }
  return value;
}

/** A deep copy of the config (or any value) with every secret replaced by `***`. */
export function redactSecrets<T>(cfg: T): T {
  return redactValue(cfg, null) as T;
}

/** The resolved config as YAML, secrets redacted — what a run prints at start. */
export function formatResolvedConfig(cfg: Config): string {
  return `# resolved configuration (defaults → file → overrides; secrets redacted)\n${stringify(redactSecrets(cfg), { lineWidth: 0 })}`;
}
