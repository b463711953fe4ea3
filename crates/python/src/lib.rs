//! `pushdown._native`: the Rust loader behind `pushdown.Loader`.
//!
//! Batches cross into Python as `(name, kind, value)` triples: `kind` is `"tensor"` for a
//! numpy array (built from the Arrow buffer without copying when the buffer is uniquely
//! owned, which batches fresh from the loader's workers are) or `"arrow"` for any other
//! column (variable-length, nullable, dates, decimals: decided by the schema,
//! `Column::is_tensor`). A batch's Arrow columns cross together, once, as one record batch
//! through the Arrow C Data Interface (an `_ArrowBatch` speaking the PyCapsule protocol,
//! `__arrow_c_array__`): pyarrow takes the buffers themselves, with no copy and no IPC
//! encoding. The GIL is released while the loader waits for data or plans.

use std::collections::HashMap;
use std::sync::Arc;

/// The module's own Rust allocations on mimalloc, which keeps freed pages for the next batch
/// (glibc's allocator, the interpreter's, unmaps batch-sized buffers on free and faults them
/// back in). C code and the interpreter keep glibc's: this serves Rust's `alloc` only, and
/// every buffer handed to Python (numpy arrays, Arrow's C Data Interface) is freed through
/// Rust again. `pushdown/__init__.py` turns its purging of freed pages off as it loads.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use arrow::array::{ArrayRef, AsArray};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type,
    Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow::record_batch::RecordBatch;
use numpy::{PyArray1, PyArrayMethods};
use parking_lot::Mutex;
use pushdown_client::bucket::BucketBy;
use pushdown_client::pack::Pack;
use pushdown_client::readers::{Narrowing, plan_for_readers_blocking};
use pushdown_client::{
    Column, ConnectOptions, Echo, Link, Loader, LoaderOptions, LoaderSource, LoaderState, MixtureSource,
    RowSteps, StreamOptions,
};
use pushdown_planner::{Pipeline, Step};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyDict};

