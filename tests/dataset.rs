//! Writer -> shards -> reader round trips, rotation, resume and corruption detection.

use std::path::Path;

use eagle_io::dataset::{DatasetWriter, Manifest, SampleRef, WriterOptions};
use eagle_io::{DType, Dataset, Error, Schema, TensorSpec};
use proptest::prelude::*;

fn eagle3_schema(hidden: u64) -> Schema {
    Schema::new(vec![
        TensorSpec {
            name: "input_ids".into(),
            dtype: DType::Int64,
            width: None,
            precision: None,
        },
        TensorSpec {
            name: "loss_mask".into(),
            dtype: DType::Uint8,
            width: None,
            precision: None,
        },
        TensorSpec {
            name: "aux_hidden_states".into(),
            dtype: DType::Bfloat16,
            width: Some(3 * hidden),
            precision: None,
        },
        TensorSpec {
            name: "hidden_states".into(),
            dtype: DType::Bfloat16,
            width: Some(hidden),
            precision: None,
        },
    ])
    .unwrap()
}

/// Deterministic bytes for sample `id`'s tensor `t`.
fn tensor_bytes(schema: &Schema, id: u64, t: usize, n_tokens: u64) -> Vec<u8> {
    let len = (n_tokens * schema.tensors[t].row_bytes()) as usize;
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (t as u64 + 1);
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 2 == 1 {
                (x % 5) as u8 + 60
            } else {
                x as u8
            }
        })
        .collect()
}

fn write_samples(w: &mut DatasetWriter, ids: &[(u64, u64)]) {
    let schema = w.schema().clone();
    let data: Vec<Vec<Vec<u8>>> = ids
        .iter()
        .map(|&(id, n)| {
            (0..schema.tensors.len())
                .map(|t| tensor_bytes(&schema, id, t, n))
                .collect()
        })
        .collect();
    let keys: Vec<String> = ids.iter().map(|(id, _)| format!("conv-{id}")).collect();
    let samples: Vec<SampleRef> = ids
        .iter()
        .zip(&data)
        .zip(&keys)
        .map(|((&(id, n), d), k)| SampleRef {
            sample_id: id,
            key: k,
            n_tokens: n,
            tensors: d.iter().map(|v| v.as_slice()).collect(),
            prequantised: None,
            prefix: None,
        })
        .collect();
    w.write_batch(&samples).unwrap();
}

fn check_all(root: &Path, ids: &[(u64, u64)]) {
    let ds = Dataset::open(root, 2).unwrap();
    assert_eq!(ds.len(), ids.len() as u64);
    for &(id, n) in ids {
        let pos = ds.position(id).expect("sample present");
        let e = ds.entry(pos).unwrap();
        assert_eq!((e.sample_id, e.n_tokens, e.key), (id, n, format!("conv-{id}").as_str()));
        let got = ds.read(pos).unwrap();
        for (t, buf) in got.iter().enumerate() {
            assert_eq!(buf, &tensor_bytes(ds.schema(), id, t, n), "sample {id} tensor {t}");
        }
    }
    assert!(Dataset::verify(root, 2).unwrap().is_empty());
}

/// A writer on `root` with the EAGLE-3 schema (hidden 64) and metadata `{"m": m}`.
fn writer_64(root: &Path, m: u64, resume: bool) -> eagle_io::Result<DatasetWriter> {
    let opts = WriterOptions { resume, ..small_opts() };
    DatasetWriter::create(root, eagle3_schema(64), serde_json::json!({ "m": m }), opts)
}

fn small_opts() -> WriterOptions {
    WriterOptions {
        shard_bytes: 200_000,
        chunk_bytes: 16 * 1024,
        threads: 2,
        ..Default::default()
    }
}

#[test]
fn roundtrip_with_rotation_empty_and_one_token_samples() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = DatasetWriter::create(
        dir.path(),
        eagle3_schema(64),
        serde_json::json!({"target": "t"}),
        small_opts(),
    )
    .unwrap();
    let ids: Vec<(u64, u64)> = (0..40).map(|i| (1000 + i, [0, 1, 7, 300][i as usize % 4])).collect();
    write_samples(&mut w, &ids[..20]);
    write_samples(&mut w, &ids[20..]);
    let m = w.close().unwrap();
    let stats = w.stats();
    assert!(m.complete);
    assert!(m.shards.len() > 1, "shards rotate at shard_bytes");
    assert_eq!(m.shards.iter().map(|s| s.samples).sum::<u64>(), 40);
    assert_eq!(stats.samples, 40);
    assert!(stats.stored_bytes < stats.raw_bytes, "compresses: {stats:?}");
    check_all(dir.path(), &ids);
}

