//! Named views and Flight SQL against a real server on 127.0.0.1:0: views are datasets to
//! every client, what is asked of a view reaches the scan beneath it (I/O accounting), views
//! shard like their dataset, grants follow view names, and a Flight SQL client (arrow-rs's
//! own) lists tables, runs statements and prepared statements, and cannot write.

use std::sync::Arc;

use arrow::array::{Array, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandGetDbSchemas, CommandGetTables, SqlInfo};
use arrow_flight::{Criteria, FlightInfo, Ticket};
use futures::TryStreamExt;
use pushdown_client::ConnectOptions;
use pushdown_protocol::{Fragment, PlanEstimate, Query, ScanRequest, ShardTicket};
use pushdown_server::{Tokens, Views};
use pushdown_tests::{Fixture, local_eval, num_rows, small_shards, sorted_rows, write_images};
use tonic::transport::Channel;

const CATALOG: &str = r#"
[[view]]
name = "train_thumbs"
description = "16-px thumbnails of the training split"
sql = "SELECT id, thumbnail(image, 16) AS image, label FROM images WHERE split = 'train'"

[[view]]
name = "train_labels"
sql = "SELECT id, label FROM train_thumbs WHERE label < 500"

[[view]]
name = "label_counts"
sql = "SELECT label, count(*) AS n FROM images GROUP BY label"
"#;

/// Reads the view `train_thumbs` only (not `images` beneath it).
const VIEW_ONLY: &str = "view-reader-token-0123456789";

