"""Flight SQL with a client that is not ours: ADBC's Flight SQL driver (the Go driver behind
`adbc_driver_flightsql.dbapi`) against `pushdown serve --catalog views.toml`, answers checked
against DuckDB reading the same Parquet files."""

import adbc_driver_flightsql.dbapi as flight_sql
import duckdb
import pytest
from adbc_driver_flightsql import DatabaseOptions

from conftest import Served, generate

VIEWS = """
[[view]]
name = "train_thumbs"
description = "16-px thumbnails of the training split"
sql = "SELECT id, thumbnail(image, 16) AS image, label FROM images WHERE split = 'train'"

[[view]]
name = "label_counts"
sql = "SELECT label, count(*) AS n FROM images GROUP BY label"
"""

VIEW_ONLY = "view-reader-token-0123456789"
ADMIN = "platform-admin-token-9876543210"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flight_sql")
    data = folder / "data"
    generate(data, rows=300)
    (folder / "views.toml").write_text(VIEWS)
    (folder / "tokens").write_text(f"{VIEW_ONLY} train_thumbs\n{ADMIN} *\n")
    server = Served(data, args=["--catalog", str(folder / "views.toml"),
                                "--auth-tokens", str(folder / "tokens")])
    yield server, data
    server.stop()


def connect(server, token):
    return flight_sql.connect(
        f"grpc://{server.addr}",
        db_kwargs={DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {token}"},
        autocommit=True,  # a read-only server has no transactions to leave open
    )


def oracle(data, sql):
    """`sql` over `images` as DuckDB reads the files itself."""
    con = duckdb.connect()
    con.execute(f"CREATE VIEW images AS SELECT * FROM read_parquet('{data}/images/*.parquet')")
    return sorted(con.execute(sql).fetchall())


def rows(table):
    return sorted(zip(*(table.column(i).to_pylist() for i in range(table.num_columns))))


def test_adbc_lists_views_beside_datasets(served):
    server, _ = served
    with connect(server, ADMIN) as conn:
        objects = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
        tables = {
            (t["table_name"], t["table_type"])
            for catalog in objects
            for schema in catalog["catalog_db_schemas"]
            for t in schema["db_schema_tables"]
        }
        assert tables == {("images", "TABLE"), ("train_thumbs", "VIEW"), ("label_counts", "VIEW")}
        assert {c["catalog_name"] for c in objects} == {"pushdown"}
        assert set(conn.adbc_get_table_types()) == {"TABLE", "VIEW"}
        schema = conn.adbc_get_table_schema("train_thumbs")
        assert schema.names == ["id", "image", "label"]


def test_adbc_queries_views_with_and_without_parameters(served):
    server, data = served
    with connect(server, ADMIN) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, label FROM train_thumbs WHERE label < 300")
        got = rows(cur.fetch_arrow_table())
        want = oracle(data, "SELECT id, label FROM images WHERE split = 'train' AND label < 300")
        assert got and got == want

        # A prepared statement with a parameter, executed twice with different values.
        for limit in (50, 500):
            cur.execute("SELECT id, label FROM train_thumbs WHERE label < ?", parameters=(limit,))
            got = rows(cur.fetch_arrow_table())
            assert got == oracle(
                data, f"SELECT id, label FROM images WHERE split = 'train' AND label < {limit}")

        # A view that aggregates, and thumbnails that are really thumbnails.
        cur.execute("SELECT sum(n) AS total FROM label_counts")
        assert cur.fetchone()[0] == 300
        cur.execute("SELECT image FROM train_thumbs LIMIT 3")
        for (jpeg,) in cur.fetchall():
            assert jpeg[:2] == b"\xff\xd8" and len(jpeg) < 2000


def test_adbc_is_read_only_and_follows_grants(served):
    server, _ = served
    with connect(server, ADMIN) as conn, conn.cursor() as cur:
        for statement in ["DELETE FROM images", "CREATE TABLE t AS SELECT 1",
                          "COPY images TO '/tmp/out.parquet'"]:
            with pytest.raises(Exception) as failure:
                cur.execute(statement)
                cur.fetchall()
            message = str(failure.value)
            assert "not a SELECT" in message or "only answers queries" in message, message

    with connect(server, VIEW_ONLY) as conn:
        objects = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
        names = [t["table_name"] for c in objects for s in c["catalog_db_schemas"]
                 for t in s["db_schema_tables"]]
        assert names == ["train_thumbs"]
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM train_thumbs")
            assert cur.fetchone()[0] > 0
            with pytest.raises(Exception) as failure:
                cur.execute("SELECT id FROM images")
                cur.fetchall()
            assert "may not read" in str(failure.value)
