-- The sample schema Debezium captures (docker/connect/debezium-postgres.json: table.include.list,
-- publication.name). body is stored out of line (STORAGE EXTERNAL), so an update that leaves it alone
-- reaches Debezium without it under REPLICA IDENTITY DEFAULT: cdcflow keeps the table's value.
CREATE SCHEMA inventory;
CREATE TABLE inventory.items (
    id integer PRIMARY KEY,
    name varchar(40),
    qty integer,
    active boolean,
    note text,
    body text
);
ALTER TABLE inventory.items ALTER COLUMN body SET STORAGE EXTERNAL;
ALTER TABLE inventory.items REPLICA IDENTITY DEFAULT;
CREATE PUBLICATION cdcflow_pub FOR TABLE inventory.items;

INSERT INTO inventory.items (id, name, qty, active, note, body)
SELECT i, 'item-' || i, i * 10, i % 2 = 0, CASE WHEN i % 3 = 0 THEN NULL ELSE 'seeded' END,
       CASE WHEN i % 4 = 0 THEN repeat('toasted body of item ' || i || '. ', 120) ELSE 'short' END
FROM generate_series(1, 20) AS i;
