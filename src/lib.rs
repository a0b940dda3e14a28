//! eagle-io's core: the chunk codec, the shard format, and the dataset writer and reader
//! for EAGLE-3 draft training data. No PyO3 here: the Python bindings live in `python/`
//! behind the `python` feature and only translate types.

pub mod codec;
pub mod dataset;
pub mod dtype;
pub mod error;
pub mod format;
pub mod interrupt;
pub mod layout;
pub mod pool;
pub mod quant;
pub mod ring;
pub mod schema;
pub mod shard;
pub mod storage;

pub use dataset::{Dataset, DatasetWriter, SampleRef, WriterOptions};
pub use dtype::DType;
pub use error::{Error, Result};
pub use schema::{Schema, TensorSpec};

#[cfg(feature = "python")]
mod python;
