//! A dataset's prefix records (format version 3, docs/FORMAT.md 4.7): where each is, resolving a
//! sample's reference to one, and a small cache of decoded prefixes, so a batch of samples sharing a
//! system prompt decodes its rows once. Reassembly happens here and only here: the reader fills the
//! first rows of a referencing sample's buffers from the prefix, its record's chunks the rest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::decode::decode_tensor;
use crate::error::{lock, Error, Result};
use crate::format::record::{prefix_key, token_digest, token_ids_tensor, PrefixRef};
use crate::shard::ShardFile;

/// Decoded bytes of prefixes the cache keeps beyond the one in use (least recently used evicted).
const PREFIX_CACHE_BYTES: usize = 256 << 20;

/// A prefix's stored rows, one buffer per schema tensor (`n_tokens x stored_row_bytes` each).
type Rows = Arc<Vec<Vec<u8>>>;

/// One cached prefix: decoded once, by whichever reader locks it first (the others wait on it).
#[derive(Default)]
struct Slot {
    rows: Mutex<Option<Rows>>,
}

pub struct Prefixes {
    shards: Vec<ShardFile>,
    /// Prefix id -> (prefix shard, record).
    at: HashMap<u64, (usize, usize)>,
    /// Least recently used first.
    cache: Mutex<Vec<(u64, Arc<Slot>)>>,
}

impl Prefixes {
    /// The prefix records of the opened prefix `shards`; a prefix id stored twice is refused.
    pub fn new(shards: Vec<ShardFile>) -> Result<Prefixes> {
        let mut at = HashMap::new();
        for (s, shard) in shards.iter().enumerate() {
            for (r, e) in shard.entries.iter().enumerate() {
                if at.insert(e.sample_id, (s, r)).is_some() {
                    return Err(Error::corrupt(
                        &shard.path,
                        Some(e.sample_id),
                        e.offset,
                        "prefix record (its id is also another prefix record's)",
                    ));
                }
            }
        }
        Ok(Prefixes {
            shards,
            at,
            cache: Mutex::new(Vec::new()),
        })
    }

    /// The prefix shards, in manifest order.
    pub fn shards(&self) -> &[ShardFile] {
        &self.shards
    }

    /// Where the prefix record `p` names is, once checked to be that prefix (its token count and
    /// digest); the error names sample `record` of `shard`, which references it.
    pub fn resolve(&self, shard: &ShardFile, record: usize, p: &PrefixRef) -> Result<(usize, usize)> {
        let e = &shard.entries[record];
        let refused =
            |what: String| Error::corrupt(&shard.path, Some(e.sample_id), e.offset, format!("record ({what})"));
        let Some(&(s, r)) = self.at.get(&p.id) else {
            return Err(refused(format!(
                "references prefix record {}, which the dataset does not hold",
                p.id
            )));
        };
        let (found, key) = (&self.shards[s].entries[r], self.shards[s].key(r));
        if found.n_tokens != p.n_tokens || key != prefix_key(&p.digest) {
            return Err(refused(format!(
                "references prefix record {} as {} tokens with {}, but it holds {} tokens with {key}",
                p.id,
                p.n_tokens,
                prefix_key(&p.digest),
                found.n_tokens
            )));
        }
        Ok((s, r))
    }

    /// Fills the first `p.n_tokens` stored rows of every buffer in `outs` (sample `record` of `shard`,
    /// whose record references `p`) from the prefix record.
    pub fn fill(&self, shard: &ShardFile, record: usize, p: &PrefixRef, outs: &mut [&mut [u8]]) -> Result<()> {
        let rows = self.rows(shard, record, p)?;
        for (out, src) in outs.iter_mut().zip(rows.iter()) {
            out[..src.len()].copy_from_slice(src);
        }
        Ok(())
    }

    /// `fill` of tensor `t` alone.
    pub fn fill_tensor(&self, shard: &ShardFile, record: usize, p: &PrefixRef, t: usize, out: &mut [u8]) -> Result<()> {
        let rows = self.rows(shard, record, p)?;
        out[..rows[t].len()].copy_from_slice(&rows[t]);
        Ok(())
    }

