-- For teams that keep outbox rows instead of deleting them in the writing
-- transaction: delete old rows in small batches, one transaction each, so
-- cleanup never holds long locks or makes one huge WAL burst.  outboxd
-- publishes from the WAL, so deleting a row never loses its event.
-- In polling mode (the table has the published_at column of
-- 008_polling.sql), only published rows go, by the time they were published:
-- a pending row is never deleted, however old.
--   CALL outbox_cleanup();                      -- rows older than a day
--   CALL outbox_cleanup(interval '7 days', 5000);
CREATE OR REPLACE PROCEDURE outbox_cleanup(keep interval DEFAULT interval '1 day',
                                           batch integer DEFAULT 1000)
LANGUAGE plpgsql AS $$
DECLARE
    deleted integer;
    polling boolean;
BEGIN
    SELECT EXISTS (SELECT FROM pg_attribute
                   WHERE attrelid = 'outbox'::regclass AND attname = 'published_at'
                     AND NOT attisdropped)
    INTO polling;
    LOOP
        IF polling THEN
            -- published rows lie mostly at the start of the table: no sort, no index needed
            DELETE FROM outbox
            WHERE id IN (SELECT id FROM outbox
                         WHERE published_at < now() - keep
                         LIMIT batch);
        ELSE
            DELETE FROM outbox
            WHERE id IN (SELECT id FROM outbox
                         WHERE created_at < now() - keep
                         ORDER BY created_at
                         LIMIT batch);
        END IF;
        GET DIAGNOSTICS deleted = ROW_COUNT;
        COMMIT;
        EXIT WHEN deleted < batch;
    END LOOP;
END
$$;
