//! `eagle_io._native.Writer`: the dataset writer. The Python wrapper
//! (`eagle_io.store.writer.ShardWriter`) turns tensors into `(dtype, shape, buffer)` triples.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::args::{unsigned, unsigned_opt};
use super::blocking::blocking;
use super::buffers::Borrowed;
use super::manifest::manifest_to_py;
use super::values::{py_to_json, schema_of, PyTensorSpecIn};
use crate::codec::CodecOptions;
use crate::dataset::{DatasetWriter, SampleRef, WriterOptions, WriterStats};
use crate::error::Error;
use crate::format::record::prefix_key;
use crate::schema::Schema;

/// One tensor as handed over by Python: dtype name, shape, buffer.
type PyTensor<'py> = (String, Vec<u64>, Bound<'py, PyAny>);
/// One sample: id, key, tensors in schema order.
type PySample<'py> = (u64, String, Vec<PyTensor<'py>>);

#[pyclass(module = "eagle_io._native")]
pub struct Writer {
    /// `None` once handed to a capture sink (`CaptureSink(writer, ...)`), which then owns it.
    inner: Option<DatasetWriter>,
}

impl Writer {
    fn get(&mut self) -> Result<&mut DatasetWriter, Error> {
        self.inner
            .as_mut()
            .ok_or_else(|| Error::InvalidArgument("this writer was handed to a capture sink; use the sink".into()))
    }

    /// Moves the writer out (for a capture sink).
    pub fn take(&mut self) -> Result<DatasetWriter, Error> {
        self.get()?;
        Ok(self.inner.take().expect("checked above"))
    }
}

fn borrow_sample(schema: &Schema, (sample_id, _, tensors): &PySample<'_>) -> Result<(u64, Vec<Borrowed>), Error> {
    let sample_id = *sample_id;
    let err = |message: String| Error::Schema { sample_id, message };
    if tensors.len() != schema.tensors.len() {
        return Err(err(format!(
            "{} tensors given, the schema has {}",
            tensors.len(),
            schema.tensors.len()
        )));
    }
    let n_tokens = tensors[0].1.first().copied().unwrap_or(0);
    let mut out = Vec::with_capacity(tensors.len());
    for (spec, (dtype, shape, obj)) in schema.tensors.iter().zip(tensors) {
        if dtype != spec.dtype.name() {
            return Err(err(format!(
                "tensor {:?} has dtype {dtype}, the schema says {}",
                spec.name,
                spec.dtype.name()
            )));
        }
        let expected: Vec<u64> = match spec.width {
            None => vec![n_tokens],
            Some(w) => vec![n_tokens, w],
        };
        if *shape != expected {
            return Err(err(format!(
                "tensor {:?} has shape {shape:?}, expected {expected:?} ({n_tokens} tokens, as the first tensor {:?})",
                spec.name, schema.tensors[0].name
            )));
        }
        let buf = Borrowed::get(obj, &spec.name).map_err(|e| err(e.to_string()))?;
        out.push(buf);
    }
    Ok((n_tokens, out))
}

#[pymethods]
impl Writer {
    #[new]
    #[pyo3(signature = (root, schema, metadata, *, shard_bytes, chunk_bytes, threads, zstd_level, queue_depth, shard_prefix, manifest_name, resume, uploaded_to=None, rank=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        root: PathBuf,
        schema: Vec<PyTensorSpecIn>,
        metadata: &Bound<'_, PyAny>,
        shard_bytes: &Bound<'_, PyAny>,
        chunk_bytes: &Bound<'_, PyAny>,
        threads: &Bound<'_, PyAny>,
        zstd_level: i32,
        queue_depth: &Bound<'_, PyAny>,
        shard_prefix: String,
        manifest_name: String,
        resume: bool,
        uploaded_to: Option<PathBuf>,
        rank: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Writer> {
        let rank: u64 = unsigned_opt(rank, "rank")?.unwrap_or(0);
        let shard_bytes: u64 = unsigned(shard_bytes, "shard_bytes")?;
        let chunk_bytes: u64 = unsigned(chunk_bytes, "chunk_bytes")?;
        let threads: usize = unsigned(threads, "threads")?;
        let queue_depth: usize = unsigned(queue_depth, "queue_depth")?;
        let schema = schema_of(schema).map_err(|e| Error::InvalidArgument(format!("schema: {e}")))?;
        let metadata =
            py_to_json(metadata).map_err(|e| Error::InvalidArgument(format!("metadata is not JSON: {e}")))?;
        let opts = WriterOptions {
            shard_bytes,
            chunk_bytes,
            threads,
            codec: CodecOptions { zstd_level },
            queue_depth,
            shard_prefix,
            rank,
            manifest_name,
            resume,
            uploaded_to,
        };
        let inner = blocking(py, |_| DatasetWriter::create(&root, schema, metadata, opts))?;
        Ok(Writer { inner: Some(inner) })
    }

