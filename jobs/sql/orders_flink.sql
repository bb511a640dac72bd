-- Seed 001's enrichment query in its Flink SQL form (the temporal join of scenario 6),
-- over the source tables' own names: txjoin job from-sql compiles it to jobs/orders.py.
INSERT INTO orders_enriched
SELECT
  orders.id AS order_id,
  clients.name AS client_name,
  tables.name AS table_name,
  JSON_ARRAYAGG(
    JSON_OBJECT('pizza' VALUE pizzas.name, 'price' VALUE pizzas.price)
  ) AS pizzas
FROM orders CROSS JOIN UNNEST(orders.pizzas) AS pizza_unnest(pizza_id)
  JOIN pizzas FOR SYSTEM_TIME AS OF orders.order_time
    ON pizzas.id = pizza_unnest.pizza_id
  JOIN table_assignment FOR SYSTEM_TIME AS OF orders.order_time
    ON orders.table_assignment_id = table_assignment.id
  JOIN clients FOR SYSTEM_TIME AS OF orders.order_time
    ON table_assignment.client_id = clients.id
  JOIN tables FOR SYSTEM_TIME AS OF orders.order_time
    ON table_assignment.table_id = tables.id
GROUP BY orders.id, clients.name, tables.name;
