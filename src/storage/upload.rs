//! Uploading a committed local dataset to object storage, resumably: every shard the remote
//! manifest does not list yet goes up as a multipart upload (aborted when it fails, so no
//! partial object is left under the shard's name), and the manifest goes last, with a
//! conditional PUT (`If-None-Match: *` for a new dataset, `If-Match: <etag>` for an update),
//! so two writers never overwrite each other's manifest and no manifest lists a shard not fully
//! uploaded. A shard is never uploaded over an object that differs from it (`already_there`).

use std::io::Read;
use std::path::Path;

use object_store::{ObjectStoreExt, PutMode, PutPayload, UpdateVersion, WriteMultipart};

use super::remote::{self, ObjectUrl};
use crate::dataset::Manifest;
use crate::error::{Error, Result};

/// Part size of the multipart uploads (S3's minimum is 5 MiB, except for the last part).
const PART_BYTES: usize = 8 << 20;
/// Parts in flight per upload.
const PARTS_IN_FLIGHT: usize = 4;

/// What [`upload_dataset`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UploadReport {
    /// Shard files uploaded now, in manifest order.
    pub uploaded: Vec<String>,
    /// Shard files not sent again: the remote manifest lists them, or an interrupted upload
    /// completed them (`already_there`).
    pub skipped: Vec<String>,
    /// Bytes of the shards uploaded now.
    pub bytes: u64,
}

/// Uploads the dataset whose manifest is `local_manifest` to the prefix `url` (the manifest
/// keeps its file name there). Errors: the remote manifest lists shards the local one does not
/// (another dataset), or it changed during the upload (another writer): `Incompatible`; any
/// failed request: `Storage` naming the object.
pub fn upload_dataset(local_manifest: &Path, url: &Path) -> Result<UploadReport> {
    // The bytes put last are the ones parsed now: a writer still committing may replace the file
    // meanwhile, and a manifest read later could list a shard not uploaded.
    let bytes = std::fs::read(local_manifest).map_err(|e| Error::io(local_manifest, e))?;
    let local = Manifest::parse(local_manifest, &bytes)?;
    let name = local_manifest
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::InvalidArgument(format!("{}: not a manifest file", local_manifest.display())))?;
    let root = url.to_string_lossy().trim_end_matches('/').to_owned();
    let manifest_url = remote::parse(Path::new(&format!("{root}/{name}")))?;
    let (remote_manifest, etag) = match remote::get_with_etag(&manifest_url)? {
        Some((bytes, etag)) => (Some(Manifest::parse(Path::new(&manifest_url.full), &bytes)?), etag),
        None => (None, None),
    };
    let mut report = UploadReport::default();
    let listed = remote_manifest.as_ref().map_or(0, |m| m.shards.len());
    if let Some(m) = &remote_manifest {
        let prefix_matches = m.schema == local.schema
            && m.shards.len() <= local.shards.len()
            && m.shards.iter().zip(&local.shards).all(|(a, b)| a == b);
        if !prefix_matches {
            return Err(Error::Incompatible(format!(
                "{}: the remote manifest is not an earlier state of {} (other schema or shards): not overwritten",
                manifest_url.full,
                local_manifest.display()
            )));
        }
        report.skipped = m.shards.iter().map(|s| s.file.clone()).collect();
    }
    for shard in &local.shards[listed..] {
        let path = Manifest::shard_path(local_manifest, shard);
        let target = remote::parse(Path::new(&format!("{root}/{}", shard.file)))?;
        if already_there(&path, &target, shard.bytes)? {
            report.skipped.push(shard.file.clone());
            continue;
        }
        upload_file(&path, &target)?;
        report.uploaded.push(shard.file.clone());
        report.bytes += shard.bytes;
    }
    put_conditional(&manifest_url, bytes, remote_manifest.is_some().then_some(etag)).map_err(|e| match e {
        Error::Incompatible(_) => Error::Incompatible(format!(
            "{}: another writer changed the manifest during this upload; its shards are uploaded, the manifest \
             is not (upload again to merge nothing: resolve which dataset is meant first)",
            manifest_url.full
        )),
        other => other,
    })?;
    Ok(report)
}

