"""Pizzeria orders with a filter, computed columns and totals over their pizzas.

The orders job (jobs/orders.py) as this query, each order as of the commit that last
changed it (``as_of_fact``)::

    select o.id order_id, upper(c.name) client_name, '#' || o.id order_no,
           date_trunc('hour', o.order_time) order_hour,
           count(p.id) pizza_count, sum(p.price) total, max(p.price) top_price
    from orders o cross join unnest(o.pizzas) as u(pizza_id)
      join pizzas p on p.id = u.pizza_id
      join table_assignment ta on ta.id = o.table_assignment_id
      join clients c on c.id = ta.client_id
      join tables t on t.id = ta.table_id
    where t.name <> 'Kitchen'
    group by o.id, c.name

What `txjoin bench --also-job jobs/orders_totals.py` compares with the plain orders
job on the same workload (issue 37's figure: within 15% of its events/s).
"""

from txjoin.job import Aggregate, Job, Lookup, Output, Table

job = Job(
    name="orders_totals",
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
        Lookup("c", "public.clients", parent="ta", on={"id": "client_id"}),
        Lookup("t", "public.tables", parent="ta", on={"id": "table_id"}),
        Lookup("p", "public.pizzas", parent="o", on={"id": "pizzas"}, array=True),
    ],
    output=Output(
        table="orders_totals",
        key={"order_id": "o.id"},
        columns={
            "client_name": "upper(c.name)",
            "order_no": "'#' || o.id",
            "order_hour": "date_trunc('hour', o.order_time)",
            "pizza_count": Aggregate("p", "count"),
            "total": Aggregate("p", "sum", "p.price"),
            "top_price": Aggregate("p", "max", "p.price"),
        },
    ),
    where="t.name <> 'Kitchen'",
    semantics="as_of_fact",
)
