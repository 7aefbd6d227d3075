-- Trajectory rows stay inline and uncompressed up to a full page. A typical row (a few hundred
-- response tokens: two int4[] and three real[] of per-token values, plus text) is 3–8 KB: over the
-- default 2 KB TOAST threshold, so every insert compressed its arrays (lz4 on PostgreSQL, pglz on
-- PGlite) and moved them to the TOAST table and its index. Per-token log-probs and advantages do
-- not compress (random float bits), so that was CPU spent for nothing on the ingest path
-- (measured with perf on COPY of 256-token rows: the compressor was the server's largest
-- function; ~20 % less server CPU per row without it). Rows longer than the target (long
-- responses) are still compressed and TOASTed as before. Frozen once landed.
alter table trajectories set (toast_tuple_target = 8160);
