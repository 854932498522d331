-- How many Redis buckets a product's stock is split into. Fixed when the product is created:
-- every service derives a buyer's home bucket (marker and result) from it.
ALTER TABLE products
    ADD COLUMN stock_buckets SMALLINT NOT NULL DEFAULT 1
        CHECK (stock_buckets BETWEEN 1 AND 1024);
