//! What a writer finds in its root before it starts: nothing (a new dataset), or an
//! earlier run of the same writer to continue (`resume`). Uncommitted temp shards are
//! removed; committed shards the manifest does not list yet (a crash between rename and
//! manifest update) are verified record by record and adopted. Anything else is refused.

use std::collections::HashSet;
use std::path::Path;

use super::manifest::Manifest;
use super::options::WriterOptions;
use crate::error::{Error, Result};
use crate::format::record::{parse_prefix_key, PrefixRef};
use crate::layout;
use crate::shard::{ShardFile, ShardSummary};

pub struct Prepared {
    pub manifest: Manifest,
    pub seen: HashSet<u64>,
    /// The prefix records the manifest lists.
    pub prefixes: Vec<PrefixRef>,
    pub next_seq: u64,
    pub removed_temp_files: u64,
    pub adopted_shards: u64,
}

pub fn prepare(root: &Path, manifest_path: &Path, opts: &WriterOptions, fresh: Manifest) -> Result<Prepared> {
    let shard_dir = root.join(layout::SHARD_DIR);
    let mut temps = Vec::new();
    let mut committed = Vec::new();
    for entry in std::fs::read_dir(&shard_dir).map_err(|e| Error::io(&shard_dir, e))? {
        let entry = entry.map_err(|e| Error::io(&shard_dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(seq) = layout::shard_seq(&name, &opts.shard_prefix) {
            committed.push((seq, name));
        } else if layout::is_shard_temp(&name, &opts.shard_prefix) {
            temps.push(entry.path());
        }
    }
    let has_manifest = manifest_path.exists();
    if !opts.resume && (has_manifest || !committed.is_empty() || !temps.is_empty()) {
        return Err(Error::InvalidArgument(format!(
            "{} already holds data of this writer ({}); resume it or choose an empty directory",
            root.display(),
            if has_manifest {
                manifest_path.display().to_string()
            } else {
                "shards without a manifest".into()
            }
        )));
    }
    let mut manifest = if has_manifest {
        Manifest::load(manifest_path)?
    } else {
        fresh.clone()
    };
    if manifest.schema != fresh.schema {
        return Err(Error::Incompatible(format!(
            "{}: cannot resume: its schema {} differs from the requested {}",
            manifest_path.display(),
            manifest.schema.to_json(),
            fresh.schema.to_json()
        )));
    }
    if manifest.metadata != fresh.metadata {
        return Err(Error::Incompatible(format!(
            "{}: cannot resume: metadata differs in {}",
            manifest_path.display(),
            differing_keys(&manifest.metadata, &fresh.metadata)
        )));
    }
    manifest.complete = false;
    // The shards this writer adds are of its version at least (a version-1 dataset continued with
    // version-2 shards says so, or a version-1 reader would misread them).
    manifest.format_version = manifest.format_version.max(fresh.format_version);
    let mut seen = HashSet::new();
    for summary in &manifest.shards {
        let mut path = Manifest::shard_path(manifest_path, summary);
        let staged = path.clone();
        if let (false, Some(remote)) = (path.exists(), &opts.uploaded_to) {
            // Uploaded, and its staged copy removed: the object is read in its place.
            path = crate::storage::resolve(remote, &summary.file);
        }
        let shard = ShardFile::open(&path).map_err(|e| match e {
            Error::Storage {
                url,
                status: Some(404),
                message,
            } => Error::Storage {
                url,
                status: Some(404),
                message: format!(
                    "{message}; the manifest {} lists this shard, whose staged copy {} is gone too: it was never \
                     uploaded, so the staging directory lost committed data",
                    manifest_path.display(),
                    staged.display()
                ),
            },
            other => other,
        })?;
        if summary_of(&shard, &summary.file) != *summary {
            return Err(Error::corrupt(
                &path,
                None,
                0,
                format!("shard (differs from its manifest entry in {})", manifest_path.display()),
            ));
        }
        add_ids(&shard, &mut seen)?;
    }
    let mut prefixes = Vec::new();
    for summary in &manifest.prefixes {
        let path = Manifest::shard_path(manifest_path, summary);
        let shard = ShardFile::open(&path)?;
        if summary_of(&shard, &summary.file) != *summary {
            return Err(Error::corrupt(
                &path,
                None,
                0,
                format!(
                    "prefix shard (differs from its manifest entry in {})",
                    manifest_path.display()
                ),
            ));
        }
        for (r, e) in shard.entries.iter().enumerate() {
            let digest = parse_prefix_key(shard.key(r)).ok_or_else(|| {
                Error::corrupt(
                    &path,
                    Some(e.sample_id),
                    e.offset,
                    "prefix record (its key is not sha256:<hex>)",
                )
            })?;
            prefixes.push(PrefixRef {
                id: e.sample_id,
                n_tokens: e.n_tokens,
                digest,
            });
        }
    }
    let listed: HashSet<&str> = manifest.shards.iter().map(|s| s.file.as_str()).collect();
    let mut orphans: Vec<(u64, String)> = committed
        .iter()
        .filter(|(_, name)| !listed.contains(format!("{}/{name}", layout::SHARD_DIR).as_str()))
        .cloned()
        .collect();
    orphans.sort();
    let adopted_shards = orphans.len() as u64;
    for (_, name) in &orphans {
        let path = shard_dir.join(name);
        let shard = ShardFile::open(&path)?;
        if shard.schema != manifest.schema {
            return Err(Error::Incompatible(format!(
                "{}: schema differs from the dataset's",
                path.display()
            )));
        }
        let mut buf = Vec::new();
        for i in 0..shard.entries.len() {
            shard.read_record(i, &mut buf)?;
        }
        add_ids(&shard, &mut seen)?;
        manifest
            .shards
            .push(summary_of(&shard, &format!("{}/{name}", layout::SHARD_DIR)));
    }
    for t in &temps {
        std::fs::remove_file(t).map_err(|e| Error::io(t, e))?;
    }
    // Listed shards count too: an uploaded shard's staged copy is gone, and its name is taken.
    let listed_seqs = manifest.shards.iter().filter_map(|s| {
        let name = s.file.rsplit('/').next().unwrap_or(&s.file);
        layout::shard_seq(name, &opts.shard_prefix)
    });
    let next_seq = committed
        .iter()
        .map(|(seq, _)| *seq)
        .chain(listed_seqs)
        .map(|seq| seq + 1)
        .max()
        .unwrap_or(0);
    Ok(Prepared {
        manifest,
        seen,
        prefixes,
        next_seq,
        removed_temp_files: temps.len() as u64,
        adopted_shards,
    })
}

fn summary_of(shard: &ShardFile, file: &str) -> ShardSummary {
    let token_bytes = shard.schema.token_bytes();
    ShardSummary {
        file: file.to_owned(),
        samples: shard.entries.len() as u64,
        tokens: shard.entries.iter().map(|e| e.n_tokens).sum(),
        bytes: shard.file_len,
        raw_bytes: shard.entries.iter().map(|e| e.n_tokens * token_bytes).sum(),
        index_crc32: shard.footer.index_crc32,
    }
}

fn add_ids(shard: &ShardFile, seen: &mut HashSet<u64>) -> Result<()> {
    for e in &shard.entries {
        if !seen.insert(e.sample_id) {
            return Err(Error::corrupt(
                &shard.path,
                Some(e.sample_id),
                e.offset,
                "record (sample id already stored in another record)",
            ));
        }
    }
    Ok(())
}

fn differing_keys(a: &serde_json::Value, b: &serde_json::Value) -> String {
    match (a.as_object(), b.as_object()) {
        (Some(x), Some(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).filter(|k| x.get(*k) != y.get(*k)).collect();
            keys.sort();
            keys.dedup();
            keys.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ")
        }
        _ => "its top-level value".into(),
    }
}
