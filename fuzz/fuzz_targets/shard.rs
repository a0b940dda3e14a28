#![no_main]
//! cargo-fuzz target: `harness::shard_bytes` (see fuzz/harness.rs for the properties checked).

#[path = "../harness.rs"]
mod harness;

#[global_allocator]
static ALLOC: harness::CountingAlloc = harness::CountingAlloc;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::shard_bytes(data));
