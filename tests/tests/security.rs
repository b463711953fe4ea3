//! A server safe to put on a network: bearer tokens with per-dataset grants (checked on
//! every request, tickets included), TLS, and mutual TLS; a real server on 127.0.0.1:0.

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, Criteria, FlightDescriptor, HandshakeRequest, Ticket};
use futures::TryStreamExt;
use pushdown_client::ConnectOptions;
use pushdown_datasets::{GenOptions, Kind, generate};
use pushdown_protocol::{Query, ScanRequest};
use pushdown_server::{ServerTls, Tokens};
use pushdown_tests::{Fixture, TestPki, num_rows, small_shards, write_images};
use tonic::Code;
use tonic::transport::Channel;

/// Reads `images` only.
const IMAGES_ONLY: &str = "images-reader-token-0123456789";
/// Reads everything.
const ADMIN: &str = "platform-admin-token-9876543210";

fn tokens() -> Tokens {
    Tokens::parse(&format!("{IMAGES_ONLY} images\n{ADMIN} *\n")).expect("tokens")
}

/// `images` (300 rows) and `text` side by side, behind [`tokens`]; the fixture's client
/// holds `token`.
async fn guarded(token: Option<&str>) -> Fixture {
    guarded_with(small_shards(), 100, token).await
}

/// [`guarded`] with `config` and `text_rows` rows of `text`.
async fn guarded_with(
    config: pushdown_server::ServerConfig,
    text_rows: usize,
    token: Option<&str>,
) -> Fixture {
    Fixture::secured(
        config,
        |root| {
            write_images(root, 300);
            let mut options = GenOptions::new(Kind::Text, text_rows);
            options.row_group_rows = Some(64);
            generate(&options, &root.join("text")).expect("text");
        },
        |b| b.tokens(tokens()),
        ConnectOptions {
            token: token.map(str::to_owned),
            ..ConnectOptions::default()
        },
    )
    .await
}

fn request<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("header");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

async fn raw(fx: &Fixture) -> FlightServiceClient<Channel> {
    pushdown_tests::raw_client(fx.running.url()).await
}

fn sql(text: &str) -> FlightDescriptor {
    FlightDescriptor::new_cmd(ScanRequest::new(Query::Sql(text.into())).encode())
}

async fn plan_code(fx: &Fixture, text: &str, token: Option<&str>) -> Code {
    match raw(fx).await.get_flight_info(request(sql(text), token)).await {
        Ok(_) => Code::Ok,
        Err(status) => {
            assert!(
                !status.message().contains(IMAGES_ONLY) && !status.message().contains(ADMIN),
                "never echoes a token: {status}"
            );
            status.code()
        }
    }
}

