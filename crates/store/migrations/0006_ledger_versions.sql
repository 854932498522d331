-- What a load of the stock from Postgres and the compensations that put units back need in
-- order to agree, whatever order they meet in (see seckill_store::ledger).

-- The bucket whose unit the purchase took. A bucket's stock at a load is its share of the
-- total less the purchases that took a unit from it, so loading some buckets later than
-- others never counts one bucket's sales against another. NULL: written before this column,
-- counted against the buyer's home bucket.
ALTER TABLE orders ADD COLUMN bucket SMALLINT;

-- Bumped by every transaction that gives purchases of the product up (a cancellation, an
-- expired payment window, an ignored dead letter). Those transactions lock the product row,
-- so versions follow commit order: a load that read version V counted exactly the give-ups
-- numbered up to V.
ALTER TABLE products ADD COLUMN ledger_version BIGINT NOT NULL DEFAULT 0;

-- The version a give-up committed as, and the bucket its unit goes back to. NULL version:
-- written before this column, put back whatever the bucket's load saw (as before).
ALTER TABLE compensations
    ADD COLUMN ledger_version BIGINT,
    ADD COLUMN bucket SMALLINT;
