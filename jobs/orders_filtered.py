"""Pizzeria orders with a filter and computed columns (issue 37, items 1 and 2).

The orders job (jobs/orders.py) as this query, kept current::

    select o.id order_id, coalesce(c.name, 'walk-in') client_name,
           upper(t.name) table_name, '#' || o.id order_no,
           date_trunc('hour', o.order_time) order_hour,
           extract(epoch from o.order_time) - extract(epoch from ta.time_in) waited_s,
           json_agg(...) pizzas           -- only the pizzas under 20 (a lookup filter;
                                          -- an order without one has no row)
    from orders o join table_assignment ta on ta.id = o.table_assignment_id
         left join clients c on c.id = ta.client_id and c.name <> 'Banned'
         join tables t on t.id = ta.table_id
    where t.name <> 'Kitchen' and o.order_time >= timestamp '2023-09-23 22:00:00'

A banned client reads as NULL (a filtered-out match of a left lookup); an order moved
to the kitchen's table, or one that the change of a table's name sends there, leaves
the output (a delete in both sinks) and comes back when it satisfies the filter again.
"""

from txjoin.job import Collect, Job, Lookup, Output, Table

job = Job(
    name="orders_filtered",
    tables=[
        Table("public.clients", {"id": "int", "name": "text"}),
        Table("public.pizzas", {"id": "int", "name": "text", "price": "numeric(10,2)"}),
        Table("public.tables", {"id": "int", "name": "text"}),
        Table("public.table_assignment", {
            "id": "int", "client_id": "int", "table_id": "int",
            "time_in": "timestamp", "time_out": "timestamp",
        }),
        Table("public.orders", {
            "id": "int", "table_assignment_id": "int", "order_time": "timestamp",
            "pizzas": "int[]",
        }),
    ],
    fact="public.orders",
    fact_alias="o",
    lookups=[
        Lookup("ta", "public.table_assignment", parent="o", on={"id": "table_assignment_id"}),
        Lookup("c", "public.clients", parent="ta", on={"id": "client_id"}, how="left",
               where="c.name <> 'Banned'"),
        Lookup("t", "public.tables", parent="ta", on={"id": "table_id"}),
        Lookup("p", "public.pizzas", parent="o", on={"id": "pizzas"}, array=True,
               where="p.price < 20"),
    ],
    output=Output(
        table="orders_filtered",
        key={"order_id": "o.id"},
        columns={
            "client_name": "coalesce(c.name, 'walk-in')",
            "table_name": "upper(t.name)",
            "order_no": "'#' || o.id",
            "order_hour": "date_trunc('hour', o.order_time)",
            # seconds since the table was seated (not an interval: Delta keeps an interval as
            # its microseconds, which `txjoin replay`'s checks do not read back as one yet)
            "waited_s": "extract(epoch FROM o.order_time) - extract(epoch FROM ta.time_in)",
            "pizzas": Collect("p", {"pizza": "p.name", "price": "p.price"}),
        },
    ),
    where="t.name <> 'Kitchen' AND o.order_time >= timestamp '2023-09-23 22:00:00'",
    semantics="current",
)
