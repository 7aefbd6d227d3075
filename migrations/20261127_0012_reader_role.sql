-- rlstream_reader: the role `rlstream sql` runs analysts' queries as (docs/queries.md). It reads
-- every table and view (pg_read_all_data) and can do nothing else: no writes, no signals to other
-- sessions, no server files, no settings of others. NOLOGIN: an administrator lets analysts log in
-- as it (ALTER ROLE rlstream_reader LOGIN PASSWORD '…'). The migrating role becomes a member, so a
-- session of it can SET ROLE to it. Roles belong to the whole server: where the migrating role may
-- not create roles, or another database created it first, this does what it may.
do $$
begin
  if not exists (select 1 from pg_roles where rolname = 'rlstream_reader') then
    create role rlstream_reader nologin;
  end if;
exception when insufficient_privilege or duplicate_object or unique_violation then
  null;
end $$;

do $$
begin
  grant pg_read_all_data to rlstream_reader;
exception when insufficient_privilege or undefined_object then
  null;
end $$;

do $$
begin
  if current_user <> 'rlstream_reader' then
    execute format('grant rlstream_reader to %I', current_user);
  end if;
exception when insufficient_privilege or undefined_object or invalid_grant_operation then
  null;
end $$;