async fn fixture(token: Option<&str>) -> Fixture {
    Fixture::secured(
        small_shards(),
        |root| {
            write_images(root, 512);
        },
        |b| {
            let b = b.views(Views::from_toml(CATALOG).expect("catalog"));
            match token {
                Some(_) => b.tokens(
                    Tokens::parse(&format!("{VIEW_ONLY} train_thumbs\nadmin-token-abcdefghijk *\n"))
                        .expect("tokens"),
                ),
                None => b,
            }
        },
        ConnectOptions {
            token: token.map(str::to_owned),
            ..ConnectOptions::default()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_answers_like_its_query_inlined_and_shards_like_its_dataset() {
    let fx = fixture(None).await;
    let got = fx
        .sql("SELECT id, label FROM train_labels WHERE label > 100")
        .await
        .expect("view query");
    let want = local_eval(
        fx.root.path(),
        "SELECT id, label FROM images WHERE split = 'train' AND label < 500 AND label > 100",
    )
    .await;
    assert!(num_rows(&want) > 0);
    assert_eq!(sorted_rows(&got), sorted_rows(&want));

    // A view over a view over `images` is row-wise: one endpoint per shard of `images`.
    let info = fx
        .client
        .plan(&ScanRequest::new(Query::Sql(
            "SELECT id FROM train_labels".into(),
        )))
        .await
        .expect("plan");
    let estimate = PlanEstimate::decode(&info.app_metadata).expect("estimate");
    assert!(estimate.row_wise, "{estimate:?}");
    assert_eq!(info.endpoint.len(), 4, "512 rows in shards of 128");

    // A view that aggregates is answered whole, and right.
    let counts = fx
        .sql("SELECT sum(n) AS rows FROM label_counts")
        .await
        .expect("aggregate view");
    let total = counts[0]
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .expect("i64");
    assert_eq!(total.value(0), 512);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projection_and_filters_on_a_view_reach_the_parquet_scan() {
    let fx = fixture(None).await;
    let total = fx.images_bytes();
    fx.bytes_read();

    // The view selects thumbnails of `image`; asking only for its labels reads no image.
    let labels = fx.sql("SELECT label FROM train_thumbs").await.expect("labels");
    assert!(num_rows(&labels) > 0);
    let narrow = fx.bytes_read();
    assert!(narrow > 0);
    assert!(
        narrow * 20 < total,
        "labels through the view read {narrow} of {total} bytes"
    );

    // A filter on the view's `id` prunes row groups of `images` at planning: one endpoint.
    let info = fx
        .client
        .plan(&ScanRequest::new(Query::Sql(
            "SELECT id, image FROM train_thumbs WHERE id < 40".into(),
        )))
        .await
        .expect("plan");
    let estimate = PlanEstimate::decode(&info.app_metadata).expect("estimate");
    assert_eq!(estimate.row_groups_pruned, 7, "{estimate:?}");
    assert_eq!(info.endpoint.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_read_views_and_get_what_the_inlined_query_gives() {
    let fx = fixture(None).await;
    let fragment = ScanRequest::new(Query::Fragment(Fragment {
        dataset: "train_thumbs".into(),
        predicate: Some("label < 100".into()),
        columns: vec!["id".into(), "image".into()],
        ..Fragment::default()
    }));
    let (through_view, _) = fx.collect(&fragment).await.expect("fragment over a view");
    let inlined = fx
        .sql("SELECT id, thumbnail(image, 16) AS image FROM images WHERE split = 'train' AND label < 100")
        .await
        .expect("inlined");
    assert!(num_rows(&inlined) > 0);
    assert_eq!(sorted_rows(&through_view), sorted_rows(&inlined));

    // Views are listed with their schemas, beside the datasets.
    let mut raw = pushdown_tests::raw_client(fx.running.url()).await;
    let infos: Vec<FlightInfo> = raw
        .list_flights(Criteria::default())
        .await
        .expect("list")
        .into_inner()
        .try_collect()
        .await
        .expect("infos");
    let names: Vec<String> = infos
        .iter()
        .map(|i| i.flight_descriptor.as_ref().expect("descriptor").path[0].clone())
        .collect();
    assert_eq!(names, ["images", "label_counts", "train_labels", "train_thumbs"]);
    let thumbs = infos
        .iter()
        .find(|i| i.flight_descriptor.as_ref().unwrap().path[0] == "train_thumbs");
    let schema: Schema = thumbs.unwrap().clone().try_decode_schema().expect("schema");
    let fields: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(fields, ["id", "image", "label"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_granted_a_view_reads_it_and_nothing_beneath_it() {
    let fx = fixture(Some(VIEW_ONLY)).await;
    let rows = fx
        .sql("SELECT id, label FROM train_thumbs")
        .await
        .expect("granted view");
    assert!(num_rows(&rows) > 0);
    for denied in [
        "SELECT id FROM images",
        "SELECT id FROM train_labels",
        "SELECT * FROM train_thumbs t JOIN images i ON t.id = i.id",
    ] {
        let e = fx.sql(denied).await.expect_err(denied);
        assert!(e.contains("may not read"), "{denied}: {e}");
    }

    // A ticket of the view, rewritten to read `images` itself: refused, the shard unread.
    let info = fx
        .client
        .plan(&ScanRequest::new(Query::Sql(
            "SELECT id FROM train_thumbs".into(),
        )))
        .await
        .expect("plan");
    let mut ticket = ShardTicket::decode(&info.endpoint[0].ticket.as_ref().unwrap().ticket).expect("ticket");
    ticket.request.query = Query::Sql("SELECT id, image FROM images".into());
    let mut raw = pushdown_tests::raw_client(fx.running.url()).await;
    let mut request = tonic::Request::new(Ticket::new(ticket.encode()));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {VIEW_ONLY}").parse().unwrap());
    let status = raw.do_get(request).await.expect_err("forged ticket");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status}");

    // Flight SQL lists only the view for this token.
    let mut sql = flight_sql(&fx, Some(VIEW_ONLY)).await;
    let tables = tables(&mut sql).await;
    assert_eq!(tables, [("train_thumbs".to_owned(), "VIEW".to_owned())]);
}

async fn flight_sql(fx: &Fixture, token: Option<&str>) -> FlightSqlServiceClient<Channel> {
    let channel = Channel::from_shared(fx.running.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut client = FlightSqlServiceClient::new(channel);
    if let Some(token) = token {
        client.set_token(token.to_owned());
    }
    client
}

/// Every endpoint of `info`, read in order.
async fn read(client: &mut FlightSqlServiceClient<Channel>, info: FlightInfo) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    for endpoint in info.endpoint {
        let stream = client
            .do_get(endpoint.ticket.expect("ticket"))
            .await
            .expect("do_get");
        out.extend(stream.try_collect::<Vec<_>>().await.expect("batches"));
    }
    out
}

async fn tables(client: &mut FlightSqlServiceClient<Channel>) -> Vec<(String, String)> {
    let info = client
        .get_tables(CommandGetTables {
            include_schema: true,
            ..CommandGetTables::default()
        })
        .await
        .expect("get_tables");
    let batches = read(client, info).await;
    let mut out = Vec::new();
    for b in &batches {
        let col = |name: &str| {
            b.column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned())
                .expect(name)
        };
        let (catalog, schema, name, kind) = (
            col("catalog_name"),
            col("db_schema_name"),
            col("table_name"),
            col("table_type"),
        );
        let table_schema = b.column_by_name("table_schema").expect("schemas included");
        for i in 0..b.num_rows() {
            assert_eq!((catalog.value(i), schema.value(i)), ("pushdown", "public"));
            assert!(!table_schema.is_null(i));
            out.push((name.value(i).to_owned(), kind.value(i).to_owned()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_sql_clients_list_query_and_prepare_but_never_write() {
    let fx = fixture(None).await;
    let mut sql = flight_sql(&fx, None).await;

    // Catalog commands: one catalog and schema; datasets as tables, views as views.
    let mut listed = tables(&mut sql).await;
    listed.sort();
    assert_eq!(
        listed,
        [
            ("images".to_owned(), "TABLE".to_owned()),
            ("label_counts".to_owned(), "VIEW".to_owned()),
            ("train_labels".to_owned(), "VIEW".to_owned()),
            ("train_thumbs".to_owned(), "VIEW".to_owned()),
        ]
    );
    let schemas = sql
        .get_db_schemas(CommandGetDbSchemas::default())
        .await
        .expect("schemas");
    assert_eq!(num_rows(&read(&mut sql, schemas).await), 1);
    let info = sql
        .get_sql_info(vec![SqlInfo::FlightSqlServerReadOnly])
        .await
        .expect("sql info");
    assert_eq!(num_rows(&read(&mut sql, info).await), 1);

    // A statement over a view: sharded like the dataset, the same rows as inlined.
    let query = "SELECT id, label FROM train_thumbs WHERE label < 300";
    let info = sql.execute(query.into(), None).await.expect("execute");
    assert_eq!(info.endpoint.len(), 4);
    let got = read(&mut sql, info).await;
    let want = local_eval(
        fx.root.path(),
        "SELECT id, label FROM images WHERE split = 'train' AND label < 300",
    )
    .await;
    assert_eq!(sorted_rows(&got), sorted_rows(&want));

    // A prepared statement, bound twice; `?` and `$n` both work. Fully qualified names too.
    let mut prepared = sql
        .prepare(
            "SELECT id, label FROM pushdown.public.train_thumbs WHERE label < ? AND id >= ?".into(),
            None,
        )
        .await
        .expect("prepare");
    let params = prepared.parameter_schema().expect("parameters").clone();
    assert_eq!(params.fields().len(), 2, "{params:?}");
    assert_eq!(params.field(0).data_type(), &DataType::Int32);
    for (limit, from) in [(100, 0i64), (300, 200)] {
        let binding = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("$1", DataType::Int32, true),
                Field::new("$2", DataType::Int64, true),
            ])),
            vec![
                Arc::new(Int32Array::from(vec![limit])),
                Arc::new(Int64Array::from(vec![from])),
            ],
        )
        .expect("binding");
        prepared.set_parameters(binding).expect("bind");
        let info = prepared.execute().await.expect("execute prepared");
        let got = read(&mut sql, info).await;
        let want = local_eval(
            fx.root.path(),
            &format!(
                "SELECT id, label FROM images WHERE split = 'train' AND label < {limit} AND id >= {from}"
            ),
        )
        .await;
        assert!(num_rows(&want) > 0);
        assert_eq!(
            sorted_rows(&got),
            sorted_rows(&want),
            "label < {limit}, id >= {from}"
        );
    }
    prepared.close().await.expect("close");

    // Read-only: updates are refused, and DDL or DML as a statement query too.
    let e = sql
        .execute_update("DELETE FROM images".into(), None)
        .await
        .expect_err("update");
    assert!(e.to_string().contains("only answers queries"), "{e}");
    for statement in [
        "CREATE TABLE t AS SELECT 1",
        "DROP VIEW train_thumbs",
        "INSERT INTO images SELECT * FROM images",
        "COPY images TO '/tmp/x.parquet'",
        "SET datafusion.execution.batch_size = 1",
        "CREATE EXTERNAL TABLE e STORED AS PARQUET LOCATION '/etc'",
    ] {
        let e = sql.execute(statement.into(), None).await.expect_err(statement);
        assert!(e.to_string().contains("not a SELECT"), "{statement}: {e}");
        let e = sql.prepare(statement.into(), None).await.expect_err(statement);
        assert!(e.to_string().contains("not a SELECT"), "{statement}: {e}");
    }
    // A file path as a table is not a table.
    let e = sql
        .execute("SELECT * FROM '/etc/passwd'".into(), None)
        .await
        .expect_err("file table");
    assert!(e.to_string().contains("unknown dataset"), "{e}");
}

/// The Flight SQL front end decodes each message once and answers by its command: a
/// malformed command is the caller's error, a command it does not serve is `Unimplemented`
/// naming it, an action it does not serve likewise, and a `DoPut` that is not a parameter
/// binding is refused as a write; none of them reach the `pushdown` protocol's handlers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_sql_messages_are_decoded_once_and_refused_by_name() {
    use arrow_flight::sql::{Any, CommandGetPrimaryKeys, CommandStatementUpdate, ProstMessageExt};
    use arrow_flight::{Action, FlightData, FlightDescriptor};
    use prost::Message;
    use tonic::Code;

    let fx = fixture(None).await;
    let mut raw = pushdown_tests::raw_client(fx.running.url()).await;

    // A Flight SQL type whose value is not that message.
    let garbage = Any {
        type_url: CommandGetTables::type_url().into(),
        value: vec![0xff; 7].into(),
    };
    let status = raw
        .get_flight_info(FlightDescriptor::new_cmd(garbage.encode_to_vec()))
        .await
        .expect_err("garbage command");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(
        status.message().contains("malformed Flight SQL command"),
        "{status}"
    );

    let keys = CommandGetPrimaryKeys {
        table: "images".into(),
        ..Default::default()
    };
    let status = raw
        .get_flight_info(FlightDescriptor::new_cmd(keys.as_any().encode_to_vec()))
        .await
        .expect_err("primary keys");
    assert_eq!(status.code(), Code::Unimplemented, "{status}");
    assert!(status.message().contains("CommandGetPrimaryKeys"), "{status}");
    let status = raw
        .do_get(Ticket::new(keys.as_any().encode_to_vec()))
        .await
        .expect_err("primary keys ticket");
    assert_eq!(status.code(), Code::Unimplemented, "{status}");

    let status = raw
        .do_action(Action::new("BeginTransaction", Vec::new()))
        .await
        .expect_err("transaction");
    assert_eq!(status.code(), Code::Unimplemented, "{status}");
    assert!(status.message().contains("BeginTransaction"), "{status}");
    // A known action whose body is another message.
    let status = raw
        .do_action(Action::new(
            "CreatePreparedStatement",
            keys.as_any().encode_to_vec(),
        ))
        .await
        .expect_err("wrong body");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(
        status.message().contains("ActionCreatePreparedStatementRequest"),
        "{status}"
    );

    let update = CommandStatementUpdate {
        query: "DELETE FROM images".into(),
        ..Default::default()
    };
    let put = FlightData {
        flight_descriptor: Some(FlightDescriptor::new_cmd(update.as_any().encode_to_vec())),
        ..Default::default()
    };
    let status = raw
        .do_put(futures::stream::iter([put]))
        .await
        .expect_err("update");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(status.message().contains("only answers queries"), "{status}");
    let ours = FlightData {
        flight_descriptor: Some(FlightDescriptor::new_path(vec!["images".into()])),
        ..Default::default()
    };
    let status = raw
        .do_put(futures::stream::iter([ours]))
        .await
        .expect_err("a put of ours");
    assert!(status.message().contains("only answers queries"), "{status}");

    // The server still answers.
    let mut sql = flight_sql(&fx, None).await;
    assert!(!tables(&mut sql).await.is_empty());
}
