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
pub use slots::{Reserved, Ring, RingStats};