async fn listed(fx: &Fixture, token: Option<&str>) -> Result<Vec<String>, Code> {
    let stream = raw(fx)
        .await
        .list_flights(request(Criteria::default(), token))
        .await
        .map_err(|s| s.code())?;
    let infos: Vec<_> = stream.into_inner().try_collect().await.map_err(|s| s.code())?;
    Ok(infos
        .into_iter()
        .map(|i| i.flight_descriptor.expect("descriptor").path.join("/"))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_valid_token_are_unauthenticated() {
    let fx = guarded(None).await;
    let wrong = "images-reader-token-0123456780";
    for token in [None, Some(wrong), Some("")] {
        assert_eq!(listed(&fx, token).await, Err(Code::Unauthenticated), "{token:?}");
        assert_eq!(
            plan_code(&fx, "SELECT id FROM images", token).await,
            Code::Unauthenticated
        );
        let action = raw(&fx)
            .await
            .do_action(request(Action::new("health", ""), token))
            .await
            .expect_err("refused");
        assert_eq!(action.code(), Code::Unauthenticated);
        let get = raw(&fx)
            .await
            .do_get(request(Ticket::new(b"anything".to_vec()), token))
            .await
            .expect_err("refused");
        assert_eq!(
            get.code(),
            Code::Unauthenticated,
            "before the ticket is even read"
        );
    }
    // The real client without a token is told why.
    let err = fx.sql("SELECT id FROM images").await.expect_err("refused");
    assert!(err.contains("Bearer"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_reads_its_datasets_and_nothing_else() {
    let fx = guarded(Some(IMAGES_ONLY)).await;
    // Listed: only what it may read; the admin sees both.
    assert_eq!(
        listed(&fx, Some(IMAGES_ONLY)).await,
        Ok(vec!["images".to_owned()])
    );
    assert_eq!(
        listed(&fx, Some(ADMIN)).await,
        Ok(vec!["images".to_owned(), "text".to_owned()])
    );
    // Its own dataset streams, with the same rows as a local evaluation.
    let got = fx
        .sql("SELECT id, label FROM images WHERE id % 3 = 0")
        .await
        .expect("granted");
    let expected = fx.local("SELECT id, label FROM images WHERE id % 3 = 0").await;
    assert_eq!(num_rows(&got), num_rows(&expected));
    assert_eq!(num_rows(&got), 100);
    // Anything naming another dataset is refused, joins and subqueries included; a name
    // that does not exist is refused the same way (no probing for names).
    for text in [
        "SELECT * FROM text",
        "SELECT i.id FROM images i JOIN text t ON i.id = t.id",
        "SELECT id FROM images WHERE id IN (SELECT id FROM text)",
        "SELECT * FROM no_such_dataset",
    ] {
        assert_eq!(
            plan_code(&fx, text, Some(IMAGES_ONLY)).await,
            Code::PermissionDenied,
            "{text}"
        );
    }
    let path = raw(&fx)
        .await
        .get_schema(request(
            FlightDescriptor::new_path(vec!["text".into()]),
            Some(IMAGES_ONLY),
        ))
        .await
        .expect_err("path descriptor");
    assert_eq!(path.code(), Code::PermissionDenied);
    // Actions over another dataset too: its tokenizer, a plan's explanation.
    let tokenizer = raw(&fx)
        .await
        .do_action(request(Action::new("tokenizer", "text"), Some(IMAGES_ONLY)))
        .await
        .expect_err("tokenizer");
    assert_eq!(tokenizer.code(), Code::PermissionDenied);
    let explain = ScanRequest::new(Query::Sql("SELECT * FROM text".into())).encode();
    let explained = raw(&fx)
        .await
        .do_action(request(Action::new("explain", explain), Some(IMAGES_ONLY)))
        .await
        .expect_err("explain");
    assert_eq!(explained.code(), Code::PermissionDenied);
}

/// A ticket is the caller's own bytes: one the admin was given for `text`, replayed (or
/// forged) by a token that may not read `text`, is refused before anything is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_are_checked_against_the_callers_grant() {
    let fx = guarded(Some(ADMIN)).await;
    let info = raw(&fx)
        .await
        .get_flight_info(request(sql("SELECT id FROM text"), Some(ADMIN)))
        .await
        .expect("admin plans text")
        .into_inner();
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    fx.server.store().take_requests();
    let refused = raw(&fx)
        .await
        .do_get(request(ticket.clone(), Some(IMAGES_ONLY)))
        .await
        .expect_err("someone else's ticket");
    assert_eq!(refused.code(), Code::PermissionDenied);
    let count = raw(&fx)
        .await
        .do_action(request(
            Action::new("count", ticket.ticket.clone()),
            Some(IMAGES_ONLY),
        ))
        .await
        .expect_err("count over someone else's ticket");
    assert_eq!(count.code(), Code::PermissionDenied);
    assert!(
        fx.server.store().take_requests().is_empty(),
        "nothing read for a refused ticket"
    );
    // The admin redeems it.
    let rows: Vec<_> = raw(&fx)
        .await
        .do_get(request(ticket, Some(ADMIN)))
        .await
        .expect("admin streams")
        .into_inner()
        .try_collect()
        .await
        .expect("stream");
    assert!(!rows.is_empty());
}

/// A stream the server opens ahead for one caller is that caller's alone. Another token
/// presenting the same ticket is checked against its own grant first: refused, it neither
/// gets nor disturbs the stream held for the admin, whose next `DoGet` takes it. A token
/// that may read the ticket gets a stream of its own, never the held one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_read_ahead_for_one_caller_is_never_served_to_another() {
    let config = pushdown_server::ServerConfig {
        // A shard the cache holds is not read ahead.
        cache: pushdown_server::CacheConfig {
            default_mode: pushdown_server::CacheMode::Off,
            ..pushdown_server::CacheConfig::default()
        },
        ..small_shards()
    };
    let fx = guarded_with(config, 400, None).await;
    let count = |outcome: &str| pushdown_tests::read_aheads(&fx.server, outcome);
    let held = || pushdown_tests::until_read_ahead_held(&fx.server);
    let get = |ticket: Ticket, token: &'static str| {
        let url = fx.running.url();
        async move {
            let stream = pushdown_tests::raw_client(url)
                .await
                .do_get(request(ticket, Some(token)))
                .await?;
            let data = stream
                .into_inner()
                .map_err(|s| arrow_flight::error::FlightError::Tonic(Box::new(s)));
            let batches: Vec<_> = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(data)
                .try_collect()
                .await
                .expect("batches");
            Ok::<_, tonic::Status>(pushdown_tests::rows(&batches))
        }
    };
    let fx = &fx;
    let plan = |text: &'static str| async move {
        raw(fx)
            .await
            .get_flight_info(request(sql(text), Some(ADMIN)))
            .await
            .expect("admin plans")
            .into_inner()
            .endpoint
            .into_iter()
            .map(|e| e.ticket.expect("ticket"))
            .collect::<Vec<_>>()
    };

    // Text, which the images-only token may not read.
    let text = plan("SELECT id, body FROM text").await;
    assert!(text.len() >= 3, "{} endpoints", text.len());
    assert!(!get(text[0].clone(), ADMIN).await.expect("admin reads").is_empty());
    held().await;
    let refused = get(text[1].clone(), IMAGES_ONLY)
        .await
        .expect_err("the held ticket, presented by another token");
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(fx.server.holds_read_ahead(), "a refused caller disturbs nothing");
    let theirs = get(text[1].clone(), ADMIN).await.expect("admin reads");
    assert_eq!(count("taken"), 1);
    assert_eq!(count("dropped"), 0);

    // Images, which both tokens may read: the other token's stream is opened for it, and the
    // admin's held stream is dropped, not handed over.
    let images = plan("SELECT id, label FROM images").await;
    assert!(images.len() >= 2, "{} endpoints", images.len());
    get(images[0].clone(), ADMIN).await.expect("admin reads"); // drops the held text[2]
    held().await;
    let dropped = count("dropped");
    let other = get(images[1].clone(), IMAGES_ONLY).await.expect("its own stream");
    assert_eq!(count("taken"), 1, "never taken by another caller");
    assert_eq!(count("dropped"), dropped + 1);
    let admins = get(images[1].clone(), ADMIN).await.expect("admin reads");
    assert_eq!(other, admins, "the same rows, opened for each");
    assert!(!theirs.is_empty() && !other.is_empty());
}

/// Flight's Handshake, as pyarrow's `authenticate_basic_token` and payload-based clients
/// use it: the token comes back as the bearer header to send from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_returns_the_bearer_token() {
    use base64::Engine as _;
    let fx = guarded(None).await;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("trainer:{IMAGES_ONLY}"));
    let mut hs = tonic::Request::new(futures::stream::iter(Vec::<HandshakeRequest>::new()));
    hs.metadata_mut()
        .insert("authorization", format!("Basic {basic}").parse().expect("header"));
    let response = raw(&fx).await.handshake(hs).await.expect("basic handshake");
    assert_eq!(
        response
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().expect("text")),
        Some(format!("Bearer {IMAGES_ONLY}").as_str())
    );
    let payload = HandshakeRequest {
        protocol_version: 0,
        payload: ADMIN.as_bytes().to_vec().into(),
    };
    let response = raw(&fx)
        .await
        .handshake(futures::stream::iter(vec![payload]))
        .await
        .expect("payload handshake");
    let replies: Vec<_> = response.into_inner().try_collect().await.expect("replies");
    assert_eq!(replies[0].payload.as_ref(), ADMIN.as_bytes());
    let bad = HandshakeRequest {
        protocol_version: 0,
        payload: b"not-a-token-at-all-0000".to_vec().into(),
    };
    let refused = raw(&fx)
        .await
        .handshake(futures::stream::iter(vec![bad]))
        .await
        .expect_err("bad token");
    assert_eq!(refused.code(), Code::Unauthenticated);
}

