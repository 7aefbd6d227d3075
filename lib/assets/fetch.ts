/**
 * Bringing a run's assets (a model directory, data files) into a pod: `rlstream fetch SRC DEST`,
 * the init step of a Kubernetes pod. SRC is `s3://bucket/prefix/` (every object under the prefix:
 * AWS S3, MinIO, GCS's XML API) or a local directory (a PersistentVolumeClaim mounted read-only).
 * Every file is checked against a `SHA256SUMS` list (`sha256sum` format: `<hex>  <name>`), the
 * source's own or one given: a file missing from the list, a listed file missing from the source,
 * or bytes with another sha256 stop the fetch, naming the file. Files go to DEST through a
 * temporary name and are renamed into place, and a file already in DEST with the listed sha256 is
 * kept, so a restarted init container fetches only what is missing.
 */
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream, existsSync, promises as fs } from 'node:fs';
import { dirname, join, relative, sep } from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { S3Client } from '@aws-sdk/client-s3';
import { ConfigError, RlError } from '../errors.ts';
import { IntegrityError } from '../policy-store/port.ts';
import { sha256File } from '../policy-store/hash.ts';
import { s3Error } from '../policy-store/s3-store.ts';

export const SUMS_FILE = 'SHA256SUMS';

/** `sha256sum` output → name → hex (a `*` binary marker and `./` are accepted). */
export function parseSums(text: string, where: string): Map<string, string> {
  const out = new Map<string, string>();
  text.split('\n').forEach((line, i) => {
    if (!line.trim() || line.startsWith('#')) return;
    const m = /^([0-9a-fA-F]{64}) [ *](?:\.\/)?(.+)$/.exec(line.trimEnd());
    if (!m)
      throw new ConfigError(
        `${where}:${i + 1}: not a sha256sum line ("<64 hex digits>  <file>"): ${line.slice(0, 80)}`,
      );
    if (m[2].split('/').includes('..')) throw new ConfigError(`${where}:${i + 1}: ${m[2]} leaves the directory`);
    out.set(m[2], m[1].toLowerCase());
  });
  return out;
}

interface Source {
  where: string;
  /** Relative names of the files (SHA256SUMS included when there). */
  list(): Promise<string[]>;
  read(name: string): Promise<Readable>;
}

function s3Source(client: S3Client, url: string): Source {
  const m = /^s3:\/\/([^/]+)\/?(.*)$/.exec(url);
  if (!m) throw new ConfigError(`${url} is not an s3://bucket/prefix/ URL`);
  const bucket = m[1];
  const prefix = m[2] === '' || m[2].endsWith('/') ? m[2] : `${m[2]}/`;
  const sdk = import('@aws-sdk/client-s3');
  return {
    where: `s3://${bucket}/${prefix}`,
    async list() {
      const { ListObjectsV2Command } = await sdk;
      const names: string[] = [];
      for (let token: string | undefined, more = true; more;) {
        const page = await client
          .send(new ListObjectsV2Command({ Bucket: bucket, Prefix: prefix, ContinuationToken: token }))
          .catch((e: unknown) => {
            throw s3Error(`listing s3://${bucket}/${prefix}`, e);
          });
        for (const o of page.Contents ?? []) if (!o.Key!.endsWith('/')) names.push(o.Key!.slice(prefix.length));
        token = page.NextContinuationToken;
        more = !!page.IsTruncated && !!token;
      }
      return names;
    },
    async read(name) {
      const { GetObjectCommand } = await sdk;
      const res = await client
        .send(new GetObjectCommand({ Bucket: bucket, Key: prefix + name }))
        .catch((e: unknown) => {
          throw s3Error(`downloading s3://${bucket}/${prefix}${name}`, e);
        });
      return res.Body as Readable;
    },
  };
}

