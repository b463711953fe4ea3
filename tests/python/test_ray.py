"""``pushdown.ray``: Ray Data reading pushdown servers, against pyarrow's own Flight client.

A local Ray cluster (2 CPUs) reads a query through ``pushdown.ray.read``. Its rows must be the
rows pyarrow reads from the same servers' endpoints; each shard is one read task carrying the
locations of every server holding it (two servers over one data root: a task whose first
server is dead reads from the second); ``select_columns`` and ``filter(expr=...)`` must reach
the servers' query (the servers' own counters say how many rows they sent), a predicate SQL
cannot say stays in Ray and is still applied, and a pipeline's trainer-side steps are refused
by name.
"""

import functools
import time
import urllib.request

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import pushdown
from conftest import Served, generate

ray = pytest.importorskip("ray")
pushdown_ray = pytest.importorskip("pushdown.ray")
from ray.data.expressions import col, lit  # noqa: E402

SQL = "SELECT id, label, decode_resize(image, 8, 8) AS pixels FROM images WHERE label < 700"


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray")
    generate(root, rows=300)
    return root


@pytest.fixture(scope="module")
def servers(root):
    fleet = [Served(root, args=["--metrics-listen", "127.0.0.1:0", "--cache", "off", "--read-ahead", "off"])
             for _ in range(2)]
    yield fleet
    for s in fleet:
        s.stop()


def url(served):
    return f"http://{served.addr}"


def plain_read(served, sql):
    """The oracle: pyarrow's own client reading every endpoint of the query."""
    client = flight.connect(f"grpc+tcp://{served.addr}")
    info = client.get_flight_info(flight.FlightDescriptor.for_command(sql.encode()))
    return pa.concat_tables([client.do_get(ep.ticket).read_all() for ep in info.endpoints]), info


def rows_sent(served):
    """The server's count of rows it streamed (its Prometheus counter)."""
    text = urllib.request.urlopen(served.metrics).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("pushdown_rows_sent_total"))


def sent_since(served, before, want):
    """Rows the server sent since `before`, once it has counted `want` (its counter moves as
    each stream ends, just after the client has read it) or 5 s passed."""
    deadline = time.monotonic() + 5
    while (sent := rows_sent(served) - before) < want and time.monotonic() < deadline:
        time.sleep(0.05)
    return sent


def table_of(ds):
    """A dataset's rows as one pyarrow table."""
    tables = ray.get(ds.to_arrow_refs())
    return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})


def by_id(table):
    return table.sort_by("id").to_pydict()


def test_the_rows_are_those_pyarrow_reads(cluster, servers):
    want, _ = plain_read(servers[0], SQL)
    ds = pushdown_ray.read([url(servers[0])], sql=SQL)
    got = table_of(ds)
    assert got.num_rows == want.num_rows > 0
    got, want = by_id(got), by_id(want)
    assert got == want, "the same rows, columns and values (pixels included)"


def test_one_read_task_per_shard_carrying_every_holder(cluster, servers):
    _, info = plain_read(servers[0], SQL)
    source = pushdown_ray.PushdownDatasource([url(s) for s in servers], sql=SQL)
    tasks = source.get_read_tasks(1)
    assert len(tasks) == len(info.endpoints) > 1
    holders = {s.addr for s in servers}
    for task in tasks:
        read = task.read_fn
        assert isinstance(read, functools.partial)
        locations = read.args[1]
        assert {loc.split("://")[1] for loc in locations} == holders, locations
    # A task whose first location is dead reads from the next.
    dead = "grpc+tcp://127.0.0.1:9"
    ticket, _, token, tls = tasks[0].read_fn.args
    rows = sum(t.num_rows for t in pushdown_ray._read_shard(ticket, [dead, *tasks[0].read_fn.args[1]], token, tls))
    assert rows == sum(t.num_rows for t in tasks[0]())
    with pytest.raises(pushdown.UnavailableError, match="no server holding this shard answered"):
        list(pushdown_ray._read_shard(ticket, [dead], token, tls))


def test_select_columns_and_filter_reach_the_servers(cluster, servers):
    served = servers[1]
    want, _ = plain_read(served, "SELECT id FROM images WHERE label < 700 AND label < 40")
    before = rows_sent(served)
    ds = pushdown_ray.read([url(served)], sql=SQL).select_columns(["id"]).filter(expr=col("label") < 40)
    got = table_of(ds)
    assert sorted(got.column("id").to_pylist()) == sorted(want.column("id").to_pylist())
    assert got.column_names == ["id"]
    sent = sent_since(served, before, want.num_rows)
    assert sent == want.num_rows < 300 * 700 / 1000, f"the servers sent {sent} rows, {want.num_rows} wanted"
    # The same as a string expression.
    before = rows_sent(served)
    got = table_of(pushdown_ray.read([url(served)], sql=SQL).filter(expr="label < 40").select_columns(["id"]))
    assert sorted(got.column("id").to_pylist()) == sorted(want.column("id").to_pylist())
    assert sent_since(served, before, want.num_rows) == want.num_rows


def test_a_predicate_sql_cannot_say_stays_in_ray(cluster, servers):
    served = servers[1]
    floor = (col("label") // lit(2)) == lit(3)
    assert pushdown_ray.to_sql(floor) is None
    ds = pushdown_ray.read([url(served)], sql=SQL).filter(expr=floor)
    want, _ = plain_read(served, "SELECT id FROM images WHERE label IN (6, 7)")
    assert sorted(table_of(ds).column("id").to_pylist()) == sorted(want.column("id").to_pylist())


def test_predicates_as_sql():
    assert pushdown_ray.to_sql((col("a") >= 3) & ~col("b").is_null()) == '(("a" >= 3) AND (NOT ("b" IS NULL)))'
    assert pushdown_ray.to_sql(col('we"ird') == lit("it's")) == '("we""ird" = \'it\'\'s\')'
    assert pushdown_ray.to_sql(col("x").is_in([1, 2])) == '("x" IN (1, 2))'
    assert pushdown_ray.to_sql(col("x").not_in(["a"])) == '("x" NOT IN (\'a\'))'
    assert pushdown_ray.to_sql((col("x") + 1 > 2.5) | (col("y") != True)) == '((("x" + 1) > 2.5) OR ("y" <> TRUE))'  # noqa: E712
    assert pushdown_ray.to_sql(col("x") == float("nan")) is None
    assert pushdown_ray.to_sql(col("x") / 2 > 1) is None


def test_a_pipeline_runs_at_the_servers_and_trainer_steps_are_refused(cluster, servers):
    pipeline = {"dataset": "images", "steps": [
        {"op": "filter", "expr": "label < 100"},
        {"op": "map", "call": "decode_resize", "input": "image", "params": [4, 4], "output": "pixels"},
        {"op": "select", "columns": ["id", "pixels"]},
    ]}
    got = table_of(pushdown_ray.read([url(servers[0])], pipeline=pipeline))
    want, _ = plain_read(servers[0], "SELECT id FROM images WHERE label < 100")
    assert sorted(got.column("id").to_pylist()) == sorted(want.column("id").to_pylist())
    assert got.column_names == ["id", "pixels"]
    shuffled = {**pipeline, "steps": [*pipeline["steps"], {"op": "shuffle", "buffer": 64}]}
    with pytest.raises(pushdown.InvalidArgumentError, match="shuffle.*runs in a trainer"):
        table_of(pushdown_ray.read([url(servers[0])], pipeline=shuffled))
    with pytest.raises(pushdown.InvalidArgumentError, match="exactly one"):
        pushdown_ray.read([url(servers[0])])
