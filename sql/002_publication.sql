-- The publication outboxd streams from.  The server filters: only INSERTs on
-- the outbox reach the wire (the DELETEs of delete-in-the-same-transaction
-- never do).  outboxd creates this itself when create_publication = true;
-- run it as the table owner when the outboxd role may not.
CREATE PUBLICATION outboxd FOR TABLE outbox WITH (publish = 'insert');
