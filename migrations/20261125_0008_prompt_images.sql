-- Prompt images, stored once per run: one row per distinct image (its normalised PNG, as the
-- controller encoded it after resizing to the patch grid, lib/data/images.ts), keyed by the
-- lower-case hex sha256 of those PNG bytes. Trajectory rows name their prompt's images by that
-- hash (image_hashes, in prompt order; '{}' for text prompts), so SQL can join a sample to the
-- image it answered:
--   select t.id, i.width, i.height, i.png
--   from trajectories t cross join lateral unnest(t.image_hashes) as h(hash)
--   join prompt_images i on i.run_id = t.run_id and i.hash = h.hash;
-- Frozen once landed.
create table prompt_images (
  run_id text not null references runs (run_id) on delete cascade,
  hash text not null check (hash ~ '^[0-9a-f]{64}$'),
  width integer not null check (width > 0),
  height integer not null check (height > 0),
  png bytea not null,
  created_at timestamptz not null default now(),
  primary key (run_id, hash)
);

alter table trajectories add column image_hashes text[] not null default '{}';
