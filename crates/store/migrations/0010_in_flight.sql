-- What of the order flow is in flight, per product, for seckill-api's fence: after Redis lost
-- a product's ledger, the product sells again once none of its accepted purchases can still
-- reach Postgres (seckill-api's stock::fence has the argument).

-- One row per consuming connection of order-service, rewritten every 100 ms: the products
-- of the deliveries it holds (received, not yet written or passed on) as of `as_of`, a time
-- at which it had read everything the broker had sent it; whether it has a broker consumer;
-- when it last handed a delivery back to the queue; and the exclusive queue that lives
-- exactly as long as its connection, which tells whether the broker has returned what it
-- held.
CREATE TABLE order_holders (
    id          UUID        PRIMARY KEY,
    alive_queue TEXT        NOT NULL,
    as_of       TIMESTAMPTZ NOT NULL,
    consuming   BOOLEAN     NOT NULL,
    requeued_at TIMESTAMPTZ,
    products    BIGINT[]    NOT NULL
);

-- A purchase order-service passed on to a retry tier or the dead-letter exchange, written
-- before that copy was published: it is in flight until an order or a dead letter with its
-- request id exists.
CREATE TABLE order_transit (
    request_id UUID        PRIMARY KEY,
    product_id BIGINT      NOT NULL,
    since      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX order_transit_by_product ON order_transit (product_id);
