//! A real S3-compatible server (moto, from the project's Python environment) holding a copy
//! of the datasets: where a trainer without pushdown fetches its Parquet from.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use object_store::ObjectStore;

pub const BUCKET: &str = "bench";
const KEY: &str = "bench";

/// Uploads the datasets' Parquet files and tokenizers with boto3.
const UPLOAD: &str = r#"
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=sys.argv[1], aws_access_key_id="bench",
                  aws_secret_access_key="bench", region_name="us-east-1")
s3.create_bucket(Bucket="bench")
root = sys.argv[2]
for d in sys.argv[3:]:
    for f in sorted(os.listdir(os.path.join(root, d))):
        if f.endswith(".parquet") or f == "tokenizer.json":
            s3.upload_file(os.path.join(root, d, f), "bench", d + "/" + f)
"#;

/// The project's virtual environment (made by `scripts/setup-python.sh`).
pub fn venv() -> Result<PathBuf> {
    let venv = std::env::current_dir()?.join(".venv/bin");
    if !venv.join("moto_server").exists() {
        bail!(
            "{} has no moto_server: run scripts/setup-python.sh first",
            venv.display()
        );
    }
    Ok(venv)
}

/// A `moto_server` child process.
#[derive(Debug)]
pub struct S3Server {
    child: Child,
    pub endpoint: String,
}

impl S3Server {
    /// Starts moto on `addr`, in `namespace` when given, pinned to `cpus`.
    pub fn start(addr: SocketAddr, namespace: Option<&str>, cpus: Option<&str>) -> Result<Self> {
        let venv = venv()?;
        let mut argv: Vec<String> = Vec::new();
        if let Some(ns) = namespace {
            argv.extend(["ip", "netns", "exec", ns].map(String::from));
        }
        if let Some(c) = cpus {
            argv.extend(["taskset", "-c", c].map(String::from));
        }
        argv.push(venv.join("moto_server").to_string_lossy().into_owned());
        argv.extend([
            "-H".to_owned(),
            addr.ip().to_string(),
            "-p".to_owned(),
            addr.port().to_string(),
        ]);
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", argv.join(" ")))?;
        let server = Self {
            child,
            endpoint: format!("http://{addr}"),
        };
        for _ in 0..300 {
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("moto did not start on {addr}")
    }

    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Copies `datasets` (folders of `root`) into the bucket.
    pub fn upload(&self, root: &Path, datasets: &[&str]) -> Result<()> {
        let out = Command::new(venv()?.join("python"))
            .arg("-c")
            .arg(UPLOAD)
            .arg(&self.endpoint)
            .arg(root)
            .args(datasets)
            .output()
            .context("running the upload script")?;
        if !out.status.success() {
            bail!(
                "uploading to moto: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// The bucket as an object store, the way a trainer reaches S3.
    pub fn store(&self) -> Result<Arc<dyn ObjectStore>> {
        let store = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_bucket_name(BUCKET)
            .with_region("us-east-1")
            .with_access_key_id(KEY)
            .with_secret_access_key(KEY)
            .build()?;
        Ok(Arc::new(store))
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
