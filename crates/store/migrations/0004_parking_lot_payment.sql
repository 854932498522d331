-- The parking lot (dead letters kept for an operator), its audit trail, the compensation
-- outbox, and the payment window of orders.

-- One row per dead-lettered purchase, keyed by its event id (the purchase's request id, or
-- for a body that never parsed, a digest of it), so a dead letter delivered twice is one row.
CREATE TABLE dead_letters (
    event_id     TEXT        PRIMARY KEY,
    -- NULL when the body did not parse.
    user_id      BIGINT,
    product_id   BIGINT,
    -- The message as it was published, for a redrive.
    body         BYTEA       NOT NULL,
    error_code   TEXT        NOT NULL,
    last_error   TEXT        NOT NULL,
    -- Deliveries the message had when it was given up (retries included).
    attempts     INTEGER     NOT NULL,
    -- Redrives so far; past the configured limit a failing entry is quarantined.
    redrives     INTEGER     NOT NULL DEFAULT 0,
    status       TEXT        NOT NULL DEFAULT 'pending'
                             CHECK (status IN ('pending', 'redriven', 'ignored', 'quarantined')),
    first_seen   TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_attempt TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Who last acted on it.
    operator     TEXT
);
CREATE INDEX dead_letters_by_status ON dead_letters (status, first_seen);
CREATE INDEX dead_letters_by_product ON dead_letters (product_id, first_seen);

-- Every operator action on the parking lot, dry runs included.
CREATE TABLE dead_letter_audit (
    id        BIGSERIAL   PRIMARY KEY,
    at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    operator  TEXT        NOT NULL,
    action    TEXT        NOT NULL CHECK (action IN ('redrive', 'ignore', 'clear')),
    dry_run   BOOLEAN     NOT NULL,
    -- The selection as the operator gave it.
    selection JSONB       NOT NULL,
    -- The entries the action applied to (or would have, on a dry run).
    event_ids TEXT[]      NOT NULL
);

-- Units to put back on sale in Redis, written in the transaction that gives the purchase up
-- (a cancelled or expired order, an ignored dead letter) and relayed afterwards, so nothing
-- hangs on a Redis call made after a commit. The event id makes the return happen once.
CREATE TABLE compensations (
    event_id   TEXT        PRIMARY KEY,
    user_id    BIGINT      NOT NULL,
    product_id BIGINT      NOT NULL,
    -- Shown to the buyer as `failed:<reason>`.
    reason     TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    attempts   INTEGER     NOT NULL DEFAULT 0,
    -- When the relay may try again (backoff after a failure).
    due_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Set once the unit is back in Redis.
    done_at    TIMESTAMPTZ
);
CREATE INDEX compensations_due ON compensations (due_at) WHERE done_at IS NULL;

-- The payment window: an order must be paid by `pay_by` or it is cancelled and its unit
-- goes back on sale. NULL: no deadline (orders written before this migration).
ALTER TABLE orders
    ADD COLUMN pay_by       TIMESTAMPTZ,
    ADD COLUMN paid_at      TIMESTAMPTZ,
    ADD COLUMN cancelled_at TIMESTAMPTZ,
    ADD COLUMN cancel_reason TEXT;
CREATE INDEX orders_unpaid_by_deadline ON orders (pay_by) WHERE status = 'created';
