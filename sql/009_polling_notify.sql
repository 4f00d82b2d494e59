-- Optional, for polling mode: wakes the poller as soon as rows are committed
-- instead of at its next [poll] poll_interval.  One NOTIFY per inserting
-- statement on the channel outboxd LISTENs on ([poll] notify_channel,
-- default outboxd); the server delivers it at COMMIT and folds identical
-- notifications of one transaction into one, and a rolled-back transaction
-- sends none.  Every replica wakes; SKIP LOCKED shares the rows out.
-- Idempotent; run as the owner of the outbox after 008.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outboxd', '');
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
