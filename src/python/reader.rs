//! `eagle_io._native.Reader`: random access into a dataset. The Python wrapper
//! (`eagle_io.store.reader.Dataset`) allocates the output tensors and passes their buffers.

use std::path::PathBuf;

use pyo3::prelude::*;

use super::args::{unsigned, unsigned_opt};
use super::blocking::blocking;
use super::buffers::{Borrowed, WriteProbe};
use super::values::{json_to_py, schema_tuples, PyTensorSpec};
use crate::dataset::{Dataset, ReadOptions};
use crate::error::Error;
use crate::storage::{CacheOptions, DEFAULT_CACHE_BYTES};

/// One problem found by `verify`: shard path, sample id (None: whole shard), offset, message.
/// Paths go to Python as `str`: a `pathlib.Path` would fold an object URL's `s3://` to `s3:/`.
type PyBadRecord = (String, Option<u64>, u64, String);

#[pyclass(module = "eagle_io._native", frozen)]
pub struct Reader {
    inner: Dataset,
}

#[pymethods]
impl Reader {
    /// Opens the dataset at `path` (a manifest file or a directory holding `manifest.json`)
    /// from its manifest and shard indexes alone, decoding on `threads` (None or 0: one per
    /// CPU). `in_flight`, `coalesce_gap` and `part_bytes` set how a batch's records are fetched
    /// from object storage (None: `DEFAULTS`); `cache_dir` keeps local copies of the shard
    /// objects, at most `cache_bytes` (None: `DEFAULTS`) in all.
    /// Raises `InvalidArgumentError` naming a negative or too large count.
    #[new]
    #[pyo3(signature = (path, threads = None, in_flight = None, coalesce_gap = None, part_bytes = None, cache_dir = None, cache_bytes = None))]
    #[allow(clippy::too_many_arguments)] // the keyword arguments of the Python constructor
    fn new(
        py: Python<'_>,
        path: PathBuf,
        threads: Option<&Bound<'_, PyAny>>,
        in_flight: Option<&Bound<'_, PyAny>>,
        coalesce_gap: Option<&Bound<'_, PyAny>>,
        part_bytes: Option<&Bound<'_, PyAny>>,
        cache_dir: Option<PathBuf>,
        cache_bytes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Reader> {
        let in_flight: Option<usize> = unsigned_opt(in_flight, "in_flight")?;
        let coalesce_gap: Option<u64> = unsigned_opt(coalesce_gap, "coalesce_gap")?;
        let part_bytes: Option<u64> = unsigned_opt(part_bytes, "part_bytes")?;
        let cache_bytes: Option<u64> = unsigned_opt(cache_bytes, "cache_bytes")?;
        let mut options = ReadOptions {
            threads: unsigned_opt(threads, "threads")?.unwrap_or(0),
            ..ReadOptions::default()
        };
        let fetch = &mut options.fetch;
        fetch.in_flight = in_flight.unwrap_or(fetch.in_flight);
        fetch.coalesce_gap = coalesce_gap.unwrap_or(fetch.coalesce_gap);
        fetch.part_bytes = part_bytes.unwrap_or(fetch.part_bytes);
        options.cache = cache_dir.map(|dir| CacheOptions {
            dir,
            max_bytes: cache_bytes.unwrap_or(DEFAULT_CACHE_BYTES),
        });
        let inner = blocking(py, |_| Dataset::open_with(&path, &options))?;
        Ok(Reader { inner })
    }

    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    /// `(sample_id, n_tokens, key)` of the sample at position `pos`.
    fn entry(&self, pos: &Bound<'_, PyAny>) -> PyResult<(u64, u64, String)> {
        let e = self.inner.entry(unsigned(pos, "pos")?)?;
        Ok((e.sample_id, e.n_tokens, e.key.to_owned()))
    }

    /// Position of `sample_id`, or `None`.
    fn position(&self, sample_id: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        Ok(self.inner.position(unsigned(sample_id, "sample_id")?))
    }

    /// Token counts of all samples, in position order.
    fn lengths(&self) -> PyResult<Vec<u64>> {
        let lengths: Result<Vec<u64>, Error> = (0..self.inner.len())
            .map(|p| self.inner.entry(p).map(|e| e.n_tokens))
            .collect();
        Ok(lengths?)
    }

    /// Decodes the sample at `pos` into `outs` (one writable C-contiguous buffer per schema
    /// tensor, each exactly `n_tokens x row_bytes`), FP8 tensors dequantised, with the GIL released.
    fn read_into(&self, py: Python<'_>, pos: &Bound<'_, PyAny>, outs: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        self.read(py, unsigned(pos, "pos")?, outs, true)
    }

    /// As `read_into`, but FP8 tensors stay as stored: `n_tokens x stored_row_bytes` (per row,
    /// the f32 scales then the FP8 bytes).
    fn read_stored_into(&self, py: Python<'_>, pos: &Bound<'_, PyAny>, outs: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        self.read(py, unsigned(pos, "pos")?, outs, false)
    }

    /// Decodes several samples in one call with the GIL released, on the reader's threads:
    /// `items` is `[(pos, outs)]`, each as for `read_into`; the buffers of different items must
    /// not overlap. Raises the error of the first failing item (a `CorruptRecordError` names its
    /// sample id, file and offset); the other items are decoded all the same.
    fn read_batch(&self, py: Python<'_>, items: Vec<(Bound<'_, PyAny>, Vec<Bound<'_, PyAny>>)>) -> PyResult<()> {
        let probe = write_probe()?;
        let mut held = Vec::with_capacity(items.len());
        for (pos, outs) in &items {
            let pos: u64 = unsigned(pos, "pos")?;
            held.push((pos, self.borrow_outputs(outs, &probe)?));
        }
        check_disjoint(held.iter().flat_map(|(_, bufs)| bufs.iter()))?;
        let mut batch: Vec<(u64, Vec<&mut [u8]>)> = held
            .iter_mut()
            .map(|(pos, bufs)| (*pos, bufs.iter_mut().map(Borrowed::bytes_mut).collect()))
            .collect();
        let inner = &self.inner;
        blocking(py, |_| inner.read_batch(&mut batch))
    }

    /// Reads one tensor, `name`, of several samples with the GIL released, on the reader's
    /// threads: `items` is `[(pos, out)]`, `out` one writable C-contiguous buffer of exactly
    /// `n_tokens x row_bytes` of that tensor (FP8 dequantised). Each record is read whole and
    /// checksummed (the CRC covers the record); only `name` is decoded. Returns one entry per
    /// item: None, or that item's error (a `CorruptRecordError` names its sample id, file and
    /// offset), returned, not raised. Raises `InvalidArgumentError` for a tensor the schema
    /// lacks or buffers that overlap.
    fn read_tensor(
        &self,
        py: Python<'_>,
        name: &str,
        items: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)>,
    ) -> PyResult<Vec<Option<Py<pyo3::exceptions::PyBaseException>>>> {
        let probe = write_probe()?;
        let mut held = Vec::with_capacity(items.len());
        for (pos, out) in &items {
            let pos: u64 = unsigned(pos, "pos")?;
            held.push((pos, Borrowed::get_writable(out, name, &probe)?));
        }
        check_disjoint(held.iter().map(|(_, b)| b))?;
        let mut batch: Vec<(u64, &mut [u8])> = held.iter_mut().map(|(pos, b)| (*pos, b.bytes_mut())).collect();
        let inner = &self.inner;
        let results = blocking(py, |_| inner.read_tensor_batch(name, &mut batch))?;
        Ok(results
            .into_iter()
            .map(|r| r.err().map(|e| PyErr::from(e).into_value(py)))
            .collect())
    }

