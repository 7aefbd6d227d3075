/**
 * pipeline.kafka.sasl / tls as kafkajs options: SASL PLAIN and SCRAM-SHA-256/512 with the password
 * (and optionally the user name) from the environment — a Kubernetes Secret mounted as env —, TLS
 * with a CA, a client certificate and key read from files (a Secret mounted as a volume). Every
 * problem says which key or variable to set.
 */
import { readFileSync } from 'node:fs';
import type { KafkaConfig, SASLOptions } from 'kafkajs';
import type { Config } from '../config/schema.ts';
import { ConfigError } from '../errors.ts';

type KafkaSection = Pick<Config['pipeline']['kafka'], 'sasl' | 'tls'>;

function readPem(key: string, path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch (e) {
    throw new ConfigError(
      `pipeline.kafka.tls.${key}: cannot read ${path} (${(e as NodeJS.ErrnoException).code ?? String(e)}); mount the Secret there or fix the path`,
    );
  }
}

/** The `ssl` and `sasl` options of kafkajs for this config (empty: plaintext, no authentication). */
export function kafkaSecurity(
  k: KafkaSection,
  env: NodeJS.ProcessEnv = process.env,
): Pick<KafkaConfig, 'ssl' | 'sasl'> {
  const out: Pick<KafkaConfig, 'ssl' | 'sasl'> = {};
  const t = k.tls;
  if (t.cert_file !== null && t.key_file === null)
    throw new ConfigError(
      "pipeline.kafka.tls.cert_file needs pipeline.kafka.tls.key_file (the client certificate's private key)",
    );
  if (t.key_file !== null && t.cert_file === null)
    throw new ConfigError('pipeline.kafka.tls.key_file needs pipeline.kafka.tls.cert_file (the client certificate)');
  if (t.enabled || t.ca_file !== null || t.cert_file !== null) {
    out.ssl = {
      rejectUnauthorized: t.reject_unauthorized,
      ...(t.ca_file !== null ? { ca: [readPem('ca_file', t.ca_file)] } : {}),
      ...(t.cert_file !== null
        ? { cert: readPem('cert_file', t.cert_file), key: readPem('key_file', t.key_file!) }
        : {}),
      ...(t.servername !== null ? { servername: t.servername } : {}),
    };
  }
  const s = k.sasl;
  if (s.mechanism !== 'none') {
    const username = s.username ?? env[s.username_env];
    if (!username)
      throw new ConfigError(
        `pipeline.kafka.sasl.mechanism = ${s.mechanism} needs a user name: set pipeline.kafka.sasl.username, or the environment variable ${s.username_env}`,
      );
    const password = env[s.password_env];
    if (!password)
      throw new ConfigError(
        `pipeline.kafka.sasl.mechanism = ${s.mechanism} needs the password in the environment variable ${s.password_env} (pipeline.kafka.sasl.password_env); in Kubernetes, from a Secret: env[].valueFrom.secretKeyRef`,
      );
    out.sasl = { mechanism: s.mechanism, username, password } as SASLOptions;
  }
  return out;
}