/// `(name, "tensor" | "bfloat16" | "arrow", numpy array | _ArrowBatch)`: a `"bfloat16"`
/// array holds the numbers' `uint16` bits (numpy has no bfloat16); every `"arrow"` column of
/// a batch names the same `_ArrowBatch`, which holds them all.
type PyColumn = (String, &'static str, Py<PyAny>);

fn runtime_error(e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// The caller's arguments refused: `pushdown.InvalidArgumentError` (a `ValueError`).
fn invalid_argument(message: impl Into<String>) -> PyErr {
    client_error(pushdown_client::ClientError::Invalid(message.into()))
}

/// A client error as the `pushdown.errors` class of its kind (`UnavailableError`, …),
/// its message said once; a `RuntimeError` should that module not import.
fn client_error(e: pushdown_client::ClientError) -> PyErr {
    let (kind, message) = (e.kind().name(), e.to_string());
    Python::attach(|py| {
        let class = py
            .import("pushdown.errors")
            .and_then(|m| m.getattr("BY_KIND"))
            .and_then(|by_kind| by_kind.get_item(kind))
            .and_then(|class| Ok(class.downcast_into::<pyo3::types::PyType>()?));
        match class {
            Ok(class) => PyErr::from_type(class, message),
            Err(_) => PyRuntimeError::new_err(message),
        }
    })
}

/// `echo=`: repeats per sample, or `"auto"` (from the measured wait).
#[derive(Debug, FromPyObject)]
enum EchoArg {
    Times(u32),
    Name(String),
}

impl<'py> IntoPyObject<'py> for EchoArg {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        match self {
            Self::Times(k) => Ok(k.into_pyobject(py)?.into_any()),
            Self::Name(n) => Ok(n.into_pyobject(py)?.into_any()),
        }
    }
}

/// The Rust loader. Use `pushdown.Loader`, which wraps it.
#[pyclass(name = "_Loader", module = "pushdown._native")]
struct PyLoader {
    inner: Arc<Mutex<Loader>>,
}

#[pymethods]
impl PyLoader {
    #[new]
    #[pyo3(signature = (
        servers, sql=None, pipeline=None, batch_size=None, shuffle_buffer=None, seed=0, rank=0,
        world_size=1, epochs=1, drop_last=false, prefetch=4, workers=None, concurrency=None,
        bandwidth_bytes_per_s=None, compression="auto", stall_timeout_s=30.0, max_retries=3, call_timeout_s=None,
        token=None, tls_ca=None, tls_client_cert=None, tls_client_key=None, echo=EchoArg::Times(1),
        echo_max=4, report_every_s=1.0, placement="costed", partitions=None, mixture=None, pack=None,
        bucket_by=None, tokenizer=None, cpu_affinity=None
    ))]
    #[expect(clippy::too_many_arguments, reason = "Python keyword arguments")]
    fn new(
        py: Python<'_>,
        servers: Vec<String>,
        sql: Option<String>,
        pipeline: Option<String>,
        batch_size: Option<usize>,
        shuffle_buffer: Option<usize>,
        seed: u64,
        rank: usize,
        world_size: usize,
        epochs: usize,
        drop_last: bool,
        prefetch: usize,
        workers: Option<usize>,
        concurrency: Option<usize>,
        bandwidth_bytes_per_s: Option<f64>,
        compression: &str,
        stall_timeout_s: f64,
        max_retries: usize,
        call_timeout_s: Option<f64>,
        token: Option<String>,
        tls_ca: Option<String>,
        tls_client_cert: Option<String>,
        tls_client_key: Option<String>,
        echo: EchoArg,
        echo_max: u32,
        report_every_s: f64,
        placement: &str,
        partitions: Option<usize>,
        mixture: Option<Vec<MixtureArg>>,
        pack: Option<PackArg>,
        bucket_by: Option<BucketArg>,
        tokenizer: Option<Vec<u8>>,
        cpu_affinity: Option<Vec<usize>>,
    ) -> PyResult<Self> {
        let push: pushdown_client::Push = placement
            .parse()
            .map_err(|e: pushdown_client::ClientError| invalid_argument(e.to_string()))?;
        let echo = echo_mode(echo, echo_max)?;
        let report_every = report_interval(report_every_s)?;
        let mut connect = connect_options(token, tls_ca, tls_client_cert, tls_client_key)?;
        connect.tokenizer = tokenizer.map(Arc::new);
        let stream = stream_options(concurrency, stall_timeout_s, max_retries)?;
        connect.call_timeout = match call_timeout_s {
            Some(s) => positive_seconds(s, "call_timeout_s")?,
            None => stream.stall_timeout,
        };
        let compression = compression_arg(compression)?;
        let source = source_arg(sql, pipeline, mixture)?;
        if servers.is_empty() {
            return Err(invalid_argument("servers= needs at least one URL"));
        }
        let options = LoaderOptions {
            batch_size,
            shuffle_buffer,
            seed,
            rank,
            world_size,
            partitions,
            epochs,
            drop_last,
            prefetch,
            workers,
            stream,
            compression,
            link: bandwidth_bytes_per_s.map_or_else(Link::auto, Link::bandwidth),
            connect,
            echo,
            report_every,
            push,
            cpu_affinity,
        };
        let loader = py
            .detach(|| open_loader(&servers, source, pack, bucket_by, options))
            .map_err(client_error)?;
        Ok(Self {
            inner: Arc::new(Mutex::new(loader)),
        })
    }

    /// The next batch as `[(name, kind, value)]`, or `None` at the end.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<Vec<PyColumn>>> {
        let inner = Arc::clone(&self.inner);
        let next = py.detach(move || inner.lock().next());
        let Some(batch) = next else { return Ok(None) };
        let batch = batch.map_err(client_error)?;
        // In the batch's column order; the Arrow columns' values filled in once they are one
        // record batch (the i-th "arrow" entry is its column i).
        let mut out = Vec::with_capacity(batch.columns.len());
        let mut arrow = Vec::new();
        for (name, column) in batch.columns {
            match column {
                Column::Tensor {
                    shape,
                    values,
                    bfloat16,
                } => {
                    let kind = if bfloat16 { "bfloat16" } else { "tensor" };
                    out.push((name, kind, tensor(py, values, &shape)?));
                }
                Column::Arrow(array) => {
                    arrow.push((name.clone(), array));
                    out.push((name, "arrow", py.None()));
                }
            }
        }
        if !arrow.is_empty() {
            let shared = Py::new(py, PyArrowBatch::new(arrow)?)?.into_any();
            for (_, kind, value) in &mut out {
                if *kind == "arrow" {
                    *value = shared.clone_ref(py);
                }
            }
        }
        Ok(Some(out))
    }

    /// The position to resume from, as bytes.
    fn state<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let state = self.inner.lock().state();
        PyBytes::new(py, &state.to_bytes())
    }

    /// Continues from a state, or from every rank's states merged (a packed loader's).
    fn restore(&self, states: Vec<Vec<u8>>) -> PyResult<()> {
        let states = states
            .iter()
            .map(|s| LoaderState::from_bytes(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(client_error)?;
        let state = LoaderState::merge(&states).map_err(client_error)?;
        self.inner.lock().restore(state).map_err(client_error)
    }

    /// Iterates `count` epochs from `first` (one `for` pass); `continuing`: from where the
    /// loader is, only the pass's end set. Planning a new epoch happens at its first batch.
    fn begin(&self, py: Python<'_>, first: u64, count: u64, continuing: bool) {
        let inner = Arc::clone(&self.inner);
        py.detach(move || {
            inner.lock().begin(first, count, continuing);
        });
    }

    /// `(epoch, batches of it given)`: where the next batch comes from.
    fn position(&self) -> (u64, u64) {
        self.inner.lock().position()
    }

    /// `(rows, batches)` per epoch for this rank.
    fn epoch_len(&self) -> (u64, u64) {
        self.inner.lock().epoch_len()
    }

    /// Batches and rows delivered, seconds waited for data and elapsed.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.lock().stats();
        let d = PyDict::new(py);
        d.set_item("batches", s.batches)?;
        d.set_item("rows", s.rows)?;
        d.set_item("waited_s", s.waited.as_secs_f64())?;
        d.set_item("elapsed_s", s.elapsed.as_secs_f64())?;
        d.set_item("wait_fraction", s.wait_fraction())?;
        d.set_item("distinct_rows", s.distinct_rows)?;
        d.set_item("echo", s.echo)?;
        d.set_item("peak_streams", s.peak_streams)?;
        d.set_item("bytes_received", s.bytes_received)?;
        d.set_item("epochs_ahead", s.epochs_ahead)?;
        Ok(d)
    }
}

