//! The S3-compatible server pushdown's tests and benchmarks read from: s3s-fs's storage
//! (objects kept as files on disk, SigV4 signatures checked), its GETs read with one `pread`
//! (`store`), behind a listener that sets `TCP_NODELAY` on every connection.
//!
//! s3s-fs's own binary leaves Nagle's algorithm on and streams an object in 4 KiB writes, so
//! the tail of each ranged GET waited for the reader's delayed ACK: about 40 ms per response
//! on loopback, which made every S3 contender latency-bound by an artifact no production
//! store has (AWS S3 and MinIO answer without it).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;

mod store;

#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the bound address is printed).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Access key requests must be signed with.
    #[arg(long)]
    access_key: String,
    /// Secret key requests must be signed with.
    #[arg(long)]
    secret_key: String,
    /// Root directory: one folder per bucket.
    root: PathBuf,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let storage = store::Store::new(&args.root)?;
    let service = {
        let mut builder = S3ServiceBuilder::new(storage);
        builder.set_auth(SimpleAuth::from_single(args.access_key, args.secret_key));
        builder.build()
    };
    let listener = TcpListener::bind((args.host.as_str(), args.port)).await?;
    let local: SocketAddr = listener.local_addr()?;
    println!("listening on http://{local}");
    let http = Builder::new(TokioExecutor::new());
    loop {
        let (socket, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: wait for some to close rather than spin.
                eprintln!("accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        if let Err(e) = socket.set_nodelay(true) {
            eprintln!("TCP_NODELAY: {e}");
        }
        let connection = http
            .serve_connection(TokioIo::new(socket), service.clone())
            .into_owned();
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}
