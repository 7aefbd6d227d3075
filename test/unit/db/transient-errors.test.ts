/**
 * Which database failures are retried: PostgreSQL's retriable SQLSTATEs (serialization
 * failure 40001, deadlock 40P01, too many connections 53300, admin shutdown 57P0x, connection
 * exceptions 08xxx) and node-postgres' code-less socket/pool errors are transient wherever a stage
 * meets them (the store, raw SQL through retriableDbError); constraint and syntax errors are not.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isRetriable, RlError } from '../../../lib/errors.ts';
import { isConnectionError, retriableDbError } from '../../../lib/db/errors.ts';
import { storeError } from '../../../lib/store/kysely-store.ts';

const pgError = (code: string, message = `error ${code}`) => Object.assign(new Error(message), { code });

test('retriable SQLSTATEs and lost connections are transient in the store; bad rows and schema errors are not', () => {
  for (const code of [
    '40001',
    '40P01',
    '53300',
    '57P01',
    '57P02',
    '57P03',
    '08000',
    '08001',
    '08003',
    '08004',
    '08006',
  ]) {
    assert.equal(storeError('insert', pgError(code), 'db').retriable, true, code);
  }
  for (const message of [
    'Connection terminated unexpectedly',
    'timeout exceeded when trying to connect',
    'Client has encountered a connection error and is not queryable',
  ]) {
    assert.equal(storeError('insert', new Error(message), 'db').retriable, true, message);
  }
  for (const code of ['23505', '23514', '22P02', '42601', '42P01', '42703']) {
    assert.equal(storeError('insert', pgError(code), 'db').retriable, false, code);
  }
});

test('raw SQL: a lost connection becomes a TransientError, anything with its own retriable flag keeps it', () => {
  const lost = retriableDbError(pgError('57P01', 'terminating connection due to administrator command'), 'stage state');
  assert.equal(isRetriable(lost), true, 'admin shutdown (its SQLSTATE says so) → retried');
  const coded = retriableDbError(new Error('Connection terminated unexpectedly'), 'offsets');
  assert.ok(coded instanceof RlError && coded.retriable, 'a code-less socket error becomes a TransientError');
  assert.match((coded as Error).message, /offsets: lost the database connection/);
  const own = new RlError('poison', { retriable: false });
  assert.equal(retriableDbError(own, 'x'), own, 'an error that says it is not retriable stays so');
  const syntax = pgError('42601');
  assert.equal(retriableDbError(syntax, 'x'), syntax, 'a syntax error is passed through unchanged');
  assert.equal(isRetriable(syntax), false);
  // deadlock / serialization / too many connections are retried through isRetriable (not connection losses)
  for (const code of ['40001', '40P01', '53300']) {
    assert.equal(isRetriable(pgError(code)), true, code);
    assert.equal(isConnectionError(pgError(code)), false, code);
  }
  // causes are followed
  assert.equal(isRetriable(new Error('wrapped', { cause: pgError('08006') })), true);
});
