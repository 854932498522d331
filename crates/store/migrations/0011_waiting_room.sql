-- The product's waiting room (DESIGN.md §9): `open` (no queue, the default) or `fifo`
-- (admission in order of arrival). seckill-api refuses a purchase of a product whose room is
-- on unless the gateway admitted the buyer, and writes the room's set-up into Redis. The
-- CHECK is named so that a later mode is one migration that drops and re-adds it.
ALTER TABLE products ADD COLUMN waiting_room TEXT NOT NULL DEFAULT 'open'
    CONSTRAINT products_waiting_room_check CHECK (waiting_room IN ('open', 'fifo'));

-- The catalogue caches the mode, and every replica enforces it from its cache: a change of it
-- must reach the other replicas' change listeners like the other catalogue columns (0003).
CREATE OR REPLACE FUNCTION notify_product_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- An UPDATE that names a column but leaves every value as it was changes nothing cached.
    IF TG_OP = 'UPDATE'
        AND (OLD.name, OLD.price_cents, OLD.stock_total, OLD.start_at, OLD.end_at,
             OLD.waiting_room)
            IS NOT DISTINCT FROM (NEW.name, NEW.price_cents, NEW.stock_total, NEW.start_at,
             NEW.end_at, NEW.waiting_room)
    THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('product_changes', NEW.id::text);
    RETURN NULL;
END;
$$;

DROP TRIGGER products_notify_change ON products;
CREATE TRIGGER products_notify_change
    AFTER INSERT OR UPDATE OF name, price_cents, stock_total, start_at, end_at, waiting_room
    ON products
    FOR EACH ROW EXECUTE FUNCTION notify_product_change();

-- Every seckill-api replica reads the products whose room is on and whose sale has not ended
-- every couple of seconds, to write their rooms' set-up into Redis again: a few rows among
-- all the products ever sold.
CREATE INDEX products_rooms_on ON products (end_at) WHERE waiting_room <> 'open';