#[test]
fn invalid_samples_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let schema = eagle3_schema(8);
    let mut w = DatasetWriter::create(dir.path(), schema.clone(), serde_json::json!({}), small_opts()).unwrap();
    let good: Vec<Vec<u8>> = (0..4).map(|t| tensor_bytes(&schema, 1, t, 5)).collect();
    let mut short = good.clone();
    let cut = short[2].len() - 2;
    short[2].truncate(cut);
    fn s(id: u64, d: &[Vec<u8>]) -> SampleRef<'_> {
        SampleRef {
            sample_id: id,
            key: "",
            n_tokens: 5,
            tensors: d.iter().map(|v| v.as_slice()).collect(),
            prequantised: None,
            prefix: None,
        }
    }
    let err = w.write_batch(&[s(1, &good), s(2, &short)]).unwrap_err();
    assert!(matches!(err, Error::Schema { sample_id: 2, .. }), "{err}");
    assert!(err.to_string().contains("aux_hidden_states"), "{err}");
    let err = w.write_batch(&[s(3, &good), s(3, &good)]).unwrap_err();
    assert!(matches!(err, Error::Schema { sample_id: 3, .. }), "{err}");
    w.write_batch(&[s(1, &good)]).unwrap();
    assert!(matches!(
        w.write_batch(&[s(1, &good)]).unwrap_err(),
        Error::Schema { sample_id: 1, .. }
    ));
    let m = w.close().unwrap();
    assert_eq!(m.shards.iter().map(|s| s.samples).sum::<u64>(), 1);
}

#[test]
fn a_second_writer_on_the_same_manifest_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _w = DatasetWriter::create(dir.path(), eagle3_schema(8), serde_json::json!({}), small_opts()).unwrap();
    let again = DatasetWriter::create(
        dir.path(),
        eagle3_schema(8),
        serde_json::json!({}),
        WriterOptions {
            resume: true,
            ..small_opts()
        },
    );
    assert!(again.err().unwrap().to_string().contains("another writer"));
    let other_rank = WriterOptions {
        shard_prefix: "r00001-".into(),
        manifest_name: "manifest.r00001.json".into(),
        ..small_opts()
    };
    DatasetWriter::create(dir.path(), eagle3_schema(8), serde_json::json!({}), other_rank).unwrap();
}

#[test]
fn resume_adopts_committed_orphans_removes_temps_and_continues() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let ids: Vec<(u64, u64)> = (0..30).map(|i| (i, 50)).collect();
    let mut w = writer_64(root, 1, false).unwrap();
    write_samples(&mut w, &ids[..5]);
    drop(w);
    let early_manifest = std::fs::read(root.join("manifest.json")).unwrap();
    let mut w = writer_64(root, 1, true).unwrap();
    write_samples(&mut w, &ids[5..20]);
    w.close().unwrap();
    // A crash after renaming later shards but before the manifest listed them, and a torn temp shard.
    std::fs::write(root.join("manifest.json"), early_manifest).unwrap();
    std::fs::write(root.join("shards/.r00000-000099.eio.tmp"), b"torn").unwrap();
    let refused = writer_64(root, 1, false);
    assert!(refused.is_err(), "no resume: refuse to touch existing data");
    let changed = writer_64(root, 2, true);
    let msg = changed.err().unwrap().to_string();
    assert!(msg.contains("\"m\""), "{msg}");
    let mut w = writer_64(root, 1, true).unwrap();
    for &(id, _) in &ids[..20] {
        assert!(w.contains(id), "sample {id} known after resume");
    }
    let st = w.stats();
    assert_eq!(st.removed_temp_files, 1);
    assert!(st.adopted_shards >= 1);
    write_samples(&mut w, &ids[20..]);
    w.close().unwrap();
    check_all(root, &ids);
}

