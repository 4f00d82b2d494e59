-- A least-privilege role for outboxd: it logs in, replicates, and reads the
-- outbox (the start-up check counts rows that a new slot cannot publish).
-- It writes nothing.  Run as the owner of the outbox after 001 and 002; the
-- deployed configuration then sets create_publication = false.
-- Give it a password out of band (ALTER ROLE outboxd PASSWORD '...') or use
-- certificates; never put the password into this file or a ConfigMap.
DO $$
BEGIN
    CREATE ROLE outboxd LOGIN REPLICATION;
EXCEPTION WHEN duplicate_object THEN
    ALTER ROLE outboxd LOGIN REPLICATION;
END
$$;

DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO outboxd', current_database());
END
$$;
GRANT USAGE ON SCHEMA public TO outboxd;
GRANT SELECT ON outbox TO outboxd;

-- outboxd records the first creation of its slot in the publication's
-- comment, so that a slot lost in a failover or a drop is never silently
-- recreated (which would skip events).  COMMENT needs ownership of the
-- publication, and a publication's new owner needs CREATE on the database.
-- Without these two lines outboxd still runs, and warns that this
-- protection is off.
DO $$
BEGIN
    EXECUTE format('GRANT CREATE ON DATABASE %I TO outboxd', current_database());
END
$$;
ALTER PUBLICATION outboxd OWNER TO outboxd;
