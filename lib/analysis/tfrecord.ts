/**
 * TFRecord framing, the container of TensorBoard event files. Each record is
 *
 *   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
 *
 * with CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) and TensorFlow's mask
 * `((crc >>> 15) | (crc << 17)) + 0xa282ead8` (mod 2^32).
 */
import { RlError } from '../errors.ts';

const CRC32C_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

/** CRC-32C of `data` (RFC 3720 appendix B.4). */
export function crc32c(data: Uint8Array): number {
  let c = 0xffffffff;
  for (let i = 0; i < data.length; i++) c = CRC32C_TABLE[(c ^ data[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** TensorFlow's masked CRC (so a CRC stored inside CRC'd data does not CRC to a constant). */
export function maskedCrc32c(data: Uint8Array): number {
  const c = crc32c(data);
  return ((((c >>> 15) | (c << 17)) >>> 0) + 0xa282ead8) >>> 0;
}

/** One framed record. */
export function encodeRecord(data: Uint8Array): Buffer {
  const out = Buffer.alloc(8 + 4 + data.length + 4);
  out.writeBigUInt64LE(BigInt(data.length), 0);
  out.writeUInt32LE(maskedCrc32c(out.subarray(0, 8)), 8);
  out.set(data, 12);
  out.writeUInt32LE(maskedCrc32c(data), 12 + data.length);
  return out;
}

/**
 * Splits a TFRecord file into its records, verifying both CRCs of each. A truncated final record
 * (a writer killed mid-write) is reported in `truncatedAt` rather than thrown, as TensorBoard
 * ignores it; a CRC mismatch throws with the record's byte offset.
 */
export function decodeRecords(buf: Uint8Array, what = 'TFRecord data'): { records: Buffer[]; truncatedAt?: number } {
  const b = Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
  const records: Buffer[] = [];
  let off = 0;
  while (off < b.length) {
    if (b.length - off < 12) return { records, truncatedAt: off };
    const lenBig = b.readBigUInt64LE(off);
    const lenCrc = b.readUInt32LE(off + 8);
    if (maskedCrc32c(b.subarray(off, off + 8)) !== lenCrc) {
      throw new RlError(`${what}: corrupt record length at byte ${off} (CRC mismatch)`, { code: 'ERR_TFRECORD' });
    }
    if (lenBig > BigInt(b.length)) return { records, truncatedAt: off };
    const len = Number(lenBig);
    if (b.length - off < 12 + len + 4) return { records, truncatedAt: off };
    const data = b.subarray(off + 12, off + 12 + len);
    if (maskedCrc32c(data) !== b.readUInt32LE(off + 12 + len)) {
      throw new RlError(`${what}: corrupt record data at byte ${off} (CRC mismatch)`, { code: 'ERR_TFRECORD' });
    }
    records.push(data);
    off += 12 + len + 4;
  }
  return { records };
}
