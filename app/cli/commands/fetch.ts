import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import { fetchAssets } from '../../../lib/assets/fetch.ts';
import { createS3Client } from '../../../lib/policy-store/index.ts';

/** `rlstream fetch SRC DEST [SRC DEST]…`: model directories or data from object storage or a volume, verified by sha256. */
export const fetchCommand: Command = {
  name: 'fetch',
  summary: 'Copy a model directory or data files from s3://… or a volume into a directory, each file checked by sha256',
  usage:
    'rlstream fetch <s3://bucket/prefix/ | DIR> <DEST> [<SRC> <DEST>]… [--sha256sums FILE] [--endpoint URL] [--region R] [--path-style]',
  help: [
    "A Kubernetes pod's init step (docs/kubernetes.md): every file under SRC is copied into DEST and",
    'checked against a SHA256SUMS list (sha256sum format) — the one in SRC, or --sha256sums FILE. A file',
    'not listed, a listed file missing, or other bytes stop it with the file named; nothing is fetched',
    'unverified. Files already in DEST with the listed sha256 are kept (a restarted init container',
    'fetches only what is missing). Several SRC DEST pairs are fetched one after the other by one process',
    '(a model directory and the data in one init step).',
    '',
    'S3 credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (a Secret as env), a web identity',
    '(EKS IRSA) or an instance role. MinIO: --endpoint http://minio:9000 --path-style; GCS:',
    '--endpoint https://storage.googleapis.com with HMAC keys. AWS_ENDPOINT_URL works too.',
    '',
    'options:',
    '  --sha256sums FILE   the list to check against (default: SRC/SHA256SUMS; one pair only)',
    '  --endpoint URL      S3 API endpoint (MinIO, GCS, Ceph)',
    '  --region R          region (default: AWS_REGION, else us-east-1)',
    '  --path-style        path-style URLs (MinIO and most self-hosted stores)',
  ].join('\n'),
  async run(argv) {
    const { positionals, flags, booleans } = parseArgs(argv, {
      flags: ['sha256sums', 'endpoint', 'region'],
      booleans: ['path-style'],
    });
    if (positionals.length < 2 || positionals.length % 2 !== 0)
      throw new UsageError('expected SRC DEST pairs (SRC: s3://bucket/prefix/ or a directory)');
    if (flags.sha256sums !== undefined && positionals.length > 2)
      throw new UsageError('--sha256sums names the list of one SRC; give one SRC DEST pair with it');
    for (let i = 0; i < positionals.length; i += 2) {
      const [src, dest] = positionals.slice(i, i + 2);
      const t0 = Date.now();
      const r = await fetchAssets(src, dest, {
        sumsFile: flags.sha256sums,
        client: () =>
          createS3Client({
            endpoint: flags.endpoint ?? null,
            region: flags.region ?? null,
            forcePathStyle: booleans.has('path-style'),
          }),
      });
      console.error(
        `rlstream fetch: ${src} → ${dest}: ${r.fetched.length} file(s) fetched (${(r.bytes / 1e6).toFixed(1)} MB), ${r.kept.length} already in place, all sha256-verified, in ${((Date.now() - t0) / 1000).toFixed(1)} s`,
      );
    }
    return 0;
  },
};
