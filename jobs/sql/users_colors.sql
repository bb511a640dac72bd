-- Seed 000's users/colours query (the INSERT its Flink SQL client runs).
INSERT INTO users_full_name_and_favorite_color (id, full_name, favorite_color)
SELECT
  u.id,
  u.full_name,
  ufc.favorite_color
FROM users AS u
  LEFT JOIN users_favorite_color AS ufc
  ON u.id = ufc.user_id;
