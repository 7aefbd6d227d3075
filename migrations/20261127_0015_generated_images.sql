-- Image policies: the image a sample generated, by hash. The PNG is stored once per run in
-- prompt_images (the table of a run's images by hash: prompts' and generated ones), and the
-- trajectory names it; null for language policies (and for every row written before this
-- migration). The reward scored this image:
--   select t.id, t.reward, i.png
--   from trajectories t join prompt_images i on i.run_id = t.run_id and i.hash = t.generated_image_hash;
-- Frozen once landed.
alter table trajectories
  add column generated_image_hash text check (generated_image_hash is null or generated_image_hash ~ '^[0-9a-f]{64}$');
