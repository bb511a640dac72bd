"""Users with their favourite colour (seed 000): a LEFT JOIN kept current.

    SELECT u.id, u.full_name, ufc.favorite_color
    FROM users u LEFT JOIN users_favorite_color ufc ON ufc.user_id = u.id

``user_id`` is not the primary key of ``users_favorite_color``: when a user has
several colours, the one with the greatest ``id`` (the latest added) wins.
Semantics ``current``: a colour change re-emits the affected users.
"""

from txjoin.job import Job, Lookup, Output, Pick, Table

job = Job(
    name="users_colors",
    tables=[
        Table("public.users", {"id": "int", "full_name": "text"}),
        Table("public.users_favorite_color", {
            "id": "int", "user_id": "int", "favorite_color": "text",
        }),
    ],
    fact="public.users",
    fact_alias="u",
    lookups=[
        Lookup("ufc", "public.users_favorite_color", parent="u", on={"user_id": "id"},
               how="left", pick=Pick("id", "max")),
    ],
    output=Output(
        table="users_full_name_and_favorite_color",
        key={"id": "u.id"},
        columns={"full_name": "u.full_name", "favorite_color": "ufc.favorite_color"},
    ),
    semantics="current",
)
