/** The topic contracts: schemas, types, ids, codecs, wire formats and topics. */
export * from './types.ts';
export * from './ids.ts';
export * from './packing.ts';
export { parseSchema, Int32LeType, Float32LeType } from './avro.ts';
export {
  SCHEMA_FAMILIES,
  SchemaCatalogue,
  schemaCatalogue,
  parseRef,
  defaultSchemaDir,
  type SchemaFamily,
  type SchemaVersion,
} from './schemas.ts';
export {
  checkCompatibility,
  assertCompatible,
  createCheckedResolver,
  SchemaIncompatibleError,
  type CompatibilityResult,
} from './compat.ts';
export { recordProblems } from './invariants.ts';
export * from './codec.ts';
export * from './registry.ts';
export * from './topics.ts';
export * from './builders.ts';
