//! The disaggregated contender, as tf.data service runs input pipelines: the whole pipeline
//! — reading, filtering, the reducing ops, random augmentation, shuffling and batching — runs
//! on the far side, and finished batches cross the link. The trainer only decodes them.
//!
//! The worker (`harness finished`, started on the far side of the link) runs the pipeline
//! with this project's own loader against a pushdown server in the same process, pushing
//! every op it may; each connection asks for a pipeline, a seed and a number of epochs, and
//! gets an Arrow IPC stream of the finished batches over plain TCP (no gRPC framing), in the
//! codec this project would give its own streams on that link.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::StreamExt;
use pushdown_client::{LoaderOptions, LoaderSource, Prepared, Push, PushdownClient, SharedTotals};
use pushdown_planner::Pipeline;
use pushdown_protocol::Compression;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// What a trainer asks the worker for (one JSON line).
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    pipeline: Pipeline,
    seed: u64,
    epochs: usize,
    /// `none`, `zstd` or `lz4`.
    compression: String,
}

/// `harness finished`: the worker. Prints its address, then serves connections one at a time
/// (a trainer per worker, as tf.data service's default sharding gives each trainer its
/// workers' streams).
pub fn serve(data: &Path, listen: SocketAddr, threads: usize) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(threads.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let server = crate::open_server(data, threads).await?;
        // The reader, in this process: reached over this host's loopback.
        let reader = server.spawn("127.0.0.1:0".parse()?).await?;
        let reader_url = format!("http://{}", reader.addr());
        let listener = tokio::net::TcpListener::bind(listen).await?;
        println!("listening on {}", listener.local_addr()?);
        std::io::stdout().flush()?;
        loop {
            let (socket, _) = listener.accept().await?;
            socket.set_nodelay(true)?;
            if let Err(e) = serve_one(socket, &reader_url, threads).await {
                eprintln!("finished-batch worker: {e:#}");
            }
        }
    })
}

async fn serve_one(socket: tokio::net::TcpStream, reader_url: &str, threads: usize) -> Result<()> {
    let (read, mut write) = socket.into_split();
    let mut line = String::new();
    tokio::io::BufReader::new(read).read_line(&mut line).await?;
    let request: Request = serde_json::from_str(&line).context("the request line")?;
    let client = PushdownClient::connect(&[reader_url]).await?;
    let options = LoaderOptions {
        seed: request.seed,
        epochs: request.epochs,
        workers: Some(threads.max(1)),
        // Every op that may run in the reader runs there: it is this process.
        push: Push::First(usize::MAX),
        compression: Some(Compression::None),
        link: crate::compare::one_core_each(f64::INFINITY),
        ..LoaderOptions::default()
    };
    let prepared = Prepared::new(client, LoaderSource::Pipeline(request.pipeline), options).await?;
    let schema = prepared.schema();
    let compression: Compression = request.compression.parse().map_err(anyhow::Error::msg)?;
    let write_options =
        arrow::ipc::writer::IpcWriteOptions::default().try_with_compression(match compression {
            Compression::None => None,
            Compression::Zstd => Some(arrow::ipc::CompressionType::ZSTD),
            Compression::Lz4 => Some(arrow::ipc::CompressionType::LZ4_FRAME),
            Compression::Adaptive => anyhow::bail!("the finished-batch worker takes a fixed codec"),
        })?;
    let mut writer =
        arrow::ipc::writer::StreamWriter::try_new_with_options(Vec::new(), &schema, write_options)?;
    let totals = SharedTotals::default();
    for epoch in 0..request.epochs as u64 {
        let mut batches = prepared.epoch(epoch, 0, totals.clone());
        while let Some(batch) = batches.next().await {
            writer.write(&batch?)?;
            write.write_all(&std::mem::take(writer.get_mut())).await?;
        }
    }
    writer.finish()?;
    write.write_all(&std::mem::take(writer.get_mut())).await?;
    write.shutdown().await?;
    Ok(())
}

/// What one trainer run received.
pub struct Received {
    pub samples: u64,
    pub bytes: u64,
    pub waited: Duration,
    pub elapsed: Duration,
}

/// The trainer: asks `addr` for `epochs` epochs of `pipeline` and reads the finished batches
/// (decoding them is all it does). Blocking: run it off the async runtime.
pub fn receive(
    addr: SocketAddr,
    pipeline: &Pipeline,
    seed: u64,
    epochs: usize,
    compression: Compression,
) -> Result<Received> {
    let start = Instant::now();
    let mut socket = std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    socket.set_nodelay(true)?;
    let request = Request {
        pipeline: pipeline.clone(),
        seed,
        epochs,
        compression: compression.to_string(),
    };
    socket.write_all(format!("{}\n", serde_json::to_string(&request)?).as_bytes())?;
    let counted = Counted {
        inner: BufReader::with_capacity(1 << 20, socket),
        bytes: 0,
    };
    let mut reader = arrow::ipc::reader::StreamReader::try_new(counted, None)?;
    let (mut samples, mut waited) = (0u64, Duration::ZERO);
    loop {
        let asked = Instant::now();
        let next = reader.next();
        waited += asked.elapsed();
        match next {
            Some(batch) => samples += batch?.num_rows() as u64,
            None => break,
        }
    }
    Ok(Received {
        samples,
        bytes: reader.get_ref().bytes,
        waited,
        elapsed: start.elapsed(),
    })
}

/// Counts the bytes read through it.
struct Counted<R> {
    inner: R,
    bytes: u64,
}

impl<R: BufRead> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}