fn tls_connect(pki: &TestPki, identity: bool) -> ConnectOptions {
    ConnectOptions {
        token: None,
        tls_ca: Some(pki.ca.clone().into_bytes()),
        tls_identity: identity.then(|| {
            (
                pki.client_cert.clone().into_bytes(),
                pki.client_key.clone().into_bytes(),
            )
        }),
        ..ConnectOptions::default()
    }
}

async fn tls_fixture(pki: &TestPki, mutual: bool, client_identity: bool) -> Fixture {
    let tls = ServerTls::new(pki.server_cert.clone(), pki.server_key.clone());
    let tls = if mutual {
        tls.require_client_certs(pki.ca.clone())
    } else {
        tls
    };
    Fixture::secured(
        small_shards(),
        |root| {
            write_images(root, 200);
        },
        |b| b.tls(tls),
        tls_connect(pki, client_identity),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_clients_that_trust_its_certificate() {
    let pki = TestPki::new();
    let fx = tls_fixture(&pki, false, false).await;
    let url = fx.running.url();
    assert!(url.starts_with("https://"), "{url}");
    let got = fx
        .sql("SELECT id FROM images WHERE id < 50")
        .await
        .expect("over TLS");
    assert_eq!(num_rows(&got), 50);
    // A client that does not trust the CA (the system's roots) is refused the connection.
    let untrusting = pushdown_client::PushdownClient::connect(std::slice::from_ref(&url))
        .await
        .expect("lazy connect");
    assert!(untrusting.list_datasets().await.is_err(), "unknown CA");
    // Plain HTTP/2 to the TLS port gets nothing.
    let plain = url.replacen("https://", "http://", 1);
    let plain = pushdown_client::PushdownClient::connect(&[plain])
        .await
        .expect("lazy connect");
    assert!(plain.list_datasets().await.is_err(), "cleartext to a TLS port");
    // A certificate for another name is refused: `dns://localhost` is checked as localhost,
    // an address the certificate does not name is not.
    let other = url.replacen("127.0.0.1", "127.0.0.2", 1);
    let wrong_name = pushdown_client::PushdownClient::connect_with(&[other], tls_connect(&pki, false))
        .await
        .expect("lazy connect");
    assert!(
        wrong_name.list_datasets().await.is_err(),
        "certificate names 127.0.0.1, not 127.0.0.2"
    );
    let port = fx.running.addr().port();
    let by_name = pushdown_client::PushdownClient::connect_with(
        &[format!("dns://localhost:{port}")],
        tls_connect(&pki, false),
    )
    .await
    .expect("resolves");
    let datasets = by_name
        .list_datasets()
        .await
        .expect("dns:// over TLS, checked as localhost");
    assert_eq!(datasets.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_requires_a_client_certificate_from_the_ca() {
    let pki = TestPki::new();
    let fx = tls_fixture(&pki, true, true).await;
    let got = fx
        .sql("SELECT id FROM images WHERE id < 7")
        .await
        .expect("with a client certificate");
    assert_eq!(num_rows(&got), 7);
    let anonymous =
        pushdown_client::PushdownClient::connect_with(&[fx.running.url()], tls_connect(&pki, false))
            .await
            .expect("lazy connect");
    assert!(anonymous.list_datasets().await.is_err(), "no client certificate");
    // A certificate from another CA is refused too.
    let stranger = TestPki::new();
    let mut foreign = tls_connect(&pki, false);
    foreign.tls_identity = Some((
        stranger.client_cert.into_bytes(),
        stranger.client_key.into_bytes(),
    ));
    let foreign = pushdown_client::PushdownClient::connect_with(&[fx.running.url()], foreign)
        .await
        .expect("lazy connect");
    assert!(
        foreign.list_datasets().await.is_err(),
        "client certificate of another CA"
    );
}

/// Images and text, open (no tokens), with the given limits.
async fn open_server(config: pushdown_server::ServerConfig) -> Fixture {
    Fixture::new(config, |root| {
        write_images(root, 200);
        let mut options = GenOptions::new(Kind::Text, 100);
        options.row_group_rows = Some(64);
        generate(&options, &root.join("text")).expect("text");
    })
    .await
}

async fn still_serves(fx: &Fixture) {
    let got = fx
        .sql("SELECT id FROM images WHERE id < 10")
        .await
        .expect("still serving");
    assert_eq!(num_rows(&got), 10);
}

/// Calls that would allocate gigabytes are refused at planning, by SQL, fragment or the
/// `profile` action, and the server goes on serving; a large but legal cap-fitting call
/// runs in smaller batches with the right result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_op_arguments_are_refused_before_anything_is_allocated() {
    use pushdown_protocol::{Fragment, OpCall, Value};
    let fx = open_server(small_shards()).await;
    for text in [
        "SELECT decode_resize(image, 8192, 8192) FROM images",
        "SELECT thumbnail(image, 8192, 100) FROM images",
        "SELECT normalize(decode_resize(image, 2048, 2048), 0.5, 0.5) FROM images",
    ] {
        let status = raw(&fx).await.get_flight_info(sql(text)).await.expect_err(text);
        assert_eq!(status.code(), Code::InvalidArgument, "{text}: {status}");
        assert!(status.message().contains("over this server's cap"), "{status}");
    }
    let fragment = ScanRequest::new(Query::Fragment(Fragment {
        dataset: "images".into(),
        columns: vec!["pixels".into()],
        predicate: None,
        ops: vec![OpCall::new(
            "decode_resize",
            "image",
            vec![Value::Int(8192), Value::Int(8192)],
            "pixels",
        )],
    }));
    let status = raw(&fx)
        .await
        .get_flight_info(FlightDescriptor::new_cmd(fragment.encode()))
        .await
        .expect_err("fragment");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    let status = raw(&fx)
        .await
        .do_action(Action::new("profile", fragment.encode()))
        .await
        .expect_err("profile");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    still_serves(&fx).await;

    // tokenize(body, 1 Mi tokens) may produce 4 MiB a row: under the 16 MiB cap, so it runs,
    // in batches of 256 MiB / 4 MiB = 64 rows, reserving only what the text can hold.
    let got = fx
        .sql("SELECT id, tokenize(body, 1048576) AS t FROM text")
        .await
        .expect("legal, large bound");
    assert_eq!(num_rows(&got), 100);
    assert!(got.iter().all(|b| b.num_rows() <= 64), "batches cut to the cap");
    let short = fx
        .sql("SELECT id, tokenize(body, 100000) AS t FROM text")
        .await
        .expect("same tokens");
    assert_eq!(pushdown_tests::rows(&got), pushdown_tests::rows(&short));
}

/// Op output is reserved in the query engine's memory pool before a kernel runs: a pool too
/// small for a batch of outputs refuses it (`ResourceExhausted`) instead of allocating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn op_output_is_accounted_in_the_memory_pool() {
    let fx = open_server(pushdown_server::ServerConfig {
        memory_limit: 8 << 20,
        ..small_shards()
    })
    .await;
    // 512×512×3 = 768 KiB a row; 100-row batches need 75 MiB.
    let outcome = first_stream(&fx, "SELECT decode_resize(image, 512, 512) AS px FROM images").await;
    let status = outcome.expect_err("pool too small");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    still_serves(&fx).await;
}

/// Plans `text` and reads its first endpoint to the end.
async fn first_stream(fx: &Fixture, text: &str) -> Result<Vec<arrow_flight::FlightData>, tonic::Status> {
    let info = raw(fx)
        .await
        .get_flight_info(sql(text))
        .await
        .expect("plans")
        .into_inner();
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    match raw(fx).await.do_get(ticket).await {
        Ok(stream) => stream.into_inner().try_collect().await,
        Err(status) => Err(status),
    }
}

/// A query is held to its own share of the pool, however much the server has free: the
/// greedy one fails alone, and the next query runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_query_has_a_pool_of_its_own_under_the_total() {
    let fx = open_server(pushdown_server::ServerConfig {
        memory_limit: 1 << 30,
        max_query_memory: 8 << 20,
        ..small_shards()
    })
    .await;
    let outcome = first_stream(&fx, "SELECT decode_resize(image, 512, 512) AS px FROM images").await;
    let status = outcome.expect_err("over the query's share");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    assert!(status.message().contains("this query's memory limit"), "{status}");
    // Small outputs fit the same share.
    let small = fx
        .sql("SELECT decode_resize(image, 16, 16) AS px FROM images")
        .await
        .expect("small outputs fit");
    assert_eq!(num_rows(&small), 200);
    still_serves(&fx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_length_and_nesting_are_bounded() {
    let fx = open_server(pushdown_server::ServerConfig {
        max_sql_bytes: 4096,
        ..small_shards()
    })
    .await;
    let long = format!(
        "SELECT id FROM images WHERE id IN ({})",
        vec!["1"; 3000].join(",")
    );
    let status = raw(&fx)
        .await
        .get_flight_info(sql(&long))
        .await
        .expect_err("long");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("limit of 4096 bytes"), "{status}");
    let nested = format!("SELECT {}1{} FROM images", "(".repeat(1000), ")".repeat(1000));
    let status = raw(&fx)
        .await
        .get_flight_info(sql(&nested))
        .await
        .expect_err("nested");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    // A flat chain the parser builds without recursion, but DataFusion's planning recurses
    // on (2,000 terms overflowed a 2 MiB stack): refused by depth, in a query or a ticket.
    let chain = format!("SELECT id FROM images WHERE id < {}", vec!["1"; 2000].join("+"));
    let status = raw(&fx)
        .await
        .get_flight_info(sql(&chain))
        .await
        .expect_err("deep chain");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(status.message().contains("nest deeper than"), "{status}");
    let forged = pushdown_protocol::ShardTicket {
        request: ScanRequest::new(Query::Sql(chain.clone())),
        shard: None,
        skip_rows: 0,
        take_rows: None,
    };
    let status = raw(&fx)
        .await
        .do_get(Ticket::new(forged.encode()))
        .await
        .expect_err("deep chain in a forged ticket");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    // Within the depth limit, a long chain plans and runs (on the CPU threads' deep stacks).
    let legal = format!(
        "SELECT id FROM images WHERE id < {}",
        vec!["1"; pushdown_server::MAX_EXPR_DEPTH - 10].join("+")
    );
    let got = fx.sql(&legal).await.expect("deep but legal");
    assert_eq!(num_rows(&got), 200);
    still_serves(&fx).await;
}

/// `profile` and `count` scan data: they take a stream slot like a stream does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_that_scan_wait_for_a_stream_slot() {
    let fx = open_server(pushdown_server::ServerConfig {
        max_concurrent_streams: 1,
        queue_timeout: std::time::Duration::from_millis(200),
        ..small_shards()
    })
    .await;
    let info = raw(&fx)
        .await
        .get_flight_info(sql("SELECT decode_resize(image, 256, 256) AS px FROM images"))
        .await
        .expect("plans")
        .into_inner();
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    // Opened and never read: it holds the only slot.
    let held = raw(&fx).await.do_get(ticket.clone()).await.expect("opens");
    let status = raw(&fx)
        .await
        .do_action(Action::new("count", ticket.ticket.clone()))
        .await
        .expect_err("no slot");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    drop(held);
    // Once the stream is gone the slot frees and the same action runs.
    let mut counted = None;
    for _ in 0..50 {
        match raw(&fx)
            .await
            .do_action(Action::new("count", ticket.ticket.clone()))
            .await
        {
            Ok(stream) => {
                counted = Some(stream.into_inner().try_collect::<Vec<_>>().await.expect("count"));
                break;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
    assert!(
        counted.is_some(),
        "the slot is released when the client goes away"
    );
}

/// The rows a `DoGet` of `ticket` streams.
async fn rows_of(fx: &Fixture, ticket: &Ticket) -> usize {
    let frames = raw(fx)
        .await
        .do_get(ticket.clone())
        .await
        .expect("opens")
        .into_inner()
        .map_err(|s| arrow_flight::error::FlightError::Tonic(Box::new(s)));
    let batches: Vec<arrow::array::RecordBatch> =
        arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(frames)
            .try_collect()
            .await
            .expect("streams");
    batches.iter().map(|b| b.num_rows()).sum()
}

/// A stream whose client stops reading holds its shard's cache claim while it waits; other
/// requests for the shard compute it beside that stream instead of waiting for its client
/// (found by `harness soak`: a burst for one shard was served one client hold at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_does_not_hold_up_others_reading_its_shard() {
    let fx = open_server(pushdown_server::ServerConfig {
        cache: pushdown_server::CacheConfig {
            default_mode: pushdown_server::CacheMode::On,
            ..pushdown_server::CacheConfig::default()
        },
        ..small_shards()
    })
    .await;
    // 64 rows of 256² pixels: 12 MiB in 2 MiB messages, far more than the socket buffers.
    let info = raw(&fx)
        .await
        .get_flight_info(sql(
            "SELECT decode_resize(image, 256, 256) AS px FROM images WHERE id < 64",
        ))
        .await
        .expect("plans")
        .into_inner();
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let mut quiet = raw(&fx)
        .await
        .do_get(ticket.clone())
        .await
        .expect("opens")
        .into_inner();
    quiet.message().await.expect("the schema").expect("a message");
    // A hang detector, not a timing: before, this waited for as long as `quiet` was held.
    let second = tokio::time::timeout(std::time::Duration::from_secs(300), rows_of(&fx, &ticket))
        .await
        .expect("the second reader was held up by the quiet one");
    drop(quiet);
    assert!(second > 0);
    assert_eq!(second, rows_of(&fx, &ticket).await, "the whole shard");
    still_serves(&fx).await;
}

/// A seeded mutation of `seed`: bits flipped, cut short, bytes inserted or repeated, or
/// random bytes of any length.
fn mutate(rng: &mut rand_chacha::ChaCha8Rng, seed: &[u8]) -> Vec<u8> {
    use rand::Rng;
    let mut out = seed.to_vec();
    match rng.random_range(0..5) {
        0 => {
            for _ in 0..rng.random_range(1..8) {
                if !out.is_empty() {
                    let i = rng.random_range(0..out.len());
                    out[i] ^= 1 << rng.random_range(0..8);
                }
            }
        }
        1 => out.truncate(rng.random_range(0..=out.len())),
        2 => {
            let at = rng.random_range(0..=out.len());
            let junk: Vec<u8> = (0..rng.random_range(1..16)).map(|_| rng.random()).collect();
            out.splice(at..at, junk);
        }
        3 if !out.is_empty() => {
            let a = rng.random_range(0..out.len());
            let b = rng.random_range(a..=out.len());
            let piece = out[a..b].to_vec();
            out.splice(b..b, piece);
        }
        _ => out = (0..rng.random_range(0..256)).map(|_| rng.random()).collect(),
    }
    out
}

/// Property: arbitrary and mutated tickets, commands and SQL text are answered with a
/// status (an error, or a valid answer for a still-valid input), never a panic or a crash,
/// and the server goes on serving. Seeded; the same entry points the fuzz targets would
/// take, on stable Rust.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_tickets_commands_and_sql_never_take_the_server_down() {
    use rand::{Rng, SeedableRng};
    let fx = open_server(small_shards()).await;
    // CI runs one seed; `PUSHDOWN_PROPERTY_SEED` and `PUSHDOWN_PROPERTY_CASES` explore more.
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let seed = env("PUSHDOWN_PROPERTY_SEED", 0x5eed);
    let cases = env("PUSHDOWN_PROPERTY_CASES", 120);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let info = raw(&fx)
        .await
        .get_flight_info(sql("SELECT id, label FROM images WHERE label < 500"))
        .await
        .expect("plans")
        .into_inner();
    let ticket = info.endpoint[0].ticket.clone().expect("ticket").ticket.to_vec();
    let command = ScanRequest::new(Query::Sql("SELECT id FROM images WHERE id < 5".into()))
        .encode()
        .to_vec();
    let text =
        b"SELECT id, thumbnail(image, 8) AS t FROM images WHERE label < 10 ORDER BY id LIMIT 3".to_vec();
    // A bound Flight SQL prepared statement's handle, and the command that executes it.
    let params = arrow::array::RecordBatch::try_new(
        std::sync::Arc::new(arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new(
            "$1",
            arrow::datatypes::DataType::Int64,
            true,
        )])),
        vec![std::sync::Arc::new(arrow::array::Int64Array::from(vec![7]))],
    )
    .expect("params");
    let handle = pushdown_server::PreparedStatement::bind(
        "SELECT id, label FROM images WHERE label < $1".into(),
        &params,
    )
    .expect("binds")
    .encode()
    .to_vec();
    if let Ok(dir) = std::env::var("PUSHDOWN_WRITE_FUZZ_SEEDS") {
        // The fuzz targets' binary seeds (scripts/fuzz.sh), from this live server.
        for (target, seed) in [
            ("ticket", &ticket),
            ("command", &command),
            ("prepared_handle", &handle),
        ] {
            let folder = std::path::Path::new(&dir).join(target);
            std::fs::create_dir_all(&folder).expect("seed folder");
            std::fs::write(folder.join("seed-1"), seed).expect("seed");
        }
    }
    // The messages that bind parameters to the handle (DoPut: schema, then the batch).
    use arrow_flight::sql::ProstMessageExt;
    use prost::Message;
    let bind_descriptor = FlightDescriptor::new_cmd(
        arrow_flight::sql::CommandPreparedStatementQuery {
            prepared_statement_handle: handle.clone().into(),
        }
        .as_any()
        .encode_to_vec(),
    );
    let bind: Vec<arrow_flight::FlightData> = arrow_flight::encode::FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(bind_descriptor))
        .build(futures::stream::iter([Ok(params.clone())]))
        .try_collect()
        .await
        .expect("bind messages");
    let mut answered = 0;
    for _ in 0..cases {
        // Flight SQL: parameters whose batch message (header or body) is mutated.
        let mut messages = bind.clone();
        if let Some(last) = messages.last_mut() {
            if rng.random_bool(0.5) {
                last.data_header = mutate(&mut rng, &last.data_header).into();
            } else {
                last.data_body = mutate(&mut rng, &last.data_body).into();
            }
        }
        if let Ok(response) = raw(&fx).await.do_put(futures::stream::iter(messages)).await {
            let _ = response.into_inner().try_collect::<Vec<_>>().await;
        }
        // Flight SQL: a mutated prepared-statement handle, executed.
        let h = mutate(&mut rng, &handle);
        if let Ok(p) = pushdown_server::PreparedStatement::decode(&h) {
            let _ = p.bound_sql();
        }
        let command_sql = arrow_flight::sql::CommandPreparedStatementQuery {
            prepared_statement_handle: h.into(),
        };
        let c = mutate(&mut rng, &command_sql.as_any().encode_to_vec());
        let _ = raw(&fx).await.get_flight_info(FlightDescriptor::new_cmd(c)).await;
        let t = mutate(&mut rng, &ticket);
        let _ = pushdown_protocol::ShardTicket::decode(&t);
        if let Ok(stream) = raw(&fx).await.do_get(Ticket::new(t)).await {
            let _ = stream.into_inner().try_collect::<Vec<_>>().await;
            answered += 1;
        }
        let c = mutate(&mut rng, &command);
        let _ = ScanRequest::decode_command(&c);
        let _ = raw(&fx)
            .await
            .get_flight_info(FlightDescriptor::new_cmd(c.clone()))
            .await;
        let _ = raw(&fx).await.do_action(Action::new("explain", c)).await;
        let s = mutate(&mut rng, &text);
        if let Ok(s) = String::from_utf8(s) {
            let _ = raw(&fx).await.get_flight_info(sql(&s)).await;
        }
    }
    assert!(
        answered < cases,
        "mutations must break most tickets (seed {seed})"
    );
    assert_eq!(
        fx.server.metrics().panics_contained.get(),
        0,
        "no input reached a panic, even a contained one (seed {seed})"
    );
    still_serves(&fx).await;
}

