"""Orders with their order lines: each line's pizza and price, and the order's totals.

The query it keeps, in PostgreSQL (``public.order_lines`` references ``public.orders``)::

    select o.id as order_id, o.order_time,
           coalesce(json_agg(json_build_object('line_no', l.line_no, 'pizza', p.name,
                                               'price', p.price, 'quantity', l.quantity)
                             order by l.line_no, l.id)
                    filter (where l.id is not null), '[]') as lines,
           count(l.id) as line_count,
           sum(l.quantity * p.price) as total,
           sum(l.quantity) as pizzas_ordered,
           avg(p.price) as average_price,
           max(p.price) as top_price,
           bool_or(l.gift) as has_gift,
           string_agg(p.name, ', ' order by l.line_no, l.id) as names
    from orders o
      left join order_lines l on l.order_id = o.id and l.quantity <> 0
      left join pizzas p on p.id = l.pizza_id
    group by o.id

The demo stack's schema (txjoin/stack/schema.sql) has no order lines:
``txjoin up --job jobs/order_lines.py`` builds a database with this job's tables and
captures it, or run the job against a database that has them, e.g.::

    create table public.order_lines (id serial primary key, order_id int, line_no int,
                                     pizza_id int, quantity int, gift boolean);

A line with quantity 0 is no line (the Children filter). ``current`` semantics: a line
added, changed, moved to another order or deleted, and a price change, re-evaluate the
orders they belong to. Under ``as_of_fact`` a change to a line is a change to its order
(the order is re-evaluated as of that commit); a price change alone rewrites nothing.
"""

from txjoin.job import Aggregate, Children, Collect, Job, Lookup, Output, Table

job = Job(
    name="order_lines",
    tables=[
        Table("public.pizzas", {"id": "int", "name": "text", "price": "numeric(10,2)"}),
        Table("public.orders", {
            "id": "int", "table_assignment_id": "int", "order_time": "timestamp",
            "pizzas": "int[]",
        }),
        Table("public.order_lines", {
            "id": "int", "order_id": "int", "line_no": "int", "pizza_id": "int",
            "quantity": "int", "gift": "bool",
        }),
    ],
    fact="public.orders",
    fact_alias="o",
    lookups=[
        Children("l", "public.order_lines", parent="o", on={"order_id": "id"},
                 order_by="line_no", where="l.quantity <> 0"),
        Lookup("p", "public.pizzas", parent="l", on={"id": "pizza_id"}, how="left"),
    ],
    output=Output(
        table="order_lines_enriched",
        key={"order_id": "o.id"},
        columns={
            "order_time": "o.order_time",
            "lines": Collect("l", {"line_no": "l.line_no", "pizza": "p.name",
                                   "price": "p.price", "quantity": "l.quantity"}),
            "line_count": Aggregate("l", "count"),
            "total": Aggregate("l", "sum", "l.quantity * p.price"),
            "pizzas_ordered": Aggregate("l", "sum", "l.quantity"),
            "average_price": Aggregate("l", "avg", "p.price"),
            "top_price": Aggregate("l", "max", "p.price"),
            "has_gift": Aggregate("l", "bool_or", "l.gift"),
            "names": Aggregate("l", "string_agg", "p.name", separator=", "),
        },
    ),
    semantics="current",
)
