/**
 * The Confluent wire format and the schema registry client, against a tiny HTTP server that
 * implements the two registry endpoints the client uses (register under a subject, get by id).
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  Codec,
  ConfluentMessageCodec,
  PlainMessageCodec,
  createCodec,
  createMessageCodec,
} from '../../../lib/contracts/codec.ts';
import { HttpSchemaRegistry, InMemorySchemaRegistry, SchemaRegistryError } from '../../../lib/contracts/registry.ts';
import { SchemaCatalogue, defaultSchemaDir } from '../../../lib/contracts/schemas.ts';
import { readyAll, topicCodecs } from '../../../lib/contracts/topics.ts';
import type { TrajectoryGroup } from '../../../lib/contracts/types.ts';
import { PoisonMessageError, TransientError, ConfigError } from '../../../lib/errors.ts';
import { Gen, plain } from './fixtures.ts';

interface Req {
  method: string;
  url: string;
  auth?: string;
  contentType?: string;
  body?: string;
}

class FakeRegistry {
  server: Server;
  url = '';
  requests: Req[] = [];
  failNext = 0;
  failStatus = 503;
  rejectRegister: string | null = null;
  private schemas: string[] = [];
  private subjects = new Map<string, number[]>();

  constructor() {
    this.server = createServer((req, res) => {
      let body = '';
      req.on('data', (c) => {
        body += c;
      });
      req.on('end', () => {
        this.requests.push({
          method: req.method!,
          url: req.url!,
          auth: req.headers.authorization,
          contentType: req.headers['content-type'],
          body,
        });
        const send = (status: number, obj: unknown) => {
          res.writeHead(status, { 'content-type': 'application/vnd.schemaregistry.v1+json' });
          res.end(JSON.stringify(obj));
        };
        if (this.failNext > 0) {
          this.failNext--;
          return send(this.failStatus, { error_code: this.failStatus * 100, message: 'registry busy' });
        }
        let m = /^\/subjects\/([^/]+)\/versions$/.exec(req.url!);
        if (m && req.method === 'POST') {
          const subject = decodeURIComponent(m[1]);
          if (this.rejectRegister === subject)
            return send(409, {
              error_code: 409,
              message: 'Schema being registered is incompatible with an earlier schema for subject',
            });
          const text = JSON.parse(body).schema as string;
          let id = this.schemas.indexOf(text) + 1;
          if (id === 0) {
            this.schemas.push(text);
            id = this.schemas.length;
          }
          this.subjects.set(subject, [...(this.subjects.get(subject) ?? []), id]);
          return send(200, { id });
        }
        m = /^\/schemas\/ids\/(\d+)$/.exec(req.url!);
        if (m && req.method === 'GET') {
          const text = this.schemas[Number(m[1]) - 1];
          return text === undefined
            ? send(404, { error_code: 40403, message: 'Schema not found' })
            : send(200, { schema: text });
        }
        send(404, { error_code: 404, message: 'no route' });
      });
    });
  }
  async start() {
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }
  stop() {
    return new Promise<void>((r) => this.server.close(() => r()));
  }
  count(method: string, prefix: string) {
    return this.requests.filter((q) => q.method === method && q.url.startsWith(prefix)).length;
  }
}

const reg = new FakeRegistry();
before(() => reg.start());
after(() => reg.stop());

const poison = (re: RegExp) => (e: unknown) => e instanceof PoisonMessageError && re.test(e.message);

test('confluent framing: magic byte 0, big-endian schema id, then the same Avro body as plain', async () => {
  const client = new HttpSchemaRegistry({ url: reg.url });
  const mc = new ConfluentMessageCodec(createCodec('trajectories'), client, 'rl.run-1.trajectories-value');
  assert.throws(() => mc.encode(new Gen(1).trajectoryGroup()), /not ready: await ready\(\)/);
  await mc.ready();
  await mc.ready();
  assert.equal(reg.count('POST', '/subjects/rl.run-1.trajectories-value/versions'), 1, 'registered once');
  const post = reg.requests.find((q) => q.method === 'POST')!;
  assert.equal(post.contentType, 'application/vnd.schemaregistry.v1+json');
  assert.equal(JSON.parse(post.body!).schema, createCodec('trajectories').schema.text);

  const g = new Gen(31).trajectoryGroup(2, { n: 3 });
  const msg = mc.encode(g);
  assert.deepEqual(msg.headers, {});
  assert.equal(msg.value[0], 0);
  assert.equal(msg.value.readUInt32BE(1), mc.schemaId);
  assert.deepEqual(msg.value.subarray(5), createCodec('trajectories').encode(g), 'the body is the plain Avro encoding');
  assert.equal(mc.writerOf(msg.value), `confluent:${mc.schemaId}`);
  assert.deepEqual(plain(await mc.decode(msg.value)), plain(g));
  assert.deepEqual(mc.encode(g, true).value, msg.value, 'reuse gives the same bytes');
});

test('a fresh consumer fetches the writer schema by id once, and caches it', async () => {
  const producer = new ConfluentMessageCodec(
    createCodec('scored'),
    new HttpSchemaRegistry({ url: reg.url }),
    'rl.run-1.scored-value',
  );
  await producer.ready();
  const consumer = new ConfluentMessageCodec(
    createCodec('scored'),
    new HttpSchemaRegistry({ url: reg.url }),
    'rl.run-1.scored-value',
  );
  const gen = new Gen(32);
  const before = reg.count('GET', '/schemas/ids/');
  for (let i = 0; i < 5; i++) {
    const g = gen.scoredGroup(i + 1);
    assert.deepEqual(plain(await consumer.decode(producer.encode(g).value)), plain(g));
  }
  assert.equal(reg.count('GET', '/schemas/ids/') - before, 1);
});

test('an older writer schema from the registry is resolved into the newest reader', async () => {
  const cat = new SchemaCatalogue();
  const dir = defaultSchemaDir();
  cat.add('trajectories.v1', readFileSync(join(dir, 'trajectories.v1.avsc'), 'utf8'));
  cat.add('trajectories.v2', readFileSync(join(dir, 'evolution', 'trajectories.v2.avsc'), 'utf8'));
  const v1 = new ConfluentMessageCodec(
    new Codec<TrajectoryGroup>('trajectories', { catalogue: cat, ref: 'trajectories.v1' }),
    new HttpSchemaRegistry({ url: reg.url }),
    'evo-value',
  );
  const v2 = new ConfluentMessageCodec(
    new Codec<TrajectoryGroup & { tags: string[] }>('trajectories', { catalogue: cat }),
    new HttpSchemaRegistry({ url: reg.url }),
    'evo-value',
  );
  await v1.ready();
  await v2.ready();
  assert.notEqual(v1.schemaId, v2.schemaId);
  const g = new Gen(33).trajectoryGroup(3);
  const d = await v2.decode(v1.encode(g).value);
  assert.deepEqual(d.tags, []);
  assert.equal(d.samples.length, g.samples.length);
});

test('unknown ids, wrong magic bytes, short or plain-format messages are poison', async () => {
  const mc = new ConfluentMessageCodec(
    createCodec('policy'),
    new HttpSchemaRegistry({ url: reg.url }),
    'rl.run-1.policy-value',
  );
  await mc.ready();
  const good = mc.encode(new Gen(34).policyVersion(3)).value;
  const unknown = Buffer.from(good);
  unknown.writeUInt32BE(9999, 1);
  await assert.rejects(
    mc.decode(unknown),
    poison(/writer schema confluent:9999.*schema id 9999 is unknown to the schema registry/),
  );
  const magic = Buffer.from(good);
  magic[0] = 1;
  await assert.rejects(mc.decode(magic), poison(/the first byte is 1, not the Confluent magic byte 0/));
  await assert.rejects(mc.decode(good.subarray(0, 3)), poison(/3 bytes is shorter than the 5-byte Confluent header/));
  await assert.rejects(mc.decode(good.subarray(0, good.length - 1)), poison(/truncated/));
  await assert.rejects(mc.decode(null), poison(/tombstone/));
  // a plain-format message never starts with 0 (its first field is a non-empty run id)
  const plainMsg = new PlainMessageCodec(createCodec('policy')).encode(new Gen(34).policyVersion(3));
  await assert.rejects(mc.decode(plainMsg.value), poison(/not the Confluent magic byte 0.*schema_wire_format = plain/));
  // and a confluent message read in plain mode is poison too
  await assert.rejects(
    new PlainMessageCodec(createCodec('policy')).decode(good, {}),
    (e: unknown) => e instanceof PoisonMessageError,
  );
  // a registered schema of another family is rejected as incompatible, naming the field
  const other = new ConfluentMessageCodec(
    createCodec('metrics'),
    new HttpSchemaRegistry({ url: reg.url }),
    'rl.run-1.metrics-value',
  );
  await other.ready();
  await assert.rejects(
    mc.decode(other.encode(new Gen(35).metrics(1)).value),
    poison(
      /confluent:\d+ cannot be read as policy\.v1: PolicyVersion: record MetricsRecord cannot be read as record PolicyVersion/,
    ),
  );
});

test('registry outages are retriable and not cached; rejections are not retriable', async () => {
  const producer = new ConfluentMessageCodec(
    createCodec('metrics'),
    new HttpSchemaRegistry({ url: reg.url }),
    'rl.run-2.metrics-value',
  );
  await producer.ready();
  const consumer = new ConfluentMessageCodec(
    createCodec('metrics'),
    new HttpSchemaRegistry({ url: reg.url }),
    'rl.run-2.metrics-value',
  );
  const msg = producer.encode(new Gen(36).metrics(2)).value;
  reg.failNext = 1;
  await assert.rejects(
    consumer.decode(msg),
    (e: unknown) =>
      e instanceof TransientError &&
      e.retriable &&
      /answered 503 while fetching schema id \d+: registry busy/.test(e.message),
  );
  assert.equal((await consumer.decode(msg)).step, 2, 'the next attempt succeeds');

  reg.rejectRegister = 'rl.run-2.updates-value';
  const rejected = new ConfluentMessageCodec(
    createCodec('updates'),
    new HttpSchemaRegistry({ url: reg.url }),
    'rl.run-2.updates-value',
  );
  await assert.rejects(
    rejected.ready(),
    (e: unknown) =>
      e instanceof SchemaRegistryError &&
      !e.retriable &&
      e.code === 'ERR_SCHEMA_INCOMPATIBLE' &&
      /answered 409.*incompatible with an earlier schema/.test(e.message),
  );
  reg.rejectRegister = null;
  await rejected.ready(); // a failed registration is not cached

  const down = new HttpSchemaRegistry({ url: 'http://127.0.0.1:1', timeoutMs: 2000 });
  await assert.rejects(
    down.getSchema(1),
    (e: unknown) =>
      e instanceof TransientError &&
      /schema registry http:\/\/127\.0\.0\.1:1 unreachable while fetching schema id 1/.test(e.message),
  );
  assert.throws(() => new HttpSchemaRegistry({ url: 'localhost:8081' }), /must be http\(s\)|not a valid URL/);
});

test('credentials in the URL become basic auth and never appear in messages', async () => {
  const u = new URL(reg.url);
  const client = new HttpSchemaRegistry({ url: `http://bob:s%3Acret@${u.host}` });
  assert.equal(client.displayUrl, reg.url);
  await client.register('auth-value', '{"type":"string"}');
  const q = reg.requests[reg.requests.length - 1];
  assert.equal(q.auth, `Basic ${Buffer.from('bob:s:cret').toString('base64')}`);
  await assert.rejects(
    client.getSchema(424242),
    (e: unknown) => e instanceof SchemaRegistryError && !/cret/.test(e.message) && e.code === 'ERR_SCHEMA_NOT_FOUND',
  );
});

test('topic codecs from the run config: plain by default, confluent with subjects per run topic', async () => {
  const plainCodecs = topicCodecs({ schema_wire_format: 'plain', schema_registry_url: null }, 'rl', 'run-9');
  assert.equal(plainCodecs.trajectories.format, 'plain');
  assert.equal(plainCodecs.validation.codec.ref, 'scored.v4');
  assert.throws(
    () => topicCodecs({ schema_wire_format: 'confluent', schema_registry_url: null }, 'rl', 'run-9'),
    (e: unknown) =>
      e instanceof ConfigError &&
      /pipeline\.schema_registry_url is required when pipeline\.schema_wire_format = confluent/.test(e.message),
  );

  const http = topicCodecs({ schema_wire_format: 'confluent', schema_registry_url: reg.url }, 'rl', 'run-9');
  await readyAll(http);
  for (const t of [
    'prompts',
    'trajectories',
    'scored',
    'validation',
    'updates',
    'policy',
    'metrics',
    'control',
    'deadletter',
  ]) {
    assert.ok(reg.count('POST', `/subjects/rl.run-9.${t}-value/versions`) === 1, t);
  }
  const scoredId = (http.scored as ConfluentMessageCodec<unknown>).schemaId;
  assert.equal(
    (http.validation as ConfluentMessageCodec<unknown>).schemaId,
    scoredId,
    'validation shares the scored schema',
  );

  const mem = new InMemorySchemaRegistry();
  const codecs = topicCodecs({ schema_wire_format: 'confluent', schema_registry_url: null }, 'rl', 'run-9', {
    registry: mem,
  });
  await readyAll(codecs);
  assert.deepEqual(mem.versions('rl.run-9.validation-value'), mem.versions('rl.run-9.scored-value'));
  const pb = new Gen(37).promptBatch(1);
  assert.deepEqual(plain(await codecs.prompts.decode(codecs.prompts.encode(pb).value)), plain(pb));
  await assert.rejects(
    mem.getSchema(999),
    (e: unknown) => e instanceof SchemaRegistryError && e.code === 'ERR_SCHEMA_NOT_FOUND',
  );
  // createMessageCodec picks the framing
  assert.equal(createMessageCodec('control', { format: 'confluent', registry: mem, subject: 's' }).format, 'confluent');
});