fn flip(path: &Path, offset: u64) {
    let mut b = std::fs::read(path).unwrap();
    b[offset as usize] ^= 0x40;
    std::fs::write(path, b).unwrap();
}

#[test]
fn flipped_bytes_are_detected_with_file_sample_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let ids: Vec<(u64, u64)> = (0..6).map(|i| (i * 10, 40)).collect();
    let mut w = DatasetWriter::create(
        root,
        eagle3_schema(32),
        serde_json::json!({}),
        WriterOptions {
            shard_bytes: 1 << 30,
            ..small_opts()
        },
    )
    .unwrap();
    write_samples(&mut w, &ids);
    w.close().unwrap();
    let shard = root.join("shards/r00000-000000.eio");
    let ds = Dataset::open(root, 1).unwrap();
    let e3 = ds.entry(3).unwrap();
    let (off, sid) = (e3.offset, e3.sample_id);
    drop(ds);
    flip(&shard, off + 100);
    let ds = Dataset::open(root, 1).unwrap();
    match ds.read(3).unwrap_err() {
        Error::Corrupt {
            path,
            sample_id,
            offset,
            ..
        } => {
            assert_eq!((path, sample_id, offset), (shard.clone(), Some(sid), off));
        }
        other => panic!("{other}"),
    }
    assert_eq!(ds.read(2).unwrap().len(), 4, "other records still read");
    let bad = Dataset::verify(root, 1).unwrap();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].sample_id, Some(sid));
    // Index corruption: the shard no longer opens, and verify names it.
    let len = std::fs::metadata(&shard).unwrap().len();
    flip(&shard, len - 40 - 50);
    assert!(matches!(Dataset::open(root, 1), Err(Error::Corrupt { .. })));
    let bad = Dataset::verify(root, 1).unwrap();
    assert_eq!((bad.len(), bad[0].sample_id), (1, None));
}