/// `echo=` (with `echo_max=` for `"auto"`) as the loader's [`Echo`].
fn echo_mode(echo: EchoArg, echo_max: u32) -> PyResult<Echo> {
    match echo {
        EchoArg::Times(0) => Err(invalid_argument("echo= is a count ≥ 1 or \"auto\"")),
        EchoArg::Times(1) => Ok(Echo::Off),
        EchoArg::Times(k) => Ok(Echo::Fixed(k)),
        EchoArg::Name(name) if name == "auto" => Ok(Echo::Auto { max: echo_max.max(1) }),
        EchoArg::Name(name) => Err(invalid_argument(format!(
            "echo={name:?}: a count ≥ 1 or \"auto\""
        ))),
    }
}

/// `report_every_s=` as the interval of the wait reports.
fn report_interval(report_every_s: f64) -> PyResult<Option<std::time::Duration>> {
    // 0 turns the wait reports off.
    if report_every_s == 0.0 {
        return Ok(None);
    }
    std::time::Duration::try_from_secs_f64(report_every_s)
        .map(Some)
        .map_err(|_| invalid_argument("report_every_s must be a number of seconds ≥ 0"))
}

/// `token=` and `tls_*=` as connection options.
fn connect_options(
    token: Option<String>,
    tls_ca: Option<String>,
    tls_client_cert: Option<String>,
    tls_client_key: Option<String>,
) -> PyResult<ConnectOptions> {
    // Unset arguments fall back to PUSHDOWN_TOKEN / PUSHDOWN_TLS_* in the environment.
    let env = ConnectOptions::from_env().map_err(client_error)?;
    let mut connect = ConnectOptions::from_parts(
        token,
        tls_ca.as_deref(),
        tls_client_cert.as_deref(),
        tls_client_key.as_deref(),
    )
    .map_err(client_error)?;
    connect.token = connect.token.or(env.token);
    connect.tls_ca = connect.tls_ca.or(env.tls_ca);
    connect.tls_identity = connect.tls_identity.or(env.tls_identity);
    Ok(connect)
}

