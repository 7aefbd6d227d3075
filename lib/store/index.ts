/**
 * Store factory: picks the adapter for a database handle. `createStore` shares a handle the caller
 * owns (the embedded bus and the store use one, so a batch commits atomically); `openStore` opens
 * a handle (taking the PGlite lock file and running migrations) that the store closes.
 */
import { openDatabase, type Database, type DatabaseTarget } from '../db/database.ts';
import { PgliteStore } from './pglite-store.ts';
import { PostgresStore } from './postgres-store.ts';
import type { Store } from './port.ts';

export * from './port.ts';
export { PgliteStore } from './pglite-store.ts';
export { PostgresStore } from './postgres-store.ts';

export function createStore(database: Database, opts: { ownsDatabase?: boolean } = {}): Store {
  return database.kind === 'pglite' ? new PgliteStore(database, opts) : new PostgresStore(database, opts);
}

export async function openStore(target: DatabaseTarget): Promise<Store & { readonly database: Database }> {
  const database = await openDatabase(target);
  try {
    const store = createStore(database, { ownsDatabase: true });
    return Object.assign(store, { database });
  } catch (e) {
    await database.close();
    throw e;
  }
}
