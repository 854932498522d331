-- A compensation may release its buyer without putting a unit back on sale: a dead letter
-- refused for want of database stock took a unit that Redis should never have offered, and
-- returning it would offer it again to a buyer the database must refuse.
ALTER TABLE compensations ADD COLUMN restock BOOLEAN NOT NULL DEFAULT true;