/// `concurrency=`, `stall_timeout_s=` and `max_retries=` as stream options.
fn stream_options(
    concurrency: Option<usize>,
    stall_timeout_s: f64,
    max_retries: usize,
) -> PyResult<StreamOptions> {
    let stall_timeout = positive_seconds(stall_timeout_s, "stall_timeout_s")?;
    Ok(StreamOptions {
        // Given: fixed; none: tuned from the default start.
        concurrency: concurrency.map_or(StreamOptions::default().concurrency, |c| c.max(1)),
        max_concurrency: concurrency.map_or(StreamOptions::default().max_concurrency, |c| c.max(1)),
        stall_timeout,
        max_retries,
        ..StreamOptions::default()
    })
}

/// `s` seconds, which must be positive (`name`: the argument).
fn positive_seconds(s: f64, name: &str) -> PyResult<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| invalid_argument(format!("{name} must be a positive number of seconds")))
}

/// One source of `mixture=`, as the Python wrapper passes it: `(sql, pipeline, weight,
/// servers)`.
type MixtureArg = (Option<String>, Option<String>, f64, Option<Vec<String>>);
/// `pack=` as `pushdown.Loader` passes it: `(column, length, eos_id, split_documents, pad_id)`.
type PackArg = (String, usize, Option<u32>, bool, Option<u32>);
/// `bucket_by=` as `pushdown.Loader` passes it: `(column, boundaries, pad_id)`.
type BucketArg = (String, Vec<u32>, u32);

/// What a loader reads: one source, or a mixture of them.
enum Source {
    One(LoaderSource),
    Mixture(Vec<MixtureSource>),
}

/// The loader `source`, `pack=` and `bucket_by=` ask for.
fn open_loader(
    servers: &[String],
    source: Source,
    pack: Option<PackArg>,
    bucket_by: Option<BucketArg>,
    options: LoaderOptions,
) -> pushdown_client::Result<Loader> {
    if let Some((column, boundaries, pad_id)) = bucket_by {
        let by = BucketBy {
            column,
            boundaries,
            pad_id,
        };
        return match (source, pack) {
            (Source::One(source), None) => Loader::bucketed(servers, source, by, options),
            (_, Some(_)) => Err(pushdown_client::ClientError::Invalid(
                "pack= and bucket_by= are two ways to batch sequences: give one".into(),
            )),
            (Source::Mixture(_), None) => Err(pushdown_client::ClientError::Invalid(
                "bucket_by= buckets one source's rows: a mixture cannot be bucketed yet".into(),
            )),
        };
    }
    let pack = pack.map(|(column, length, eos_id, split_documents, pad_id)| Pack {
        column,
        length,
        eos_id,
        split_documents,
        pad_id,
    });
    match (source, pack) {
        (Source::One(source), None) => Loader::new(servers, source, options),
        (Source::One(source), Some(pack)) => Loader::packed(servers, source, pack, options),
        (Source::Mixture(sources), None) => Loader::mixture(servers, sources, options),
        (Source::Mixture(_), Some(_)) => Err(pushdown_client::ClientError::Invalid(
            "pack= packs one source's documents: a mixture cannot be packed yet".into(),
        )),
    }
}