#[test]
fn newer_format_versions_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut w = DatasetWriter::create(root, eagle3_schema(8), serde_json::json!({}), small_opts()).unwrap();
    write_samples(&mut w, &[(1, 3)]);
    w.close().unwrap();
    let shard = root.join("shards/r00000-000000.eio");
    let mut b = std::fs::read(&shard).unwrap();
    b[8] = 4;
    std::fs::write(&shard, &b).unwrap();
    assert!(matches!(
        eagle_io::shard::ShardFile::open(&shard),
        Err(Error::FormatVersion { found: 4, .. })
    ));
    let m = std::fs::read_to_string(root.join("manifest.json"))
        .unwrap()
        .replace("\"format_version\": 2", "\"format_version\": 7");
    std::fs::write(root.join("manifest.json"), m).unwrap();
    assert!(matches!(
        Dataset::open(root, 1),
        Err(Error::FormatVersion { found: 7, .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn random_schemas_roundtrip(widths in prop::collection::vec((0usize..9, prop::option::of(1u64..25_000)), 1..4),
                                tokens in prop::collection::vec(0u64..40, 1..6)) {
        let dtypes = [DType::Bool, DType::Uint8, DType::Int8, DType::Int16, DType::Int32, DType::Int64, DType::Float16, DType::Bfloat16, DType::Float32];
        let schema = Schema::new(widths.iter().enumerate().map(|(i, &(d, w))| TensorSpec { name: format!("t{i}"), dtype: dtypes[d], width: w, precision: None }).collect()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut w = DatasetWriter::create(dir.path(), schema, serde_json::json!({}), small_opts()).unwrap();
        let ids: Vec<(u64, u64)> = tokens.iter().enumerate().map(|(i, &n)| (i as u64 * 7 + 3, n)).collect();
        write_samples(&mut w, &ids);
        w.close().unwrap();
        check_all(dir.path(), &ids);
    }
}

#[test]
fn manifest_shard_paths_cannot_escape_the_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ds");
    let mut w = DatasetWriter::create(&root, eagle3_schema(8), serde_json::json!({}), small_opts()).unwrap();
    write_samples(&mut w, &[(1, 3)]);
    w.close().unwrap();
    std::fs::copy(root.join("shards/r00000-000000.eio"), dir.path().join("outside.eio")).unwrap();
    // Crafted (sealed), so the path check is what refuses it, not the checksum.
    let mut m: Manifest = serde_json::from_slice(&std::fs::read(root.join("manifest.json")).unwrap()).unwrap();
    m.shards[0].file = "../outside.eio".into();
    m.store(&root.join("manifest.json")).unwrap();
    let err = Dataset::open(&root, 1).err().unwrap().to_string();
    assert!(err.contains("not relative to the dataset"), "{err}");
}

#[test]
fn the_manifest_checksum_covers_metadata_and_names_the_digits_offset() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let meta = serde_json::json!({"aux_layer_ids": [2, 15, 27]});
    let mut w = DatasetWriter::create(root, eagle3_schema(8), meta, small_opts()).unwrap();
    write_samples(&mut w, &[(1, 3)]);
    w.close().unwrap();
    let path = root.join("manifest.json");
    let good = std::fs::read_to_string(&path).unwrap();
    assert!(good.trim_end().ends_with('}') && good.contains("\"checksum\": \"crc32:"));
    let digits = good.rfind("\"crc32:").unwrap() + 7;
    std::fs::write(&path, good.replacen("27", "28", 1)).unwrap();
    match Dataset::open(root, 1) {
        Err(Error::Corrupt {
            path: p,
            sample_id: None,
            offset,
            what,
        }) => {
            assert_eq!((p, offset), (path.clone(), digits as u64));
            assert!(what.contains("checksum"), "{what}");
        }
        other => panic!("a flipped layer id was not detected: {:?}", other.map(|d| d.len())),
    }
    // Sealing is deterministic: the loaded manifest stores back to the very same bytes.
    std::fs::write(&path, &good).unwrap();
    assert_eq!(Manifest::load(&path).unwrap().to_sealed_bytes(), good.as_bytes());
}

#[test]
fn rows_quantised_on_the_source_device_make_the_same_shards_as_the_writers_own() {
    use eagle_io::quant::{quantize, Precision};
    let mut schema = eagle3_schema(16);
    for t in &mut schema.tensors[2..] {
        t.precision = Some(Precision::PER_TOKEN);
    }
    let ids: Vec<(u64, u64)> = vec![(1, 7), (2, 300), (3, 0)];
    let given: Vec<Vec<Vec<u8>>> = ids
        .iter()
        .map(|&(id, n)| (0..4).map(|t| tensor_bytes(&schema, id, t, n)).collect())
        .collect();
    // The same rows quantised before the writer sees them (as the GPU quantiser does).
    let quantised: Vec<Vec<Vec<u8>>> = given
        .iter()
        .zip(&ids)
        .map(|(ts, &(_, n))| {
            let mut ts = ts.clone();
            for (t, spec) in schema.tensors.iter().enumerate().skip(2) {
                let mut q = vec![0u8; (n * spec.stored_row_bytes()) as usize];
                let w = spec.elems_per_row() as usize;
                quantize(&ts[t], spec.dtype, n as usize, w, &Precision::PER_TOKEN, &mut q).unwrap();
                ts[t] = q;
            }
            ts
        })
        .collect();
    let mut shards = Vec::new();
    for (data, prequantised) in [(&given, None), (&quantised, Some(5))] {
        let dir = tempfile::tempdir().unwrap();
        let mut w = DatasetWriter::create(dir.path(), schema.clone(), serde_json::json!({}), small_opts()).unwrap();
        let samples: Vec<SampleRef> = ids
            .iter()
            .zip(data)
            .map(|(&(id, n), d)| SampleRef {
                sample_id: id,
                key: "",
                n_tokens: n,
                tensors: d.iter().map(|v| v.as_slice()).collect(),
                prequantised,
                prefix: None,
            })
            .collect();
        w.write_batch(&samples).unwrap();
        let m = w.close().unwrap();
        let s = w.stats();
        assert_eq!(s.fp8_values, 307 * 4 * 16);
        // The given rows' quantiser counted 5 clamps per sample (the writer's own found none).
        assert_eq!(s.fp8_clamped, prequantised.map_or(0, |c| 3 * c));
        assert_eq!(
            m.shards.iter().map(|s| s.raw_bytes).sum::<u64>(),
            307 * schema.token_bytes()
        );
        let files: Vec<Vec<u8>> = m
            .shards
            .iter()
            .map(|s| std::fs::read(dir.path().join(&s.file)).unwrap())
            .collect();
        shards.push(files);
    }
    assert_eq!(shards[0], shards[1]);

    // Rows that no quantiser of the core's rules makes are refused, naming sample, tensor and token.
    let dir = tempfile::tempdir().unwrap();
    let mut w = DatasetWriter::create(dir.path(), schema.clone(), serde_json::json!({}), small_opts()).unwrap();
    let mut bad = quantised[1].clone();
    let rb = schema.tensors[3].stored_row_bytes() as usize;
    bad[3][4 * rb..4 * rb + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    fn sample(d: &[Vec<u8>], n: u64) -> SampleRef<'_> {
        SampleRef {
            sample_id: 9,
            key: "",
            n_tokens: n,
            tensors: d.iter().map(|v| v.as_slice()).collect(),
            prequantised: Some(0),
            prefix: None,
        }
    }
    let err = w.write_batch(&[sample(&bad, 300)]).unwrap_err().to_string();
    assert!(
        err.contains("sample 9") && err.contains("\"hidden_states\"") && err.contains("token 4"),
        "{err}"
    );
    assert!(err.contains("is NaN"), "{err}");
    // Given in the dtype's size while declared quantised: the byte count is wrong.
    let err = w.write_batch(&[sample(&given[1], 300)]).unwrap_err().to_string();
    assert!(err.contains("(FP8 scales and bytes)"), "{err}");
}

/// Writes prefix record 7 (40 tokens) and samples 1..=5, of which 1, 3 and 5 reference it (their given
/// rows are their suffix); returns each sample's whole tensors by id.
fn write_with_prefix(root: &Path) -> Vec<(u64, Vec<Vec<u8>>)> {
    let mut w = writer_64(root, 0, false).unwrap();
    let schema = w.schema().clone();
    let tensors = |id: u64, n: u64| -> Vec<Vec<u8>> {
        (0..schema.tensors.len())
            .map(|t| tensor_bytes(&schema, id, t, n))
            .collect()
    };
    let prefix = tensors(700, 40);
    let as_ref = |id: u64, n: u64, d: &[Vec<u8>], prefix: Option<u64>| -> Vec<SampleRef<'static>> {
        let d: &'static [Vec<u8>] = Box::leak(d.to_vec().into_boxed_slice());
        vec![SampleRef {
            sample_id: id,
            key: "",
            n_tokens: n,
            tensors: d.iter().map(|v| v.as_slice()).collect(),
            prequantised: None,
            prefix,
        }]
    };
    let p = w.write_prefix(&as_ref(7, 40, &prefix, None)[0]).unwrap();
    assert_eq!((p.id, p.n_tokens), (7, 40));
    let mut whole = Vec::new();
    for id in 1..=5u64 {
        let suffix = tensors(id, id * 3);
        let refs = id % 2 == 1;
        w.write_batch(&as_ref(id, id * 3, &suffix, refs.then_some(7))).unwrap();
        let full = match refs {
            true => prefix
                .iter()
                .zip(&suffix)
                .map(|(a, b)| [a.as_slice(), b].concat())
                .collect(),
            false => suffix,
        };
        whole.push((id, full));
    }
    // The same token ids are stored once; a reference to a prefix the dataset lacks is refused.
    let again = w.write_prefix(&as_ref(8, 40, &prefix, None)[0]).unwrap_err();
    assert!(
        again.to_string().contains("already stored as prefix record 7"),
        "{again}"
    );
    let dangling = w.write_batch(&as_ref(9, 2, &tensors(9, 2), Some(8))).unwrap_err();
    assert!(dangling.to_string().contains("prefix record 8"), "{dangling}");
    w.write_prefix(&as_ref(8, 6, &tensors(800, 6), None)[0]).unwrap(); // referenced by none
    w.close().unwrap();
    whole
}

#[test]
fn samples_referencing_a_shared_prefix_read_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let whole = write_with_prefix(dir.path());
    let ds = Dataset::open(dir.path(), 2).unwrap();
    assert_eq!(ds.manifest().format_version, 3);
    assert_eq!(ds.manifest().prefixes.len(), 2);
    assert_eq!(ds.len(), 5);
    for (id, full) in &whole {
        let pos = ds.position(*id).unwrap();
        assert_eq!(ds.entry(pos).unwrap().n_tokens, full[0].len() as u64 / 8, "sample {id}");
        assert_eq!(&ds.read(pos).unwrap(), full, "sample {id}");
    }
    // A batch, and one tensor of a batch, read the same bytes.
    let mut bufs: Vec<Vec<Vec<u8>>> = whole
        .iter()
        .map(|(_, full)| full.iter().map(|t| vec![0u8; t.len()]).collect())
        .collect();
    let mut items: Vec<(u64, Vec<&mut [u8]>)> = bufs
        .iter_mut()
        .enumerate()
        .map(|(pos, b)| (pos as u64, b.iter_mut().map(|v| v.as_mut_slice()).collect()))
        .collect();
    ds.read_batch(&mut items).unwrap();
    assert_eq!(bufs, whole.iter().map(|(_, f)| f.clone()).collect::<Vec<_>>());
    let mut aux: Vec<Vec<u8>> = whole.iter().map(|(_, f)| vec![0u8; f[2].len()]).collect();
    let mut items: Vec<(u64, &mut [u8])> = aux
        .iter_mut()
        .enumerate()
        .map(|(pos, b)| (pos as u64, b.as_mut_slice()))
        .collect();
    assert!(ds
        .read_tensor_batch("aux_hidden_states", &mut items)
        .unwrap()
        .iter()
        .all(Result::is_ok));
    assert_eq!(aux, whole.iter().map(|(_, f)| f[2].clone()).collect::<Vec<_>>());
    assert!(Dataset::verify(dir.path(), 2).unwrap().is_empty());
    // Resume knows the prefix: a new sample may reference it, and its tokens are not stored again.
    let mut w = writer_64(dir.path(), 0, true).unwrap();
    assert_eq!(w.prefixes()[&7].n_tokens, 40);
    let data: Vec<Vec<u8>> = (0..4).map(|t| tensor_bytes(w.schema(), 6, t, 2)).collect();
    let sample = SampleRef {
        sample_id: 6,
        key: "",
        n_tokens: 2,
        tensors: data.iter().map(|v| v.as_slice()).collect(),
        prequantised: None,
        prefix: Some(7),
    };
    w.write_batch(&[sample]).unwrap();
    w.close().unwrap();
    let ds = Dataset::open(dir.path(), 2).unwrap();
    assert_eq!(ds.entry(ds.position(6).unwrap()).unwrap().n_tokens, 42);
}

