-- Logical decoding for Debezium's pgoutput plugin. ALTER SYSTEM writes postgresql.auto.conf, read at
-- the next server start: the postgres image restarts its server after running its init scripts; the
-- end-to-end tests restart theirs after running this file.
ALTER SYSTEM SET wal_level = 'logical';
ALTER SYSTEM SET max_replication_slots = 10;
ALTER SYSTEM SET max_wal_senders = 10;
ALTER SYSTEM SET timezone = 'UTC';