/// `compression=`: `auto` (`pushdown_protocol::choose_codec`'s choice, from the link and the
/// servers' profile) or a codec, forced.
fn compression_arg<C: std::str::FromStr<Err = String>>(compression: &str) -> PyResult<Option<C>> {
    match compression {
        "auto" => Ok(None),
        name => name
            .parse()
            .map(Some)
            .map_err(|e: String| invalid_argument(format!("{e}, or auto"))),
    }
}

/// `sql=`, `pipeline=` or `mixture=` (exactly one) as what the loader reads.
fn source_arg(
    sql: Option<String>,
    pipeline: Option<String>,
    mixture: Option<Vec<MixtureArg>>,
) -> PyResult<Source> {
    match mixture {
        None => Ok(Source::One(loader_source(sql, pipeline)?)),
        Some(_) if sql.is_some() || pipeline.is_some() => Err(invalid_argument(
            "give sql=, pipeline= or mixture=, not several: each mixture source names its own",
        )),
        Some(sources) => Ok(Source::Mixture(mixture_sources(sources)?)),
    }
}

/// `mixture=` as the loader's sources, each named in its error.
fn mixture_sources(sources: Vec<MixtureArg>) -> PyResult<Vec<MixtureSource>> {
    if sources.is_empty() {
        return Err(invalid_argument("mixture= needs at least one source"));
    }
    sources
        .into_iter()
        .enumerate()
        .map(|(i, (sql, pipeline, weight, servers))| {
            let source = loader_source(sql, pipeline)
                .map_err(|e| invalid_argument(format!("mixture source {i}: {e}")))?;
            Ok(MixtureSource {
                source,
                weight,
                servers,
            })
        })
        .collect()
}

/// `sql=` or `pipeline=` (exactly one) as what the loader reads.
fn loader_source(sql: Option<String>, pipeline: Option<String>) -> PyResult<LoaderSource> {
    match (sql, pipeline) {
        (Some(sql), None) => Ok(LoaderSource::Sql(sql)),
        (None, Some(text)) => Pipeline::parse(&text)
            .map(LoaderSource::Pipeline)
            .map_err(|e| invalid_argument(e.to_string())),
        _ => Err(invalid_argument("give exactly one of sql= or pipeline=")),
    }
}

fn tensor(py: Python<'_>, values: ArrayRef, shape: &[usize]) -> PyResult<Py<PyAny>> {
    match values.data_type() {
        DataType::UInt8 => typed::<UInt8Type>(py, values, shape),
        DataType::UInt16 => typed::<UInt16Type>(py, values, shape),
        DataType::UInt32 => typed::<UInt32Type>(py, values, shape),
        DataType::UInt64 => typed::<UInt64Type>(py, values, shape),
        DataType::Int8 => typed::<Int8Type>(py, values, shape),
        DataType::Int16 => typed::<Int16Type>(py, values, shape),
        DataType::Int32 => typed::<Int32Type>(py, values, shape),
        DataType::Int64 => typed::<Int64Type>(py, values, shape),
        DataType::Float16 => typed::<Float16Type>(py, values, shape),
        DataType::Float32 => typed::<Float32Type>(py, values, shape),
        DataType::Float64 => typed::<Float64Type>(py, values, shape),
        // `Column::is_tensor` sends every other type as Arrow.
        other => Err(invalid_argument(format!("{other} is not a tensor type"))),
    }
}

