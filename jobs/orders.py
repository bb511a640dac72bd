"""Pizzeria orders enriched with client, table and pizzas (seed 001, scenario 6).

The seed's enrichment query, as a transaction-consistent temporal join::

    select orders.id order_id, clients.name client_name, tables.name table_name,
           JSON_ARRAYAGG(JSON_OBJECT('pizza' VALUE pizzas.name, 'price' VALUE pizzas.price))
    from orders cross join unnest(orders.pizzas) as u(pizza_id)
      join pizzas           on pizzas.id = u.pizza_id
      join table_assignment on orders.table_assignment_id = table_assignment.id
      join clients          on table_assignment.client_id = clients.id
      join tables           on table_assignment.table_id = tables.id
    group by orders.id, clients.name, tables.name

Semantics ``as_of_fact``: an order is enriched with the state at the commit that
last changed it; a later price change does not rewrite earlier orders.
"""

from txjoin.job import Collect, Job, Lookup, Output, Table

job = Job(
    name="orders",
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
        table="orders_enriched",
        key={"order_id": "o.id"},
        columns={
            "client_name": "c.name",
            "table_name": "t.name",
            "pizzas": Collect("p", {"pizza": "p.name", "price": "p.price"}),
        },
    ),
    semantics="as_of_fact",
)
