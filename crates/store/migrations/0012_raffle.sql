-- A third waiting-room mode (DESIGN.md §9): `raffle`, admission in an order drawn from a seed
-- committed to before the sale and revealed when entry closes at its start.
ALTER TABLE products DROP CONSTRAINT products_waiting_room_check;
ALTER TABLE products ADD CONSTRAINT products_waiting_room_check
    CHECK (waiting_room IN ('open', 'fifo', 'raffle'));
