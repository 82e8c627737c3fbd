"""Everything that talks to PostgreSQL as such: connections, named queries, migrations, SQL.

The `.sql` files under `sql/` are the source of the schema (`schema.sql`), of its ordered
migrations and of every statement the product runs (`queries.sql`).
"""
