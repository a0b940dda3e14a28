//! A dataset: a directory of committed shards listed by a JSON manifest that is rewritten
//! atomically after every shard commit.

mod decode;
mod manifest;
mod options;
mod prefix;
mod reader;
mod resume;
mod writer;

pub use manifest::{seal as seal_manifest, Manifest, MANIFEST_FORMAT, UNSEALED_CHECKSUM};
pub use options::{ReadOptions, WriterOptions};
pub use reader::{BadRecord, Dataset, Entry};
pub use writer::{DatasetWriter, SampleRef, StatsHandle, WriterStats, PREFIX_IDS_PER_RANK};