fn typed<T>(py: Python<'_>, values: ArrayRef, shape: &[usize]) -> PyResult<Py<PyAny>>
where
    T: ArrowPrimitiveType,
    T::Native: numpy::Element,
{
    let array = values.as_primitive::<T>().clone();
    drop(values);
    let (_, buffer, _) = array.into_parts();
    // Moves the allocation into numpy when this is its only owner; copies otherwise.
    let vec: Vec<T::Native> = match buffer.into_inner().into_vec::<T::Native>() {
        Ok(v) => v,
        Err(shared) => arrow::buffer::ScalarBuffer::<T::Native>::from(shared).to_vec(),
    };
    let array = PyArray1::from_vec(py, vec).reshape(shape.to_vec())?;
    Ok(array.into_any().unbind())
}

/// A batch's Arrow columns, handed to pyarrow (or any reader of the Arrow PyCapsule
/// protocol) through the C Data Interface: `pyarrow.record_batch(it)` takes its buffers
/// without copying them. It can be taken once.
#[pyclass(name = "_ArrowBatch", module = "pushdown._native")]
struct PyArrowBatch {
    batch: Mutex<Option<RecordBatch>>,
}

impl PyArrowBatch {
    fn new(columns: Vec<(String, ArrayRef)>) -> PyResult<Self> {
        let batch = RecordBatch::try_from_iter_with_nullable(
            columns.into_iter().map(|(name, array)| (name, array, true)),
        )
        .map_err(runtime_error)?;
        Ok(Self {
            batch: Mutex::new(Some(batch)),
        })
    }
}

#[pymethods]
impl PyArrowBatch {
    /// The Arrow PyCapsule protocol: `(schema, array)` capsules of a struct array whose
    /// fields are the columns. `requested_schema` is not supported (pyarrow asks for none).
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyCapsule>, Bound<'py, PyCapsule>)> {
        if requested_schema.is_some_and(|s| !s.is_none()) {
            return Err(invalid_argument("_ArrowBatch is exported in its own schema only"));
        }
        let batch = self
            .batch
            .lock()
            .take()
            .ok_or_else(|| runtime_error("this batch's Arrow columns were already taken"))?;
        let data = arrow::array::Array::into_data(arrow::array::StructArray::from(batch));
        let (array, schema) = arrow::ffi::to_ffi(&data).map_err(runtime_error)?;
        let schema = PyCapsule::new(py, schema, Some(c"arrow_schema".to_owned()))?;
        let array = PyCapsule::new(py, array, Some(c"arrow_array".to_owned()))?;
        Ok((schema, array))
    }
}

/// `batch` as an Arrow IPC stream (its schema and the one batch).
fn ipc_bytes(batch: &RecordBatch) -> PyResult<Vec<u8>> {
    let mut out = Vec::new();
    let mut writer =
        arrow::ipc::writer::StreamWriter::try_new(&mut out, &batch.schema()).map_err(runtime_error)?;
    writer.write(batch).map_err(runtime_error)?;
    writer.finish().map_err(runtime_error)?;
    drop(writer);
    Ok(out)
}

/// A pipeline's row-wise steps (its op calls and selects, deterministic and random) over
/// batches the caller reads itself. Use `pushdown.Transform`, which wraps it.
#[pyclass(name = "_Transform", module = "pushdown._native")]
struct PyTransform {
    steps: Vec<Step>,
    seed: u64,
    resources: Arc<dyn pushdown_ops::Resources>,
    /// Bound to the last batch's schema (bound again when a batch's differs).
    bound: Mutex<Option<(arrow::datatypes::SchemaRef, Arc<RowSteps>)>>,
}

