-- Reconciliation: under delete-in-the-same-transaction the outbox is empty,
-- so compare the business side with the consumer side instead: every
-- business row changed in the last 24 hours whose change should have
-- produced an effect downstream, without that effect.  Run with psql,
-- naming the tables and columns (defaults fit the demo: confirmed orders
-- and the invoices a billing consumer writes):
--   psql -v ON_ERROR_STOP=1 -f sql/006_reconciliation.sql \
--        -v business=orders -v business_key=id -v changed_at=updated_at \
--        -v business_filter="status = 'confirmed'" \
--        -v effects=invoices -v effects_key=order_id
-- An empty result means every change arrived; each row listed is a change
-- to chase (replay it by inserting its event into the outbox again; the
-- consumer's inbox makes a replay harmless).
\if :{?business}
\else
\set business orders
\endif
\if :{?business_key}
\else
\set business_key id
\endif
\if :{?changed_at}
\else
\set changed_at updated_at
\endif
\if :{?business_filter}
\else
\set business_filter 'status = \'confirmed\''
\endif
\if :{?effects}
\else
\set effects invoices
\endif
\if :{?effects_key}
\else
\set effects_key order_id
\endif

SELECT b.:"business_key" AS missing_key, b.:"changed_at" AS changed_at
FROM :"business" b
WHERE b.:"changed_at" > now() - interval '24 hours'
  AND (:business_filter)
  AND NOT EXISTS (SELECT 1 FROM :"effects" e WHERE e.:"effects_key" = b.:"business_key")
ORDER BY b.:"changed_at";
