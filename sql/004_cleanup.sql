-- For teams that keep outbox rows instead of deleting them in the writing
-- transaction: delete old rows in small batches, one transaction each, so
-- cleanup never holds long locks or makes one huge WAL burst.  outboxd
-- publishes from the WAL, so deleting a row never loses its event.
--   CALL outbox_cleanup();                      -- rows older than a day
--   CALL outbox_cleanup(interval '7 days', 5000);
CREATE OR REPLACE PROCEDURE outbox_cleanup(keep interval DEFAULT interval '1 day',
                                           batch integer DEFAULT 1000)
LANGUAGE plpgsql AS $$
DECLARE
    deleted integer;
BEGIN
    LOOP
        DELETE FROM outbox
        WHERE id IN (SELECT id FROM outbox
                     WHERE created_at < now() - keep
                     ORDER BY created_at
                     LIMIT batch);
        GET DIAGNOSTICS deleted = ROW_COUNT;
        COMMIT;
        EXIT WHEN deleted < batch;
    END LOOP;
END
$$;