function dirSource(root: string): Source {
  return {
    where: root,
    async list() {
      if (!existsSync(root)) throw new ConfigError(`${root} does not exist (is the volume mounted there?)`);
      const out: string[] = [];
      const walk = async (d: string) => {
        for (const e of await fs.readdir(d, { withFileTypes: true })) {
          const p = join(d, e.name);
          if (e.isDirectory()) await walk(p);
          else if (e.isFile()) out.push(relative(root, p).split(sep).join('/'));
        }
      };
      await walk(root);
      return out;
    },
    async read(name) {
      return createReadStream(join(root, name));
    },
  };
}

async function readAll(r: Readable): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of r) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

export interface FetchResult {
  /** Files written, and files already in place with their listed sha256. */
  fetched: string[];
  kept: string[];
  bytes: number;
}

/**
 * Fetches `src` into `dest`, every file verified against the SHA256SUMS list (`sumsFile`, else the
 * source's own). `client` makes the S3 client for s3:// sources.
 */
export async function fetchAssets(
  src: string,
  dest: string,
  opts: { sumsFile?: string; client?: () => Promise<S3Client> } = {},
): Promise<FetchResult> {
  const source = src.startsWith('s3://')
    ? s3Source(await (opts.client ?? (() => Promise.reject(new ConfigError('no S3 client'))))(), src)
    : dirSource(src);
  const names = await source.list();
  const sums = opts.sumsFile
    ? parseSums(await fs.readFile(opts.sumsFile, 'utf8'), opts.sumsFile)
    : names.includes(SUMS_FILE)
      ? parseSums(await readAll(await source.read(SUMS_FILE)), `${source.where}${SUMS_FILE}`)
      : null;
  if (!sums)
    throw new ConfigError(
      `${source.where} has no ${SUMS_FILE}: write one next to the files (cd DIR && sha256sum * > ${SUMS_FILE}) or pass --sha256sums FILE; nothing is fetched unverified`,
    );
  const files = names.filter((n) => n !== SUMS_FILE || opts.sumsFile);
  const unlisted = files.filter((n) => !sums.has(n));
  if (unlisted.length)
    throw new IntegrityError(
      `${source.where}: ${unlisted.length} file(s) not in ${SUMS_FILE}: ${unlisted.slice(0, 5).join(', ')} — add them to the list or remove them`,
      { path: `${source.where}${unlisted[0]}`, expected: 'listed', actual: 'unlisted' },
    );
  const missing = [...sums.keys()].filter((n) => !files.includes(n));
  if (missing.length)
    throw new IntegrityError(
      `${source.where}: ${missing.length} file(s) in ${SUMS_FILE} are missing from the source: ${missing.slice(0, 5).join(', ')} (an incomplete upload?)`,
      { path: `${source.where}${missing[0]}`, expected: sums.get(missing[0])!, actual: 'missing' },
    );
  const out: FetchResult = { fetched: [], kept: [], bytes: 0 };
  for (const name of [...sums.keys()].sort()) {
    const want = sums.get(name)!;
    const target = join(dest, ...name.split('/'));
    if (existsSync(target) && (await sha256File(target)) === want) {
      out.kept.push(name);
      continue;
    }
    await fs.mkdir(dirname(target), { recursive: true });
    const tmp = `${target}.fetch-${randomBytes(4).toString('hex')}`;
    const h = createHash('sha256');
    let size = 0;
    try {
      const body = await source.read(name);
      body.on('data', (c: Buffer) => {
        h.update(c);
        size += c.length;
      });
      await pipeline(body, createWriteStream(tmp));
      const got = h.digest('hex');
      if (got !== want)
        throw new IntegrityError(
          `${source.where}${name} has sha256 ${got}, but ${SUMS_FILE} lists ${want}: the stored file is damaged or was replaced without updating the list`,
          { path: `${source.where}${name}`, expected: want, actual: got },
        );
      await fs.rename(tmp, target);
    } catch (e) {
      await fs.rm(tmp, { force: true }).catch(() => undefined);
      if (e instanceof RlError) throw e;
      throw new RlError(`fetching ${source.where}${name}: ${(e as Error).message}`, { retriable: true, cause: e });
    }
    out.fetched.push(name);
    out.bytes += size;
  }
  return out;
}
