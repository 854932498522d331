-- Products on sale and the orders they turned into.

CREATE TABLE products (
    id              BIGSERIAL PRIMARY KEY,
    name            TEXT        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    price_cents     BIGINT      NOT NULL CHECK (price_cents >= 0),
    -- Units put on sale; never changes once the sale is set up.
    stock_total     INTEGER     NOT NULL CHECK (stock_total >= 0),
    -- Units not yet turned into orders. Decremented in the order's own transaction, so the
    -- database refuses an oversell even if Redis were wrong.
    stock_remaining INTEGER     NOT NULL CHECK (stock_remaining >= 0),
    start_at        TIMESTAMPTZ NOT NULL,
    end_at          TIMESTAMPTZ NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (end_at > start_at),
    CHECK (stock_remaining <= stock_total)
);

CREATE TABLE orders (
    id          BIGSERIAL PRIMARY KEY,
    -- The purchase's id from seckill-api; a redelivered message carries the same one.
    request_id  UUID        NOT NULL UNIQUE,
    user_id     BIGINT      NOT NULL,
    product_id  BIGINT      NOT NULL REFERENCES products (id),
    price_cents BIGINT      NOT NULL,
    status      TEXT        NOT NULL DEFAULT 'created'
                            CHECK (status IN ('created', 'paid', 'cancelled')),
    -- When seckill-api accepted the purchase.
    accepted_at TIMESTAMPTZ NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One live order per user and product; a cancelled order frees the user to buy again.
CREATE UNIQUE INDEX orders_one_live_per_user_product
    ON orders (user_id, product_id) WHERE status <> 'cancelled';
CREATE INDEX orders_by_product ON orders (product_id);
