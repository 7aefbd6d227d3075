/**
 * What `rlstream sql` sends to a database: one plain read query. A read-only transaction alone
 * does not stop `copy … to program`, `copy … to '<file>'`, `pg_read_file`, `lo_import`, or a
 * `lock table` inside `do $$ … $$`, so a query is checked before it is sent, token by token (string
 * literals, E'' strings, dollar quotes, quoted identifiers and comments are skipped as what they
 * are, so a keyword inside a string neither hides nor fakes anything):
 *  - exactly one statement, starting with select, with, values, table, explain (of one of those)
 *    or "(";
 *  - no data-modifying or session word anywhere (insert, update, delete, merge, into — select
 *    into creates a table — copy, do, lock, call, notify, prepare, execute, set, …), no row locks
 *    (for update / for share);
 *  - no server-side file, large-object, process, lock or settings function (pg_read_file,
 *    lo_import, pg_terminate_backend, set_config, dblink, query_to_xml, …), by bare, quoted or
 *    schema-qualified name.
 * A word that is a column name (e.g. a column called "update") can still be used quoted.
 */
import { RlError } from '../errors.ts';

type Token = { kind: 'word' | 'quoted' | 'string' | 'punct' | 'number' | 'param'; text: string; at: number };

function fail(msg: string, code = 'ERR_READ_ONLY'): never {
  throw new RlError(
    `the query must only read: ${msg} (rlstream sql runs one plain read query: select, with, values, table or explain)`,
    { code },
  );
}

/** Splits `sql` into tokens, without comments and whitespace. Throws on an unterminated string, quote or comment. */
export function tokenize(sql: string): Token[] {
  const out: Token[] = [];
  let i = 0;
  const n = sql.length;
  while (i < n) {
    const c = sql[i];
    if (/\s/.test(c)) {
      i++;
      continue;
    }
    if (c === '-' && sql[i + 1] === '-') {
      while (i < n && sql[i] !== '\n') i++;
      continue;
    }
    if (c === '/' && sql[i + 1] === '*') {
      // comments nest in PostgreSQL
      let depth = 1;
      i += 2;
      while (i < n && depth > 0) {
        if (sql[i] === '/' && sql[i + 1] === '*') {
          depth++;
          i += 2;
        } else if (sql[i] === '*' && sql[i + 1] === '/') {
          depth--;
          i += 2;
        } else i++;
      }
      if (depth > 0) fail('an unterminated /* comment');
      continue;
    }
    const start = i;
    // E'…' (backslash escapes), U&'…', B'…', X'…', N'…' and plain '…' ('' escapes a quote)
    if (
      c === "'" ||
      (/[eEbBxXnN]/.test(c) && sql[i + 1] === "'") ||
      ((c === 'u' || c === 'U') && sql[i + 1] === '&' && sql[i + 2] === "'")
    ) {
      const backslash = c === 'e' || c === 'E';
      i = sql.indexOf("'", i) + 1;
      for (;;) {
        if (i >= n) fail('an unterminated string literal');
        if (backslash && sql[i] === '\\') {
          i += 2;
          continue;
        }
        if (sql[i] === "'") {
          if (sql[i + 1] === "'") {
            i += 2;
            continue;
          }
          i++;
          break;
        }
        i++;
      }
      out.push({ kind: 'string', text: sql.slice(start, i), at: start });
      continue;
    }
    if (c === '"' || ((c === 'u' || c === 'U') && sql[i + 1] === '&' && sql[i + 2] === '"')) {
      i = sql.indexOf('"', i) + 1;
      let name = '';
      for (;;) {
        if (i >= n) fail('an unterminated quoted identifier');
        if (sql[i] === '"') {
          if (sql[i + 1] === '"') {
            name += '"';
            i += 2;
            continue;
          }
          i++;
          break;
        }
        name += sql[i++];
      }
      out.push({ kind: 'quoted', text: name, at: start });
      continue;
    }
    if (c === '$') {
      const m = /^\$([A-Za-z_][A-Za-z0-9_]*)?\$/.exec(sql.slice(i));
      if (m) {
        const end = sql.indexOf(m[0], i + m[0].length);
        if (end < 0) fail('an unterminated dollar-quoted string');
        i = end + m[0].length;
        out.push({ kind: 'string', text: sql.slice(start, i), at: start });
        continue;
      }
      const p = /^\$\d+/.exec(sql.slice(i));
      if (p) {
        i += p[0].length;
        out.push({ kind: 'param', text: p[0], at: start });
        continue;
      }
    }
    if (/[A-Za-z_\u0080-\uffff]/.test(c)) {
      while (i < n && /[A-Za-z0-9_$\u0080-\uffff]/.test(sql[i])) i++;
      out.push({ kind: 'word', text: sql.slice(start, i).toLowerCase(), at: start });
      continue;
    }
    if (/[0-9.]/.test(c) && /[0-9]/.test(sql[i + 1] ?? c)) {
      while (i < n && /[0-9a-zA-Z_.]/.test(sql[i])) i++;
      out.push({ kind: 'number', text: sql.slice(start, i), at: start });
      continue;
    }
    out.push({ kind: 'punct', text: c, at: start });
    i++;
  }
  return out;
}

