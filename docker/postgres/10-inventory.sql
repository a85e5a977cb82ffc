-- The sample database Debezium captures (docker/connect/debezium-postgres.json: schema.include.list,
-- publication.name): five tables of different shapes. The publication covers the schema, so a table
-- created later is captured too.
-- items: body is stored out of line (STORAGE EXTERNAL), so an update that leaves it alone reaches
-- Debezium without it under REPLICA IDENTITY DEFAULT: cdcflow keeps the table's value.
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

-- a text key, a date; updates and deletes carry the whole old row
CREATE TABLE inventory.customers (
    email varchar(80) PRIMARY KEY,
    name text NOT NULL,
    vip boolean,
    since date
);
ALTER TABLE inventory.customers REPLICA IDENTITY FULL;

-- a composite key, exact decimals
CREATE TABLE inventory.order_lines (
    order_id bigint,
    line_no smallint,
    sku varchar(20) NOT NULL,
    amount numeric(12, 2),
    PRIMARY KEY (order_id, line_no)
);

-- a generated key, floating point, a local timestamp
CREATE TABLE inventory.readings (
    id bigserial PRIMARY KEY,
    sensor integer NOT NULL,
    value double precision,
    taken_at timestamp
);

-- an integer count (int4; ALTER COLUMN ... TYPE bigint widens it), an instant
CREATE TABLE inventory.stock (
    sku varchar(20) PRIMARY KEY,
    warehouse smallint NOT NULL,
    units integer,
    counted_at timestamptz
);

CREATE PUBLICATION cdcflow_pub FOR TABLES IN SCHEMA inventory;

INSERT INTO inventory.items (id, name, qty, active, note, body)
SELECT i, 'item-' || i, i * 10, i % 2 = 0, CASE WHEN i % 3 = 0 THEN NULL ELSE 'seeded' END,
       CASE WHEN i % 4 = 0 THEN repeat('toasted body of item ' || i || '. ', 120) ELSE 'short' END
FROM generate_series(1, 20) AS i;

INSERT INTO inventory.customers (email, name, vip, since)
SELECT 'customer' || i || '@example.com', 'Customer ' || i, CASE WHEN i % 3 = 0 THEN NULL ELSE i % 2 = 0 END,
       DATE '2020-01-01' + i * 37
FROM generate_series(1, 8) AS i;

INSERT INTO inventory.order_lines (order_id, line_no, sku, amount)
SELECT 1000 + i / 3, i % 3 + 1, 'SKU-' || (i % 5), (i * 12.25)::numeric(12, 2)
FROM generate_series(0, 11) AS i;

INSERT INTO inventory.readings (sensor, value, taken_at)
SELECT i % 4, i * 0.5, TIMESTAMP '2026-01-01 00:00:00' + i * INTERVAL '90 minutes'
FROM generate_series(1, 10) AS i;

INSERT INTO inventory.stock (sku, warehouse, units, counted_at)
SELECT 'SKU-' || i, i % 2 + 1, i * 100, TIMESTAMPTZ '2026-02-01 08:00:00+00' + i * INTERVAL '1 day'
FROM generate_series(0, 5) AS i;
