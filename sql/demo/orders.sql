-- The demo's business table: an order service that confirms orders.
CREATE TABLE IF NOT EXISTS orders (
    id         bigserial PRIMARY KEY,
    customer   text        NOT NULL,
    total      numeric(12, 2) NOT NULL,
    status     text        NOT NULL DEFAULT 'new',
    updated_at timestamptz NOT NULL DEFAULT now()
);