    /// The stored rows of the prefix `p` references (from the cache, or decoded into it).
    fn rows(&self, shard: &ShardFile, record: usize, p: &PrefixRef) -> Result<Rows> {
        let (s, r) = self.resolve(shard, record, p)?;
        let slot = {
            let mut cache = lock(&self.cache);
            let slot = match cache.iter().position(|(id, _)| *id == p.id) {
                Some(k) => cache.remove(k).1,
                None => Arc::default(),
            };
            cache.push((p.id, slot.clone()));
            slot
        };
        let rows = {
            let mut held = lock(&slot.rows);
            match &*held {
                Some(rows) => rows.clone(),
                None => {
                    let rows = Arc::new(self.decode(s, r).map_err(|err| {
                        let e = &shard.entries[record];
                        Error::corrupt(
                            &shard.path,
                            Some(e.sample_id),
                            e.offset,
                            format!("record (its prefix record {} is unreadable: {err})", p.id),
                        )
                    })?);
                    *held = Some(rows.clone());
                    rows
                }
            }
        };
        self.evict(p.id);
        Ok(rows)
    }

    /// Drops the least recently used prefixes (never `keep`) while the cache holds more than
    /// `PREFIX_CACHE_BYTES`.
    fn evict(&self, keep: u64) {
        let mut cache = lock(&self.cache);
        let size = |slot: &Slot| match slot.rows.try_lock() {
            Ok(rows) => rows.as_ref().map_or(0, |r| r.iter().map(Vec::len).sum()),
            Err(_) => 0, // being decoded
        };
        let mut total: usize = cache.iter().map(|(_, s)| size(s)).sum();
        let mut k = 0;
        while total > PREFIX_CACHE_BYTES && k < cache.len() {
            if cache[k].0 == keep {
                k += 1;
                continue;
            }
            total -= size(&cache[k].1);
            cache.remove(k);
        }
    }

    /// Reads, checksums and decodes prefix record `r` of prefix shard `s` as stored rows, on the
    /// calling thread (a pool thread waiting on a decode would otherwise steal a read that waits
    /// on this prefix's lock).
    pub fn decode(&self, s: usize, r: usize) -> Result<Vec<Vec<u8>>> {
        let shard = &self.shards[s];
        let e = &shard.entries[r];
        let mut buf = Vec::new();
        let rec = shard.read_record(r, &mut buf)?;
        let mut rows = Vec::with_capacity(shard.schema.tensors.len());
        for (t, spec) in shard.schema.tensors.iter().enumerate() {
            let mut out = vec![0u8; (e.n_tokens * spec.stored_row_bytes()) as usize];
            if decode_tensor(shard, r, rec, t, &mut out)?.is_some() {
                return Err(Error::corrupt(
                    &shard.path,
                    Some(e.sample_id),
                    e.offset,
                    "prefix record (it references a prefix itself)",
                ));
            }
            rows.push(out);
        }
        Ok(rows)
    }

    /// Checks prefix record `r` of prefix shard `s`, decoded as `rows`: its key is the digest of its
    /// token ids (`verify`).
    pub fn check_digest(&self, s: usize, r: usize, rows: &[Vec<u8>]) -> Result<()> {
        let shard = &self.shards[s];
        let e = &shard.entries[r];
        let corrupt = |what: String| Error::corrupt(&shard.path, Some(e.sample_id), e.offset, what);
        let t = token_ids_tensor(&shard.schema)
            .ok_or_else(|| corrupt("prefix record (the schema has no int64 input_ids tensor)".into()))?;
        let digest = prefix_key(&token_digest(&rows[t]));
        if shard.key(r) != digest {
            return Err(corrupt(format!(
                "prefix record (its key is {}, its token ids' digest {digest})",
                shard.key(r)
            )));
        }
        Ok(())
    }
}