    /// Validates, encodes and queues samples `[(sample_id, key, [(dtype, shape, buffer)])]`
    /// with the GIL released. Nothing is written when any sample is invalid. `prefixes`, one per
    /// sample when given: the id of a prefix record (`write_prefix`) whose tokens precede the
    /// sample's given rows, or None. `shared`, one per sample when given: how many of the whole
    /// sample's first tokens are a prefix other samples share, stored once (0: none; the writer
    /// numbers its prefix records, `DatasetWriter::write_batch_sharing`).
    #[pyo3(signature = (samples, prefixes = None, shared = None))]
    fn write_batch(
        &mut self,
        py: Python<'_>,
        samples: Vec<PySample<'_>>,
        prefixes: Option<Vec<Option<u64>>>,
        shared: Option<Vec<u64>>,
    ) -> PyResult<()> {
        let inner = self.get()?;
        let schema = inner.schema().clone();
        let shared = shared.unwrap_or_else(|| vec![0; samples.len()]);
        let prefixes = prefixes.unwrap_or_else(|| vec![None; samples.len()]);
        if prefixes.len() != samples.len() {
            return Err(Error::InvalidArgument(format!(
                "{} prefixes given for {} samples",
                prefixes.len(),
                samples.len()
            ))
            .into());
        }
        let borrowed = samples
            .iter()
            .map(|s| borrow_sample(&schema, s))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<SampleRef<'_>> = samples
            .iter()
            .zip(&borrowed)
            .zip(prefixes)
            .map(|(((sample_id, key, _), (n_tokens, bufs)), prefix)| SampleRef {
                sample_id: *sample_id,
                key,
                n_tokens: *n_tokens,
                tensors: bufs.iter().map(Borrowed::bytes).collect(),
                prequantised: None,
                prefix,
            })
            .collect();
        blocking(py, |_| inner.write_batch_sharing(&refs, &shared))
    }

    /// Stores the prefix record `(prefix_id, _, [(dtype, shape, buffer)])` once (docs/FORMAT.md
    /// 4.7) and returns `(prefix_id, n_tokens, "sha256:<hex>")`, the hex digest of its input_ids.
    fn write_prefix(&mut self, py: Python<'_>, prefix: PySample<'_>) -> PyResult<(u64, u64, String)> {
        let inner = self.get()?;
        let schema = inner.schema().clone();
        let (n_tokens, bufs) = borrow_sample(&schema, &prefix)?;
        let sample = SampleRef {
            sample_id: prefix.0,
            key: "",
            n_tokens,
            tensors: bufs.iter().map(Borrowed::bytes).collect(),
            prequantised: None,
            prefix: None,
        };
        let p = blocking(py, |_| inner.write_prefix(&sample))?;
        Ok((p.id, p.n_tokens, prefix_key(&p.digest)))
    }

    /// The prefix records written or found on resume: `{"sha256:<hex>": (prefix_id, n_tokens)}`.
    fn prefixes(&mut self) -> PyResult<std::collections::HashMap<String, (u64, u64)>> {
        Ok(self
            .get()?
            .prefixes()
            .values()
            .map(|p| (prefix_key(&p.digest), (p.id, p.n_tokens)))
            .collect())
    }

    /// True when `sample_id` is committed or queued (including samples found on resume); False
    /// for an int outside the ids' range `[0, 2**64)`.
    fn __contains__(&self, sample_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        match unsigned::<u64>(sample_id, "sample_id") {
            Ok(id) => Ok(self.inner.as_ref().is_some_and(|w| w.contains(id))),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyTypeError>(sample_id.py()) => Err(e),
            Err(_) => Ok(false), // an int outside [0, 2**64) is no sample id
        }
    }

    /// Sorted ids of every sample committed or queued (including samples found on resume).
    fn sample_ids(&mut self) -> PyResult<Vec<u64>> {
        Ok(self.get()?.sample_ids())
    }

    /// Counters as a dict (see `WriterStats`).
    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let s = self.get()?.stats();
        stats_dict(py, &s)
    }

    /// Commits the last shard and returns the final manifest (a dict); with `complete=False` the
    /// manifest stays marked incomplete (an interrupted capture).
    #[pyo3(signature = (complete = true))]
    fn close<'py>(&mut self, py: Python<'py>, complete: bool) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.get()?;
        let manifest = blocking(py, |_| {
            if complete {
                inner.close()
            } else {
                inner.close_incomplete()
            }
        })?;
        manifest_to_py(py, &manifest)
    }
}

/// Writer counters as a dict (keys as the `WriterStats` fields).
pub fn stats_dict<'py>(py: Python<'py>, s: &WriterStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("samples", s.samples)?;
    d.set_item("tokens", s.tokens)?;
    d.set_item("raw_bytes", s.raw_bytes)?;
    d.set_item("stored_bytes", s.stored_bytes)?;
    d.set_item("shards_committed", s.shards_committed)?;
    d.set_item("encode_seconds", s.encode_seconds)?;
    d.set_item("blocked_seconds", s.blocked_seconds)?;
    d.set_item("elapsed_seconds", s.elapsed_seconds)?;
    d.set_item("removed_temp_files", s.removed_temp_files)?;
    d.set_item("adopted_shards", s.adopted_shards)?;
    d.set_item("fp8_values", s.fp8_values)?;
    d.set_item("fp8_clamped", s.fp8_clamped)?;
    d.set_item("fp8_zero_blocks", s.fp8_zero_blocks)?;
    Ok(d)
}