    /// The manifest (FORMAT.md 2) as the dict `json.loads` makes of its file, without `checksum`;
    /// built from the opened manifest on each call (the Python wrapper calls it once per open).
    fn manifest<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let value = serde_json::to_value(self.inner.manifest()).expect("a manifest always serialises");
        json_to_py(py, &value)
    }

    /// The schema's tensors, in order: `[(name, dtype, width, precision, scale_block)]`.
    fn schema(&self) -> Vec<PyTensorSpec> {
        schema_tuples(self.inner.schema())
    }

    /// The prefix records (docs/FORMAT.md 4.7), in manifest order: `[(prefix_id, n_tokens,
    /// "sha256:<hex>", prefix shard file)]`.
    fn prefix_records(&self) -> Vec<(u64, u64, String, String)> {
        self.inner.prefix_records()
    }

    #[getter]
    fn manifest_path(&self) -> String {
        self.inner.manifest_path().to_string_lossy().into_owned()
    }

    /// Full check of the dataset at `path` on `threads` (None or 0: one per CPU):
    /// `[(shard_path, sample_id or None, offset, error)]`, empty when every record reads,
    /// checksums and decodes.
    #[staticmethod]
    #[pyo3(signature = (path, threads = None))]
    fn verify(py: Python<'_>, path: PathBuf, threads: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<PyBadRecord>> {
        let threads: usize = unsigned_opt(threads, "threads")?.unwrap_or(0);
        let bad = blocking(py, |_| Dataset::verify(&path, threads))?;
        Ok(bad
            .into_iter()
            .map(|b| (b.shard.to_string_lossy().into_owned(), b.sample_id, b.offset, b.error))
            .collect())
    }
}

impl Reader {
    /// Decodes the sample at `pos` into `outs` with the GIL released; FP8 tensors dequantised or as stored.
    /// Borrows one writable output buffer per schema tensor (an error names the tensor).
    fn borrow_outputs(&self, outs: &[Bound<'_, PyAny>], probe: &WriteProbe) -> Result<Vec<Borrowed>, Error> {
        let schema = self.inner.schema();
        outs.iter()
            .enumerate()
            .map(|(i, o)| {
                let name = schema.tensors.get(i).map_or("output", |t| t.name.as_str());
                Borrowed::get_writable(o, name, probe)
            })
            .collect()
    }

    fn read(&self, py: Python<'_>, pos: u64, outs: Vec<Bound<'_, PyAny>>, dequantize: bool) -> PyResult<()> {
        let probe = write_probe()?;
        let mut bufs = self.borrow_outputs(&outs, &probe)?;
        check_disjoint(bufs.iter())?;
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(Borrowed::bytes_mut).collect();
        let inner = &self.inner;
        blocking(py, |_| match dequantize {
            true => inner.read_into(pos, &mut slices),
            false => inner.read_stored_into(pos, &mut slices),
        })
    }
}

/// The probe of one call's output buffers (`Borrowed::get_writable`).
fn write_probe() -> Result<WriteProbe, Error> {
    WriteProbe::new().map_err(|e| Error::io("<write probe pipe>", e))
}

/// Refuses output buffers that share memory: decoding into them would be aliased writes (one
/// tensor's rows overwriting another's).
fn check_disjoint<'a>(bufs: impl Iterator<Item = &'a Borrowed>) -> crate::error::Result<()> {
    let mut spans: Vec<(usize, usize)> = bufs
        .map(|b| (b.bytes().as_ptr() as usize, b.len()))
        .filter(|&(_, len)| len > 0)
        .collect();
    spans.sort_unstable();
    if spans.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
        return Err(Error::InvalidArgument(
            "output buffers overlap (each tensor, and each row of a batch, must be its own memory)".into(),
        ));
    }
    Ok(())
}
