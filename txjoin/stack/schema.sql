-- Source schema of the local stack: the pizzeria (seed 001) and users/colours (seed 000).
--
-- Run inside the source database `shop` (txjoin up does it; docker-compose runs it from
-- /docker-entrypoint-initdb.d with POSTGRES_DB=shop). Idempotent, so re-running is harmless.

CREATE TABLE IF NOT EXISTS public.clients (
    id   serial PRIMARY KEY,
    name text
);

CREATE TABLE IF NOT EXISTS public.pizzas (
    id    serial PRIMARY KEY,
    name  text,
    price numeric(10, 2)
);

CREATE TABLE IF NOT EXISTS public.tables (
    id   serial PRIMARY KEY,
    name text
);

CREATE TABLE IF NOT EXISTS public.table_assignment (
    id        serial PRIMARY KEY,
    client_id int,
    table_id  int,
    time_in   timestamp,
    time_out  timestamp
);

CREATE TABLE IF NOT EXISTS public.orders (
    id                  serial PRIMARY KEY,
    table_assignment_id int,
    order_time          timestamp,
    pizzas              int[]
);

CREATE TABLE IF NOT EXISTS public.users (
    id        serial PRIMARY KEY,
    full_name text
);

CREATE TABLE IF NOT EXISTS public.users_favorite_color (
    id             serial PRIMARY KEY,
    user_id        int,
    favorite_color text
);

-- FULL so a delete's `before` carries every column and no unchanged TOASTed value
-- arrives as __debezium_unavailable_value (docs/how-it-works.md, "Debezium facts").
ALTER TABLE public.clients              REPLICA IDENTITY FULL;
ALTER TABLE public.pizzas               REPLICA IDENTITY FULL;
ALTER TABLE public.tables               REPLICA IDENTITY FULL;
ALTER TABLE public.table_assignment     REPLICA IDENTITY FULL;
ALTER TABLE public.orders               REPLICA IDENTITY FULL;
ALTER TABLE public.users                REPLICA IDENTITY FULL;
ALTER TABLE public.users_favorite_color REPLICA IDENTITY FULL;

-- PostgreSQL's own answer to the pizzeria enrichment query (as_of_fact semantics), written
-- by the workload generator as the last statement of every transaction that changes an
-- order. It is NOT captured: it is the oracle the e2e tests compare the sinks with.
--   present          false when the order is deleted or its inner joins find nothing
--   xid              the writing transaction's id (= Debezium's source.txId)
--   commit_seq_hint  increases in commit order: taken while the writer holds the
--                    generator's advisory lock, which serialises writers until commit
CREATE TABLE IF NOT EXISTS public.orders_expected (
    order_id        int PRIMARY KEY,
    client_name     text,
    table_name      text,
    pizzas          jsonb,
    present         boolean NOT NULL,
    xid             bigint NOT NULL,
    commit_seq_hint bigint NOT NULL
);

CREATE SEQUENCE IF NOT EXISTS public.orders_expected_commit_seq;

-- Record the enriched order `p_order_id` as of now (call it as the transaction's last
-- statement). Unlike the seed's `pizzas.id = ANY(orders.pizzas)`, unnest WITH ORDINALITY
-- keeps array order and duplicates; elements without a pizza drop (inner join).
CREATE OR REPLACE FUNCTION public.record_order_expected(p_order_id int) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO public.orders_expected AS e
        (order_id, client_name, table_name, pizzas, present, xid, commit_seq_hint)
    SELECT p_order_id, q.client_name, q.table_name, q.pizzas, q.order_id IS NOT NULL,
           pg_current_xact_id()::text::bigint, nextval('public.orders_expected_commit_seq')
    FROM (SELECT 1) AS one
    LEFT JOIN (
        SELECT orders.id AS order_id,
               clients.name AS client_name,
               tables.name AS table_name,
               jsonb_agg(jsonb_build_object('pizza', pizzas.name, 'price', pizzas.price)
                         ORDER BY item.ordinality) AS pizzas
        FROM public.orders
        JOIN public.table_assignment ON orders.table_assignment_id = table_assignment.id
        CROSS JOIN LATERAL unnest(orders.pizzas) WITH ORDINALITY AS item(pizza_id, ordinality)
        JOIN public.pizzas ON pizzas.id = item.pizza_id
        JOIN public.clients ON table_assignment.client_id = clients.id
        JOIN public.tables ON table_assignment.table_id = tables.id
        WHERE orders.id = p_order_id
        GROUP BY orders.id, clients.name, tables.name
    ) AS q ON true
    ON CONFLICT (order_id) DO UPDATE SET
        client_name = EXCLUDED.client_name,
        table_name = EXCLUDED.table_name,
        pizzas = EXCLUDED.pizzas,
        present = EXCLUDED.present,
        xid = EXCLUDED.xid,
        commit_seq_hint = EXCLUDED.commit_seq_hint;
$$;

-- Debezium's signal table (signal.data.collection in config/debezium-postgres.properties):
-- insert an `execute-snapshot` row to start an incremental snapshot; Debezium writes its
-- chunks' low and high watermarks here too. The columns are Debezium's: id, type, data.
CREATE TABLE IF NOT EXISTS public.debezium_signal (
    id   varchar(64) PRIMARY KEY,
    type varchar(32) NOT NULL,
    data varchar(2048)
);

-- Pre-created so Debezium (publication.autocreate.mode=filtered) finds exactly these tables;
-- the signal table among them, or Debezium never reads a signal from the WAL.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'dbz_publication') THEN
        CREATE PUBLICATION dbz_publication FOR TABLE
            public.clients, public.pizzas, public.tables, public.table_assignment,
            public.orders, public.users, public.users_favorite_color,
            public.debezium_signal;
    END IF;
END
$$;

-- Seed rows: the menu, the dining room and a few regulars.
INSERT INTO public.pizzas (id, name, price) VALUES
    (1, 'Margherita', 8.50),
    (2, 'Marinara', 7.00),
    (3, 'Diavola', 10.50),
    (4, 'Quattro Formaggi', 11.25)
ON CONFLICT (id) DO NOTHING;

INSERT INTO public.tables (id, name) VALUES
    (1, 'Leonardo'),
    (2, 'Michelangelo'),
    (3, 'Donatello'),
    (4, 'Raffaello')
ON CONFLICT (id) DO NOTHING;

INSERT INTO public.clients (id, name) VALUES
    (1, 'April'),
    (2, 'Casey'),
    (3, 'Splinter')
ON CONFLICT (id) DO NOTHING;

-- Explicit ids above do not advance the serial sequences.
SELECT setval('public.pizzas_id_seq', (SELECT max(id) FROM public.pizzas));
SELECT setval('public.tables_id_seq', (SELECT max(id) FROM public.tables));
SELECT setval('public.clients_id_seq', (SELECT max(id) FROM public.clients));
