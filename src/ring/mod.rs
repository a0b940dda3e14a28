//! The capture ring: a fixed arena of page-aligned host memory between the target's forward
//! (producer) and the shard writer (consumer). The producer reserves a slot, copies a
//! sample's tensors into it (on GPU: an asynchronous device-to-host copy) and commits it;
//! the sink thread (`sink.rs`) encodes committed slots in order and releases them. When the
//! arena is full the producer blocks up to a timeout, or drops the sample and counts it.

mod arena;
mod sink;
mod slots;

pub use arena::Arena;
pub use sink::{CaptureSink, SinkStats};
pub use slots::{Reserved, Ring, RingStats, SharedPrefix};

/// Default arena size: room for many prefill batches of a 7B-70B target's states, small enough to pin
/// on every DP rank of a node.
pub const DEFAULT_RING_BYTES: usize = 256 << 20;
/// Default number of committed samples the sink thread hands the writer's encode pool at once.
pub const DEFAULT_RING_BATCH: usize = 16;
/// Default time a producer waits on a full ring before `Error::Timeout` (seconds).
pub const DEFAULT_RESERVE_TIMEOUT_S: f64 = 600.0;
/// Default full-ring policy: wait (up to the timeout), do not drop the sample (`Ring::reserve`'s `drop_when_full`).
pub const DEFAULT_DROP_WHEN_FULL: bool = false;
