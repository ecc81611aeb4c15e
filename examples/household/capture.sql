-- What Debezium needs of the product's database (docs/ingress.md, "Setting up Debezium"), run once by its DBA:
-- every captured table logs whole old rows (an update's `before`, a delete's old values), and one publication
-- names the captured tables (the connector runs with publication.autocreate.mode=disabled). The server itself
-- runs with wal_level=logical (and max_replication_slots, max_wal_senders above 0).
ALTER TABLE debts REPLICA IDENTITY FULL;
ALTER TABLE dues REPLICA IDENTITY FULL;
ALTER TABLE movements REPLICA IDENTITY FULL;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'keel_household') THEN
        CREATE PUBLICATION keel_household FOR TABLE debts, dues, movements;
    END IF;
END $$;
