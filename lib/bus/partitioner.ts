/**
 * Keyed partitioning shared by both bus adapters: Kafka's default partitioner, murmur2 of the
 * key's UTF-8 bytes made positive, modulo the partition count. kafkajs' `DefaultPartitioner`
 * (and the Java client's) compute the same, so a prompt group's n samples land in one partition
 * whichever adapter or Kafka client produced them.
 */

const SEED = 0x9747b28c;
const M = 0x5bd1e995;

/** 32-bit murmur2 (Kafka's variant, seed 0x9747b28c) as a signed int32. */
export function murmur2(data: Uint8Array): number {
  const length = data.length;
  let h = (SEED ^ length) | 0;
  const whole = length & ~3;
  for (let i = 0; i < whole; i += 4) {
    let k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24);
    k = Math.imul(k, M);
    k ^= k >>> 24;
    k = Math.imul(k, M);
    h = Math.imul(h, M) ^ k;
  }
  const rest = length & 3;
  if (rest === 3) h ^= data[whole + 2] << 16;
  if (rest >= 2) h ^= data[whole + 1] << 8;
  if (rest >= 1) {
    h ^= data[whole];
    h = Math.imul(h, M);
  }
  h ^= h >>> 13;
  h = Math.imul(h, M);
  h ^= h >>> 15;
  return h | 0;
}

/** Partition of `key` among `partitions` (Kafka's `toPositive(murmur2(key)) % partitions`). */
export function partitionFor(key: string, partitions: number): number {
  if (!Number.isInteger(partitions) || partitions < 1)
    throw new RangeError(`partition count must be a positive integer, got ${partitions}`);
  return (murmur2(Buffer.from(key, 'utf8')) & 0x7fffffff) % partitions;
}
