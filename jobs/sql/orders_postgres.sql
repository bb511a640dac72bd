-- Seed 001's enrichment query in PostgreSQL, kept current: unnest(...) WITH ORDINALITY
-- instead of the seed's `pizzas.id = ANY (orders.pizzas)` (which loses the array's order
-- and duplicates) and without its clock filter (not a function of the committed state).
INSERT INTO orders_enriched
SELECT o.id AS order_id,
       c.name AS client_name,
       t.name AS table_name,
       json_agg(json_build_object('pizza', p.name, 'price', p.price) ORDER BY u.n) AS pizzas
FROM orders o
  CROSS JOIN unnest(o.pizzas) WITH ORDINALITY AS u(pizza_id, n)
  JOIN pizzas p ON p.id = u.pizza_id
  JOIN table_assignment ta ON o.table_assignment_id = ta.id
  JOIN clients c ON ta.client_id = c.id
  JOIN tables t ON ta.table_id = t.id
GROUP BY o.id, c.name, t.name;
