-- The outbox table, with the column names of Debezium's outbox event router
-- (id, aggregatetype, aggregateid, type, payload), so producers written for
-- Debezium work unchanged.  Applications INSERT one row per event in the
-- same transaction as the business change, and may DELETE it again in that
-- transaction: outboxd reads the INSERT from the WAL, the table stays empty.
-- created_at is not read by outboxd; it lets teams that keep rows clean up
-- by age (004_cleanup.sql).
CREATE TABLE IF NOT EXISTS outbox (
    id            uuid         PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    created_at    timestamptz  NOT NULL DEFAULT now()
);
