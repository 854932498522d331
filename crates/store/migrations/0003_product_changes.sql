-- Tell every seckill-api replica when a product appears or its catalogue data changes, so each
-- can add the id to its bloom filter and drop its cached copy (channel `product_changes`,
-- payload: the product id).
--
-- Only the columns the catalogue caches fire it: order-service decrements stock_remaining on
-- every order, and a notification per order would flood every replica during a sale.
-- A notification is delivered at commit (and not at all on rollback), after the new row is
-- visible, so a replica that re-reads on receipt sees the change.

CREATE FUNCTION notify_product_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- An UPDATE that names a column but leaves every value as it was changes nothing cached.
    IF TG_OP = 'UPDATE'
        AND (OLD.name, OLD.price_cents, OLD.stock_total, OLD.start_at, OLD.end_at)
            IS NOT DISTINCT FROM (NEW.name, NEW.price_cents, NEW.stock_total, NEW.start_at, NEW.end_at)
    THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('product_changes', NEW.id::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER products_notify_change
    AFTER INSERT OR UPDATE OF name, price_cents, stock_total, start_at, end_at ON products
    FOR EACH ROW EXECUTE FUNCTION notify_product_change();