#[pymethods]
impl PyTransform {
    #[new]
    #[pyo3(signature = (pipeline, seed=0, tokenizers=None))]
    fn new(pipeline: &str, seed: u64, tokenizers: Option<HashMap<String, Vec<u8>>>) -> PyResult<Self> {
        let pipeline = Pipeline::parse(pipeline).map_err(|e| invalid_argument(e.to_string()))?;
        // As on a server: the dataset's own tokenizer is the default.
        let mut resources = pushdown_ops::Tokenizers::new(Some(pipeline.dataset.clone()));
        for (name, json) in tokenizers.unwrap_or_default() {
            let tokenizer = pushdown_ops::load_tokenizer(&json)
                .map_err(|e| invalid_argument(format!("tokenizer {name}: {e}")))?;
            resources.insert(name, Arc::new(tokenizer));
        }
        let steps = pipeline
            .steps()
            .iter()
            .filter(|s| matches!(s, Step::Map(_) | Step::Select { .. }))
            .cloned()
            .collect();
        Ok(Self {
            steps,
            seed,
            resources: Arc::new(resources),
            bound: Mutex::new(None),
        })
    }

    /// The pipeline's filters, as SQL: the reader's to apply.
    #[staticmethod]
    fn filters(pipeline: &str) -> PyResult<Vec<String>> {
        let pipeline = Pipeline::parse(pipeline).map_err(|e| invalid_argument(e.to_string()))?;
        Ok(pipeline
            .steps()
            .iter()
            .filter_map(|s| match s {
                Step::Filter { expr } => Some(expr.clone()),
                _ => None,
            })
            .collect())
    }

    /// Applies the steps to the one batch of an Arrow IPC stream; returns the result as one.
    /// `key` seeds the random ops (with the transform's seed): the same batch and key give
    /// the same output.
    fn apply<'py>(&self, py: Python<'py>, ipc: &[u8], key: u64) -> PyResult<Bound<'py, PyBytes>> {
        let out = py.detach(|| -> PyResult<Vec<u8>> {
            let mut reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(ipc), None)
                .map_err(|e| invalid_argument(format!("not an Arrow IPC stream: {e}")))?;
            let batch = reader
                .next()
                .ok_or_else(|| invalid_argument("the Arrow IPC stream holds no batch"))?
                .map_err(|e| invalid_argument(format!("reading the batch: {e}")))?;
            let steps = {
                let mut bound = self.bound.lock();
                match &*bound {
                    Some((schema, steps)) if *schema == batch.schema() => Arc::clone(steps),
                    _ => {
                        let steps = Arc::new(
                            RowSteps::new(
                                &self.steps,
                                batch.schema(),
                                self.seed,
                                Arc::clone(&self.resources),
                            )
                            .map_err(|e| invalid_argument(e.to_string()))?,
                        );
                        *bound = Some((batch.schema(), Arc::clone(&steps)));
                        steps
                    }
                }
            };
            let out = steps
                .apply(batch, key)
                .map_err(|e| invalid_argument(e.to_string()))?;
            ipc_bytes(&out)
        })?;
        Ok(PyBytes::new(py, &out))
    }
}

/// A plan for readers that stream the shards themselves (`pushdown.ray`): `sql` or
/// `pipeline`, narrowed to `columns` and `predicate` (SQL over the output's columns),
/// planned on every server; the serialized `FlightInfo` (pyarrow:
/// `flight.FlightInfo.deserialize`), one endpoint per shard with the locations holding it.
#[pyfunction]
#[pyo3(signature = (
    servers, sql=None, pipeline=None, columns=None, predicate=None, compression="auto",
    call_timeout_s=30.0, token=None, tls_ca=None, tls_client_cert=None, tls_client_key=None
))]
#[expect(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn plan_read<'py>(
    py: Python<'py>,
    servers: Vec<String>,
    sql: Option<String>,
    pipeline: Option<String>,
    columns: Option<Vec<String>>,
    predicate: Option<String>,
    compression: &str,
    call_timeout_s: f64,
    token: Option<String>,
    tls_ca: Option<String>,
    tls_client_cert: Option<String>,
    tls_client_key: Option<String>,
) -> PyResult<Bound<'py, PyBytes>> {
    if servers.is_empty() {
        return Err(invalid_argument("servers= needs at least one URL"));
    }
    let source = loader_source(sql, pipeline)?;
    let compression = compression_arg(compression)?;
    let mut connect = connect_options(token, tls_ca, tls_client_cert, tls_client_key)?;
    connect.call_timeout = positive_seconds(call_timeout_s, "call_timeout_s")?;
    let narrowing = Narrowing { columns, predicate };
    let info = py
        .detach(|| plan_for_readers_blocking(&servers, connect, &source, &narrowing, compression))
        .map_err(client_error)?;
    Ok(PyBytes::new(py, &prost::Message::encode_to_vec(&info)))
}

