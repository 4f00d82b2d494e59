-- The consumer side of the pattern: Kafka delivers at least once, so a
-- consumer records each message it processed, in the same transaction as
-- the message's effect (liboutbox's outbox_consume does this).  A message
-- seen again finds its mark and is skipped.
CREATE TABLE IF NOT EXISTS inbox (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS inbox_processed_at ON inbox (processed_at);

-- Retention: keep marks longer than anything can be redelivered (the
-- topic's retention, plus how long a consumer group may be stopped and then
-- rewound); two weeks by default.  Deleted in batches, one transaction each.
--   CALL inbox_cleanup();  CALL inbox_cleanup(interval '30 days');
CREATE OR REPLACE PROCEDURE inbox_cleanup(keep interval DEFAULT interval '14 days',
                                          batch integer DEFAULT 1000)
LANGUAGE plpgsql AS $$
DECLARE
    deleted integer;
BEGIN
    LOOP
        DELETE FROM inbox
        WHERE (consumer, message_id) IN (SELECT consumer, message_id FROM inbox
                                         WHERE processed_at < now() - keep
                                         ORDER BY processed_at
                                         LIMIT batch);
        GET DIAGNOSTICS deleted = ROW_COUNT;
        COMMIT;
        EXIT WHEN deleted < batch;
    END LOOP;
END
$$;