const FIRST = new Set(['select', 'with', 'values', 'table']);

/** Words that write, change the session, or run something else, wherever they appear (unquoted). */
const FORBIDDEN_WORDS = new Set([
  'insert',
  'update',
  'delete',
  'merge',
  'into',
  'copy',
  'do',
  'lock',
  'call',
  'notify',
  'listen',
  'unlisten',
  'prepare',
  'execute',
  'deallocate',
  'set',
  'reset',
  'create',
  'alter',
  'drop',
  'truncate',
  'grant',
  'revoke',
  'vacuum',
  'cluster',
  'reindex',
  'refresh',
  'begin',
  'commit',
  'rollback',
  'savepoint',
  'declare',
]);

/** Functions that reach files, large objects, other processes, locks, settings or other connections. */
const FORBIDDEN_FUNCTION =
  /^(pg_read_file|pg_read_binary_file|pg_ls_.*|pg_stat_file|pg_file_.*|lo_.*|loread|lowrite|pg_terminate_backend|pg_cancel_backend|pg_signal_backend|pg_reload_conf|pg_rotate_logfile|pg_switch_wal|pg_promote|pg_(try_)?advisory_.*|set_config|dblink.*|query_to_xml.*|cursor_to_xml.*|query_to_xmlschema|pg_logical_emit_message|pg_create_.*|pg_drop_.*|pg_replication_.*|pg_log_backend_memory_contexts|pg_import_system_collations|pg_notify|pg_current_logfile|pg_backup_.*|pg_wal_replay_.*)$/;

/** Throws an RlError saying what to change unless `sql` is one plain read query. */
export function assertPlainRead(sql: string): void {
  const tokens = tokenize(sql);
  if (tokens.length === 0) fail('the query is empty');
  const semi = tokens.findIndex((t) => t.kind === 'punct' && t.text === ';');
  if (semi >= 0 && semi < tokens.length - 1)
    throw new RlError(
      'give one SQL statement per call (several statements separated by ";" are refused, so the read-only transaction cannot be ended early)',
      { code: 'ERR_SQL' },
    );
  const body = semi >= 0 ? tokens.slice(0, semi) : tokens;
  let k = 0;
  if (body[0].kind === 'word' && body[0].text === 'explain') {
    k = 1;
    // explain (option [value], …) or the bare analyze / verbose keywords, then the query
    if (body[k]?.text === '(') {
      while (k < body.length && body[k].text !== ')') k++;
      k++;
    }
    while (body[k]?.kind === 'word' && ['analyze', 'analyse', 'verbose'].includes(body[k].text)) k++;
  }
  const first = body[k];
  if (!first || !((first.kind === 'word' && FIRST.has(first.text)) || first.text === '(')) {
    const word = first?.text ?? '';
    if (
      first?.kind === 'word' &&
      (FORBIDDEN_WORDS.has(word) ||
        /^(explain|analy[sz]e|show|comment|security|load|discard|checkpoint|import|abort|start|end|release|fetch|move|close|reassign)$/.test(
          word,
        ))
    )
      fail(`${word.toUpperCase()} is refused`);
    throw new RlError(
      `syntax error at character ${(first?.at ?? 0) + 1}: a query starts with select, with, values, table or explain, not "${word}"`,
      { code: 'ERR_SQL' },
    );
  }
  for (let j = 0; j < body.length; j++) {
    const t = body[j];
    if (t.kind === 'word' && FORBIDDEN_WORDS.has(t.text)) {
      fail(
        `${t.text.toUpperCase()} (at character ${t.at + 1}) is refused; quote it ("${t.text}") if it is a column name`,
      );
    }
    if (t.kind === 'word' && t.text === 'for' && ['update', 'share', 'no', 'key'].includes(body[j + 1]?.text ?? '')) {
      fail(`row locks ("for ${body[j + 1].text}" at character ${t.at + 1}) are refused`);
    }
    if (
      (t.kind === 'word' || t.kind === 'quoted') &&
      FORBIDDEN_FUNCTION.test(t.kind === 'word' ? t.text : t.text.toLowerCase())
    ) {
      fail(
        `${t.text} (at character ${t.at + 1}) is refused: a server function that reaches files, other sessions or settings`,
      );
    }
  }
}