/// Puts `bytes` at `url` with a conditional PUT: create-only when `etag` is None, else only
/// if the object still has that ETag. Errors: the condition failed (another writer):
/// `Incompatible`; any other failed request: `Storage`.
fn put_conditional(url: &ObjectUrl, bytes: Vec<u8>, etag: Option<Option<String>>) -> Result<()> {
    let mode = match etag {
        Some(e_tag) => PutMode::Update(UpdateVersion { e_tag, version: None }),
        None => PutMode::Create,
    };
    let key = url.key.clone();
    let put = remote::run(url, move |store| {
        Box::pin(async move {
            store
                .put_opts(&key, PutPayload::from(bytes), mode.into())
                .await
                .map(|_| ())
        })
    });
    match put {
        Err(Error::Storage { status: Some(412), .. }) | Err(Error::Storage { status: Some(409), .. }) => {
            Err(Error::Incompatible(format!(
                "{}: another writer created or changed it meanwhile: not overwritten",
                url.full
            )))
        }
        other => other,
    }
}

/// Puts the manifest `bytes` at the object URL `url` (a merged manifest): created when there
/// is none, else replacing the one there only if no other writer changed it since it was read
/// now (If-Match on its ETag). Errors: `Incompatible` when another writer got in between.
pub fn put_manifest(bytes: Vec<u8>, url: &Path) -> Result<()> {
    let target = remote::parse(url)?;
    let etag = remote::get_with_etag(&target)?.map(|(_, etag)| etag);
    put_conditional(&target, bytes, etag)
}

/// Bytes at the end of a shard compared with an object already under its name: its footer and
/// index, whose checksums cover every record.
const TAIL_BYTES: u64 = 64 << 10;

/// Whether `target` already holds the shard file `path` (`len` bytes, from its manifest entry):
/// an upload that completed before its manifest was written (same size, same last bytes), which
/// is not sent again. No object there: false. Any other object: `Incompatible`, since uploading
/// would overwrite another writer's shard (a dataset in the same prefix, or the same rank of
/// another run). Checked before each upload; two writers uploading the same name at the same
/// time are not detected (`object_store` has no conditional multipart completion).
fn already_there(path: &Path, target: &ObjectUrl, len: u64) -> Result<bool> {
    let key = target.key.clone();
    let size = remote::run(target, move |store| {
        Box::pin(async move {
            match store.head(&key).await {
                Ok(meta) => Ok(Some(meta.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    })?;
    let Some(size) = size else { return Ok(false) };
    let tail = TAIL_BYTES.min(len);
    let same = size == len && {
        let key = target.key.clone();
        let theirs = remote::run(target, move |store| {
            Box::pin(async move { store.get_range(&key, len - tail..len).await })
        })?;
        let mut ours = vec![0u8; tail as usize];
        std::fs::File::open(path)
            .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut ours, len - tail))
            .map_err(|e| Error::io(path, e))?;
        theirs[..] == ours[..]
    };
    if !same {
        return Err(Error::Incompatible(format!(
            "{}: another object ({size} bytes) already stands under this shard's name, which no manifest of \
             this dataset lists: not overwritten (another dataset or writer uses this prefix and rank)",
            target.full
        )));
    }
    Ok(true)
}

/// One local file to one object, as a multipart upload aborted on failure.
fn upload_file(path: &Path, target: &ObjectUrl) -> Result<()> {
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let key = target.key.clone();
    let owned = path.to_owned();
    remote::run(target, move |store| {
        Box::pin(async move {
            let mut upload = WriteMultipart::new_with_chunk_size(store.put_multipart(&key).await?, PART_BYTES);
            let mut buf = vec![0u8; PART_BYTES];
            let fed: object_store::Result<()> = loop {
                let n = match file.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) => {
                        break Err(object_store::Error::Generic {
                            store: "local",
                            source: format!("{}: {e}", owned.display()).into(),
                        })
                    }
                };
                if n == 0 {
                    break Ok(());
                }
                if let Err(e) = upload.wait_for_capacity(PARTS_IN_FLIGHT).await {
                    break Err(e);
                }
                upload.write(&buf[..n]);
            };
            match fed {
                // `finish` aborts the upload itself when a part or the completion fails.
                Ok(()) => upload.finish().await.map(|_| ()),
                Err(e) => {
                    let _ = upload.abort().await;
                    Err(e)
                }
            }
        })
    })
}
