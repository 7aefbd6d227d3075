/** Topic names and partition counts valid on both adapters (Kafka's rules). */
import { ConfigError } from '../errors.ts';
import type { TopicSpec } from './port.ts';

const LEGAL = /^[a-zA-Z0-9._-]{1,249}$/;

export function validateTopicName(name: string): void {
  if (typeof name !== 'string' || !LEGAL.test(name) || name === '.' || name === '..') {
    throw new ConfigError(`invalid topic name ${JSON.stringify(name)}: use 1–249 characters from a-z A-Z 0-9 . _ -`);
  }
}

export function validateTopicSpecs(specs: TopicSpec[]): void {
  for (const s of specs) {
    validateTopicName(s.name);
    if (!Number.isInteger(s.partitions) || s.partitions < 1 || s.partitions > 100_000) {
      throw new ConfigError(`topic ${s.name}: partitions must be an integer from 1 to 100000, got ${s.partitions}`);
    }
  }
}