#[test]
fn verify_names_every_sample_of_a_corrupt_or_missing_prefix() {
    let dir = tempfile::tempdir().unwrap();
    write_with_prefix(dir.path());
    let manifest_path = dir.path().join("manifest.json");
    let prefix_shard = dir
        .path()
        .join(&Manifest::load(&manifest_path).unwrap().prefixes[0].file);
    let len = std::fs::metadata(&prefix_shard).unwrap().len();
    flip(&prefix_shard, len / 2); // inside the prefix record's payload
    let bad = Dataset::verify(dir.path(), 2).unwrap();
    let named: Vec<Option<u64>> = bad.iter().map(|b| b.sample_id).collect();
    assert_eq!(named, vec![Some(7), Some(1), Some(3), Some(5)], "{bad:?}");
    assert!(
        bad[1..]
            .iter()
            .all(|b| b.error.contains("its prefix record 7 is corrupt")),
        "{bad:?}"
    );
    let ds = Dataset::open(dir.path(), 1).unwrap();
    let err = ds.read(ds.position(3).unwrap()).unwrap_err().to_string();
    assert!(err.contains("its prefix record 7 is unreadable"), "{err}");
    assert!(ds.read(ds.position(2).unwrap()).is_ok());
    // A manifest that no longer lists prefix 7 (only 8): each referencing sample's reference dangles.
    let mut m = Manifest::load(&manifest_path).unwrap();
    m.prefixes.remove(0);
    m.store(&manifest_path).unwrap();
    let bad = Dataset::verify(dir.path(), 2).unwrap();
    assert_eq!(
        bad.iter().map(|b| b.sample_id).collect::<Vec<_>>(),
        vec![Some(1), Some(3), Some(5)]
    );
    assert!(bad.iter().all(|b| b
        .error
        .contains("references prefix record 7, which the dataset does not hold")));
}

