-- The W3C trace context a dead letter arrived with (`traceparent`), so a redrive publishes
-- it again and the order it becomes still belongs to the purchase's trace. NULL when it had
-- none.
ALTER TABLE dead_letters ADD COLUMN traceparent TEXT;
