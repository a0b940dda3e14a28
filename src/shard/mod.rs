//! One shard file: building it (append records, then commit atomically) and opening it
//! (header, schema and index validated; records read and checksummed on demand).

mod builder;
mod file;

pub use builder::{ShardBuilder, ShardSummary};
pub use file::{ShardFile, MAX_EXPANSION};