#[test]
fn a_suffix_too_small_to_carry_its_prefix_is_refused() {
    // Readers refuse an entry decoding to more than 40000 x its record's bytes (FORMAT.md 4.3): an empty suffix
    // (a record of about 200 bytes) cannot reference 300 tokens of 32 KiB rows.
    let dir = tempfile::tempdir().unwrap();
    let mut w = DatasetWriter::create(dir.path(), eagle3_schema(4096), serde_json::json!({}), small_opts()).unwrap();
    let schema = w.schema().clone();
    let prefix: Vec<Vec<u8>> = (0..4).map(|t| tensor_bytes(&schema, 1, t, 300)).collect();
    let sample = |id, n_tokens, tensors: Vec<&'static [u8]>, prefix| SampleRef {
        sample_id: id,
        key: "",
        n_tokens,
        tensors,
        prequantised: None,
        prefix,
    };
    let p: &'static [Vec<u8>] = Box::leak(prefix.into_boxed_slice());
    w.write_prefix(&sample(1, 300, p.iter().map(|v| v.as_slice()).collect(), None))
        .unwrap();
    let err = w.write_batch(&[sample(2, 0, vec![&[]; 4], Some(1))]).unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot carry a reference to a prefix of 300 tokens"),
        "{err}"
    );
    assert!(!w.contains(2)); // nothing of it was queued
    w.close().unwrap();
    // A capture uploading its shards as they commit follows the manifest's `shards`: no prefix shard may hide.
    let staged = tempfile::tempdir().unwrap();
    let opts = WriterOptions {
        uploaded_to: Some(dir.path().join("remote")),
        ..small_opts()
    };
    let mut w = DatasetWriter::create(staged.path(), eagle3_schema(4096), serde_json::json!({}), opts).unwrap();
    let err = w
        .write_prefix(&sample(1, 300, p.iter().map(|v| v.as_slice()).collect(), None))
        .unwrap_err();
    assert!(err.to_string().contains("not uploaded to object storage yet"), "{err}");
}

