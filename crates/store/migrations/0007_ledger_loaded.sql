-- Whether the product's stock was ever fully loaded into Redis. A purchase that finds a
-- bucket missing while this is true (and the sale's keys cannot have expired yet) knows that
-- Redis lost the ledger: it must not load it again until every purchase in flight has landed
-- in Postgres (seckill-api's stock::fence).
ALTER TABLE products ADD COLUMN ledger_loaded BOOLEAN NOT NULL DEFAULT false;