/// Read-only by construction, inside forged tickets too: a ticket is the caller's bytes, so
/// every statement kind the SQL endpoint refuses is refused when it arrives as a ticket's
/// query, for a shard and for a whole-query stream, and nothing is written or read outside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_tickets_cannot_carry_anything_but_a_select() {
    let fx = open_server(small_shards()).await;
    let outside = fx.root.path().join("outside.parquet");
    let elsewhere = tempfile::tempdir().expect("dir");
    write_images(elsewhere.path(), 8);
    let info = raw(&fx)
        .await
        .get_flight_info(sql("SELECT id FROM images"))
        .await
        .expect("plans")
        .into_inner();
    let real =
        pushdown_protocol::ShardTicket::decode(&info.endpoint[0].ticket.as_ref().expect("ticket").ticket)
            .expect("ours");
    let statements = [
        "CREATE TABLE t AS SELECT 1".to_string(),
        "CREATE VIEW v AS SELECT * FROM images".into(),
        "DROP TABLE images".into(),
        "INSERT INTO images SELECT * FROM images".into(),
        "DELETE FROM images".into(),
        "UPDATE images SET label = 0".into(),
        format!("COPY images TO '{}'", outside.display()),
        format!(
            "COPY (SELECT * FROM images) TO '{}' STORED AS PARQUET",
            outside.display()
        ),
        "SET datafusion.execution.batch_size = 1".into(),
        format!(
            "CREATE EXTERNAL TABLE x STORED AS PARQUET LOCATION '{}'",
            elsewhere.path().display()
        ),
        format!(
            "SELECT * FROM '{}/images/part-00000.parquet'",
            elsewhere.path().display()
        ),
        "SELECT * FROM '/etc/passwd'".into(),
        "EXPLAIN ANALYZE SELECT * FROM images".into(),
        "SELECT 1; SELECT 2".into(),
    ];
    for text in &statements {
        for shard in [real.shard.clone(), None] {
            let forged = pushdown_protocol::ShardTicket {
                request: ScanRequest::new(Query::Sql(text.clone())),
                shard: shard.clone(),
                skip_rows: 0,
                take_rows: None,
            };
            let status = raw(&fx)
                .await
                .do_get(Ticket::new(forged.encode()))
                .await
                .expect_err(text);
            assert!(
                matches!(status.code(), Code::InvalidArgument | Code::NotFound),
                "{text} (shard: {}): {status}",
                shard.is_some()
            );
        }
    }
    assert!(!outside.exists(), "a forged COPY wrote a file");
    still_serves(&fx).await;
}