#[test]
fn shared_prefixes_are_numbered_in_the_ranks_range_and_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let opts = WriterOptions {
        rank: 3,
        shard_prefix: "r00003-".into(),
        manifest_name: "manifest.r00003.json".into(),
        ..small_opts()
    };
    let mut w = DatasetWriter::create(dir.path(), eagle3_schema(8), serde_json::json!({}), opts).unwrap();
    let schema = w.schema().clone();
    // Samples 1 and 2 hold the same 10 tokens (every tensor's first 10 rows), then 5 rows of their own.
    let whole: Vec<Vec<Vec<u8>>> = (1..=2u64)
        .map(|id| {
            (0..4)
                .map(|t| {
                    let mut rows = tensor_bytes(&schema, 100, t, 10);
                    rows.extend(tensor_bytes(&schema, id, t, 5));
                    rows
                })
                .collect()
        })
        .collect();
    let sample = |id: u64| SampleRef {
        sample_id: id,
        key: "",
        n_tokens: 15,
        tensors: whole[id as usize - 1].iter().map(|v| v.as_slice()).collect(),
        prequantised: None,
        prefix: None,
    };
    let err = w.write_batch_sharing(&[sample(1)], &[15]).unwrap_err();
    assert!(err.to_string().contains("must leave at least one token"), "{err}");
    let err = w.write_batch_sharing(&[sample(1), sample(1)], &[10, 10]).unwrap_err();
    assert!(err.to_string().contains("already in the dataset"), "{err}");
    assert!(w.prefixes().is_empty()); // refused before any prefix record was written
    w.write_batch_sharing(&[sample(1), sample(2)], &[10, 10]).unwrap();
    let ids: Vec<u64> = w.prefixes().keys().copied().collect();
    assert_eq!(ids, vec![3 << 40]);
    w.close().unwrap();
    let ds = Dataset::open(&dir.path().join("manifest.r00003.json"), 1).unwrap();
    for (pos, id) in [(0, 1u64), (1, 2)] {
        assert_eq!(ds.read(pos).unwrap(), whole[id as usize - 1], "sample {id}");
    }
}
