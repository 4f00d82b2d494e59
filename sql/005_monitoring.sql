-- The slot as an SRE sees it: is it streaming, how much WAL does it hold,
-- how far behind is the confirmed position, how much WAL may still be written
-- before the server invalidates it (safe_wal_size is NULL when
-- max_slot_wal_keep_size = -1: then nothing bounds retention).
--   SELECT * FROM outboxd_slot_status;
CREATE OR REPLACE VIEW outboxd_slot_status AS
SELECT s.slot_name,
       s.active,
       s.active_pid,
       s.wal_status,
       s.restart_lsn,
       s.confirmed_flush_lsn,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint         AS retained_wal_bytes,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint AS lag_bytes,
       s.safe_wal_size,
       current_setting('max_slot_wal_keep_size')                           AS max_slot_wal_keep_size
FROM pg_replication_slots s
WHERE s.plugin = 'pgoutput' AND s.database = current_database();
