//! A real S3-compatible server holding a copy of the datasets: where a trainer without
//! pushdown fetches its Parquet from. `tools/s3-server` (`scripts/setup-s3.sh`): s3s-fs's
//! compiled Rust storage, which keeps objects as files and checks SigV4 signatures, so its CPU
//! per request is a real store's order, not a Python mock's; with `TCP_NODELAY`, so a ranged
//! GET is not held ~40 ms by Nagle's algorithm, and each GET read with one `pread`, not in
//! 4 KiB blocking reads (either would make every S3 contender look slow).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

pub const BUCKET: &str = "bench";
pub const KEY: &str = "bench";
pub const SECRET: &str = "bench-secret";

/// The project's virtual environment (made by `scripts/setup-python.sh --bench`).
pub fn venv() -> Result<PathBuf> {
    let venv = std::env::current_dir()?.join(".venv/bin");
    if !venv.join("python").exists() {
        bail!(
            "{} has no python: run scripts/setup-python.sh --bench first",
            venv.display()
        );
    }
    Ok(venv)
}

/// The S3 server (tools/s3-server): `$PUSHDOWN_S3_SERVER`, else where `scripts/setup-s3.sh` installs it.
fn binary() -> Result<PathBuf> {
    let path = match std::env::var_os("PUSHDOWN_S3_SERVER") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?)
            .join(".cache/pushdown/tools/bin/s3-server"),
    };
    if !path.exists() {
        bail!(
            "no S3 server at {}: run scripts/setup-s3.sh first",
            path.display()
        );
    }
    Ok(path)
}

/// An S3 server child process over a scratch directory.
#[derive(Debug)]
pub struct S3Server {
    child: Child,
    root: PathBuf,
    pub endpoint: String,
}

impl S3Server {
    /// Starts the server on `addr`, in `namespace` when given, pinned to `cpus`.
    pub fn start(addr: SocketAddr, namespace: Option<&str>, cpus: Option<&str>) -> Result<Self> {
        let root = std::env::temp_dir().join(format!("pushdown-bench-s3-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join(BUCKET)).context("creating the S3 server's root")?;
        let mut argv: Vec<String> = Vec::new();
        if let Some(ns) = namespace {
            argv.extend(["ip", "netns", "exec", ns].map(String::from));
        }
        if let Some(c) = cpus {
            argv.extend(["taskset", "-c", c].map(String::from));
        }
        argv.push(binary()?.to_string_lossy().into_owned());
        argv.extend(
            [
                "--host",
                &addr.ip().to_string(),
                "--port",
                &addr.port().to_string(),
                "--access-key",
                KEY,
                "--secret-key",
                SECRET,
                &root.to_string_lossy(),
            ]
            .map(String::from),
        );
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", argv.join(" ")))?;
        let server = Self {
            child,
            root,
            endpoint: format!("http://{addr}"),
        };
        for _ in 0..300 {
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("the S3 server did not start on {addr}")
    }

    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Copies `datasets` (folders of `root`: Parquet files and tokenizers) into the bucket,
    /// through the S3 API.
    pub async fn upload(&self, root: &Path, datasets: &[&str]) -> Result<()> {
        let store = self.store()?;
        for d in datasets {
            let mut names: Vec<String> = std::fs::read_dir(root.join(d))
                .with_context(|| format!("listing {}", root.join(d).display()))?
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|f| f.ends_with(".parquet") || f == "tokenizer.json")
                .collect();
            names.sort();
            for f in names {
                let bytes = std::fs::read(root.join(d).join(&f))?;
                store
                    .put(&ObjectPath::from(format!("{d}/{f}")), bytes.into())
                    .await
                    .with_context(|| format!("uploading {d}/{f}"))?;
            }
        }
        Ok(())
    }

    /// The environment a `pushdown serve --data s3://bench` needs to reach this server.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT", self.endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .to_vec()
    }

    /// The bucket as an object store, the way a trainer reaches S3.
    pub fn store(&self) -> Result<Arc<dyn ObjectStore>> {
        let store = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_bucket_name(BUCKET)
            .with_region("us-east-1")
            .with_access_key_id(KEY)
            .with_secret_access_key(SECRET)
            .build()?;
        Ok(Arc::new(store))
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
