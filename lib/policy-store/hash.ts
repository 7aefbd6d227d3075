/** sha256 of files, streamed (a model file may not fit a Buffer comfortably). */
import { createHash } from 'node:crypto';
import { createReadStream, promises as fs } from 'node:fs';
import { join } from 'node:path';
import type { ArtifactFile } from './port.ts';

export async function sha256File(path: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(path, { highWaterMark: 1 << 20 })) h.update(chunk as Buffer);
  return h.digest('hex');
}

/** The regular files of a version directory (not dot-names), with sha256 and size, by name. */
export async function describeDir(dir: string): Promise<ArtifactFile[]> {
  const names = (await fs.readdir(dir)).filter((n) => !n.startsWith('.')).sort();
  const out: ArtifactFile[] = [];
  for (const name of names) {
    const st = await fs.stat(join(dir, name));
    if (!st.isFile()) continue;
    out.push({ name, sha256: await sha256File(join(dir, name)), sizeBytes: st.size });
  }
  return out;
}
