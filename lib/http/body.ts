import type http from 'node:http';

/**
 * Reads a request body of at most `limit` bytes. A declared or streamed size over the limit
 * rejects with `tooLarge(message)` (and stops buffering); a connection closed before the end
 * rejects with `gone(message)`. Each server passes its own error types.
 */
export function readBody(
  req: http.IncomingMessage,
  limit: number,
  tooLarge: (message: string) => Error,
  gone: (message: string) => Error,
): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > limit) {
      reject(tooLarge(`request body of ${declared} bytes exceeds the limit of ${limit} bytes (--max-body-bytes)`));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0,
      over = false;
    req.on('data', (c: Buffer) => {
      if (over) return;
      size += c.length;
      if (size > limit) {
        over = true;
        chunks.length = 0;
        reject(tooLarge(`request body exceeds the limit of ${limit} bytes (--max-body-bytes)`));
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => {
      if (!over) resolve(Buffer.concat(chunks));
    });
    const closed = 'connection closed while the request body was being read';
    req.on('error', () => reject(gone(closed)));
    req.on('close', () => {
      if (!req.complete && !over) reject(gone(closed));
    });
  });
}