/// `pushdown_protocol::choose_codec`, the one function that chooses a stream's codec, for
/// tests that check every path takes its answer: `link` is `local`, `unknown` or a given
/// bandwidth (`1Gbit`, `125MB`); `forced` a codec; `profiled` what a profile said (`none`,
/// `link_bound`, `not_link_bound`, or `measured:<codec>`).
#[pyfunction]
#[pyo3(signature = (link, forced=None, profiled="none"))]
fn choose_codec(link: &str, forced: Option<&str>, profiled: &str) -> PyResult<String> {
    use pushdown_protocol::{CodecInputs, Compression, LinkKnown, Profiled};
    let link = match link {
        "local" => LinkKnown::Local,
        "unknown" => LinkKnown::Unknown,
        given => LinkKnown::Given(pushdown_planner::parse_bandwidth(given).map_err(invalid_argument)?),
    };
    let codec = |name: &str| {
        name.parse::<Compression>()
            .map_err(|e| invalid_argument(format!("compression: {e}")))
    };
    let profiled = match profiled {
        "none" => Profiled::No,
        "link_bound" => Profiled::LinkBound(true),
        "not_link_bound" => Profiled::LinkBound(false),
        other => match other.strip_prefix("measured:") {
            Some(name) => Profiled::Measured(codec(name)?),
            None => return Err(invalid_argument(format!("profiled: unknown `{other}`"))),
        },
    };
    let forced = forced.map(codec).transpose()?;
    let inputs = CodecInputs {
        forced,
        link,
        profiled,
    };
    Ok(pushdown_protocol::choose_codec(inputs).to_string())
}

/// The `pushdown` command line (`serve`, `gen`, `run`, `explain`, `demo`, `scaling`): the
/// same command as the `pushdown` binary, run in this process without the interpreter's lock.
/// `argv` is the whole command line, the program's name first. Returns the exit status.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<std::ffi::OsString>) -> u8 {
    py.detach(move || pushdown_cli::command::main(argv))
}

/// `pushdown.imports`: imports `inputs` of `kind` into the dataset folder `out` as `split`,
/// without the interpreter's lock; returns the summary as JSON.
#[pyfunction]
#[pyo3(signature = (kind, inputs, out, split = "train".to_owned(), progress = false))]
fn import_dataset(
    py: Python<'_>,
    kind: &str,
    inputs: Vec<std::path::PathBuf>,
    out: std::path::PathBuf,
    split: String,
    progress: bool,
) -> PyResult<String> {
    let kind: pushdown_import::Kind = kind.parse().map_err(pyo3::exceptions::PyValueError::new_err)?;
    let mut options = pushdown_import::ImportOptions::new(kind, inputs, out);
    options.split = split;
    options.progress = progress;
    let summary = py
        .detach(|| pushdown_import::import(&options))
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(format!("{e:#}")))?;
    serde_json::to_string(&summary).map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(import_dataset, m)?)?;
    m.add_class::<PyLoader>()?;
    m.add_class::<PyTransform>()?;
    m.add_class::<PyArrowBatch>()?;
    m.add_function(wrap_pyfunction!(plan_read, m)?)?;
    m.add_function(wrap_pyfunction!(choose_codec, m)?)?;
    // Benchmarks refuse a debug build: its kernels are several times slower.
    m.add(
        "BUILD_PROFILE",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    )?;
    Ok(())
}
