//! Fuzzing the shard, index, record, chunk and manifest parsers with proptest (a short run is part
//! of `cargo test`). The properties live in `fuzz/harness.rs`, shared with the coverage-guided
//! cargo-fuzz targets in `fuzz/` (the long run; docs/RELIABILITY.md).
//!
//! `EAGLE_IO_FUZZ_CASES=N` sets the cases per property (default 160); a failing case is shrunk
//! and printed by proptest, and can be replayed through the matching cargo-fuzz target.
//!
//! The properties share one global allocation counter, so they run one at a time (a mutex).

#[path = "../fuzz/harness.rs"]
mod harness;

use std::sync::Mutex;

use proptest::prelude::*;

#[global_allocator]
static ALLOC: harness::CountingAlloc = harness::CountingAlloc;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn cases() -> u32 {
    std::env::var("EAGLE_IO_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(160)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn serial<T>(f: impl FnOnce() -> T) -> T {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    f()
}

/// Bytes biased towards what parsers compare against: magics, small and huge integers.
fn nasty_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    let word = prop_oneof![
        any::<u8>().prop_map(|b| vec![b]),
        Just(b"EAGLEIO\0".to_vec()),
        Just(b"EIOINDX\0".to_vec()),
        Just(b"EREC".to_vec()),
        Just(vec![1, 0, 0, 0]),
        Just(vec![0xFF; 8]),
        Just(vec![0; 8]),
        any::<u32>().prop_map(|v| v.to_le_bytes().to_vec()),
        any::<u64>().prop_map(|v| v.to_le_bytes().to_vec()),
    ];
    prop::collection::vec(word, 0..max).prop_map(|ws| ws.concat())
}

#[test]
fn the_valid_shard_passes_every_property() {
    serial(|| {
        let o = harness::original();
        assert_eq!(
            harness::valid_shard_reads(),
            o.order.len(),
            "the harness reaches every record's read"
        );
        harness::mutated_manifest(&[]);
    });
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_as_a_shard(data in nasty_bytes(200)) {
        serial(|| harness::shard_bytes(&data));
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_header(data in nasty_bytes(120)) {
        serial(|| harness::shard_after_header(&data));
    }

    #[test]
    fn randomly_corrupted_shards(data in prop::collection::vec(any::<u8>(), 0..40)) {
        serial(|| harness::mutated_shard(&data));
    }

    #[test]
    fn arbitrary_records(data in nasty_bytes(120)) {
        serial(|| harness::record_bytes(&data));
    }

    #[test]
    fn arbitrary_chunks(desc in prop::collection::vec(prop_oneof![Just(0u8), Just(1), Just(2), Just(4), any::<u8>()], 24),
                        out_len in 0u16..2048, payload in prop::collection::vec(any::<u8>(), 0..600)) {
        let mut data = desc;
        data.extend_from_slice(&out_len.to_le_bytes());
        data.extend_from_slice(&payload);
        serial(|| harness::chunk_bytes(&data));
    }

    #[test]
    fn mutated_v2_chunks(rows in 1usize..60, width in 1usize..200, seed in any::<u64>(),
                         flips in prop::collection::vec((any::<u16>(), any::<u8>()), 1..4)) {
        // A valid format-v2 bf16 chunk (layout 2: exponent plane + sign/mantissa plane), then a few bytes changed
        // in its descriptor or payload: the chunk parser must refuse or decode, never panic or over-allocate.
        let mut x = seed | 1;
        let data: Vec<u8> = (0..rows * width)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (0x3C00u16 | (x as u16 & 0x83FF)).to_le_bytes()
            })
            .collect();
        let enc = eagle_io::codec::encode_chunk(&data, rows as u32, eagle_io::DType::Bfloat16, &Default::default());
        prop_assert_eq!(enc.desc.layout, 2);
        let mut bytes = enc.desc.to_bytes().to_vec();
        bytes.extend_from_slice(&(data.len() as u16).to_le_bytes());
        bytes.extend_from_slice(&enc.payload);
        for (at, v) in flips {
            let at = at as usize % bytes.len();
            if at != 24 && at != 25 { // keep the output size: damage the chunk, not the harness's framing
                bytes[at] ^= v;
            }
        }
        serial(|| harness::chunk_bytes(&bytes));
    }

    #[test]
    fn arbitrary_bytes_as_a_manifest(data in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        "[\\[\\]{}\",:0-9a-z ]{0,300}".prop_map(String::into_bytes),
    ]) {
        serial(|| harness::manifest_bytes(&data));
    }

    #[test]
    fn randomly_corrupted_manifests(data in prop::collection::vec(any::<u8>(), 3..30)) {
        serial(|| harness::mutated_manifest(&data));
    }
}

#[test]
fn deeply_nested_manifest_json_is_an_error_not_a_stack_overflow() {
    serial(|| {
        harness::manifest_bytes(&[b'['; 100_000]);
        harness::manifest_bytes(format!("{}1{}", "[".repeat(5000), "]".repeat(5000)).as_bytes());
    });
}
