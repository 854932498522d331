-- The order signature a dead letter arrived with (`x-order-signature`), so a redrive
-- publishes it as seckill-api signed it. NULL when it had none: redriven, it is refused
-- again as unsigned.
ALTER TABLE dead_letters ADD COLUMN signature TEXT;
