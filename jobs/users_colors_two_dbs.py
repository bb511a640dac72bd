"""Seed 000 as the seed has it: users in one database, favourite colours in another.

    SELECT u.id, u.full_name, ufc.favorite_color
    FROM users u LEFT JOIN users_favorite_color ufc ON ufc.user_id = u.id

Two PostgreSQL databases, two Debezium connectors, two topic prefixes, two
transaction topics. There is no commit order across two databases: the
guarantee is per source (docs/writing-jobs.md, "Two source databases"). Semantics
``current``: a colour change re-emits the affected users.
"""

from txjoin.job import Job, Lookup, Output, Pick, Source, Table

job = Job(
    name="users_colors_two_dbs",
    sources=[
        Source("users", prefix="users_db"),
        Source("colors", prefix="colors_db"),
    ],
    tables=[
        Table("public.users", {"id": "int", "full_name": "text"}, source="users"),
        Table("public.users_favorite_color", {
            "id": "int", "user_id": "int", "favorite_color": "text",
        }, source="colors"),
    ],
    fact="public.users",
    fact_alias="u",
    lookups=[
        Lookup("ufc", "public.users_favorite_color", parent="u", on={"user_id": "id"},
               how="left", pick=Pick("id", "max")),
    ],
    output=Output(
        table="users_full_name_and_favorite_color_two_dbs",
        key={"id": "u.id"},
        columns={"full_name": "u.full_name", "favorite_color": "ufc.favorite_color"},
    ),
    semantics="current",
)
