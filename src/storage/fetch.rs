//! Batched ranged reads of objects. A batch's records are grouped into spans (records of one
//! object separated by at most `coalesce_gap` bytes, up to `part_bytes` per span; a record larger
//! than `part_bytes` alone is cut into parts of at most `part_bytes`), one ranged GET each, and the
//! GETs run on the storage runtime with at most `in_flight` of them in flight per reader, the
//! caller blocked (outside the GIL) until all are in.

use std::ops::Range;
use std::sync::Arc;

use tokio::sync::Semaphore;

use super::body::{Body, Fetched};
use super::remote::RemoteObject;
use crate::error::{Error, Result};

/// How a reader fetches records from object storage (`_native.DEFAULTS`: `remote_in_flight`,
/// `remote_coalesce_gap`, `remote_part_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchOptions {
    /// Requests in flight at once per reader (at least 1).
    pub in_flight: usize,
    /// Records of one object at most this many bytes apart are fetched by one GET (the bytes
    /// between them are fetched and dropped).
    pub coalesce_gap: u64,
    /// Most bytes per GET: a span stops growing there; a longer record is fetched in parts.
    pub part_bytes: u64,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            in_flight: 8,
            coalesce_gap: 256 << 10,
            part_bytes: 8 << 20,
        }
    }
}

/// Records fetched by one GET (or by several parts, for one record longer than `part_bytes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// Index of the object in the caller's list of objects.
    pub object: usize,
    pub bytes: Range<u64>,
    /// Indexes of the requests it carries.
    pub members: Vec<usize>,
}

/// Groups the requests `(object, offset, len)` into spans (see the module doc). Every request
/// is in exactly one span; spans never mix objects.
pub fn plan(requests: &[(usize, u64, u64)], coalesce_gap: u64, part_bytes: u64) -> Vec<Span> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| (requests[i].0, requests[i].1));
    let mut spans: Vec<Span> = Vec::new();
    for i in order {
        let (object, offset, len) = requests[i];
        let end = offset + len;
        if let Some(s) = spans.last_mut() {
            let joins = s.object == object
                && offset <= s.bytes.end.saturating_add(coalesce_gap)
                && end.max(s.bytes.end) - s.bytes.start <= part_bytes.max(1);
            if joins {
                s.bytes.end = s.bytes.end.max(end);
                s.members.push(i);
                continue;
            }
        }
        spans.push(Span {
            object,
            bytes: offset..end,
            members: vec![i],
        });
    }
    spans
}

/// `range` cut into consecutive parts of at most `part_bytes` (one part when it fits).
pub fn parts(range: &Range<u64>, part_bytes: u64) -> Vec<Range<u64>> {
    let step = part_bytes.max(1);
    let mut out = Vec::new();
    let mut at = range.start;
    while at < range.end {
        let end = (at + step).min(range.end);
        out.push(at..end);
        at = end;
    }
    if out.is_empty() {
        out.push(range.clone());
    }
    out
}

/// One reader's fetcher: its options and its bound on requests in flight (shared by every
/// thread reading through that reader).
pub struct Fetcher {
    options: FetchOptions,
    permits: Arc<Semaphore>,
}

impl Fetcher {
    pub fn new(options: FetchOptions) -> Result<Fetcher> {
        if options.in_flight == 0 || options.part_bytes == 0 {
            return Err(Error::InvalidArgument(format!(
                "remote reads need in_flight >= 1 and part_bytes >= 1 (got in_flight={}, part_bytes={})",
                options.in_flight, options.part_bytes
            )));
        }
        Ok(Fetcher {
            options,
            permits: Arc::new(Semaphore::new(options.in_flight)),
        })
    }

    /// The bytes of each request `(object, offset, len)`, in order: coalesced and fetched as
    /// the module doc says. A request whose GET failed gets that GET's error.
    pub fn fetch(&self, requests: &[(&RemoteObject, u64, u64)]) -> Vec<Result<Fetched>> {
        let mut out: Vec<Option<Result<Fetched>>> = (0..requests.len()).map(|_| None).collect();
        self.fetch_each(requests, |i, got| out[i] = Some(got));
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Internal("a fetched record was in no span".into()))))
            .collect()
    }

    /// As [`Fetcher::fetch`], handing each request's bytes (or error) to `ready(index, bytes)`
    /// on the calling thread as soon as its span is in, so the caller can decode while later
    /// spans are still in flight. A request's bytes are a view of its span's response body (no
    /// copy; a span fetched in several parts has them joined once).
    pub fn fetch_each(&self, requests: &[(&RemoteObject, u64, u64)], mut ready: impl FnMut(usize, Result<Fetched>)) {
        let mut objects: Vec<&RemoteObject> = Vec::new();
        let keyed: Vec<(usize, u64, u64)> = requests
            .iter()
            .map(|&(obj, offset, len)| {
                let at = match objects.iter().position(|o| std::ptr::eq(*o, obj)) {
                    Some(at) => at,
                    None => {
                        objects.push(obj);
                        objects.len() - 1
                    }
                };
                (at, offset, len)
            })
            .collect();
        let spans = plan(&keyed, self.options.coalesce_gap, self.options.part_bytes);
        let Some(first) = objects.first() else { return };
        let runtime = match first.runtime() {
            Ok(r) => r,
            Err(e) => {
                for i in 0..requests.len() {
                    ready(i, Err(e.duplicate()));
                }
                return;
            }
        };
        // Every part of every span starts now (bounded by the reader's permits); spans are
        // awaited in order, each handed over when its last part is in.
        let mut handles = Vec::with_capacity(spans.len());
        for span in &spans {
            let parts: Vec<_> = parts(&span.bytes, self.options.part_bytes)
                .into_iter()
                .map(|part| {
                    let job = objects[span.object].range_future(part.start, part.end - part.start);
                    let permits = self.permits.clone();
                    runtime.spawn(async move {
                        let _permit = permits.acquire_owned().await;
                        job.await
                    })
                })
                .collect();
            handles.push(parts);
        }
        for (span, parts) in spans.iter().zip(handles) {
            let got = runtime.block_on(async {
                let mut got: Vec<Body> = Vec::with_capacity(parts.len());
                for handle in parts {
                    got.push(handle.await.unwrap_or_else(|e| {
                        Err(Error::Internal(format!("an object-storage request panicked: {e}")))
                    })?);
                }
                Ok::<_, Error>(Arc::new(join_parts(got)))
            });
            for &m in &span.members {
                let (_, offset, len) = keyed[m];
                ready(
                    m,
                    match &got {
                        Ok(bytes) => {
                            let at = (offset - span.bytes.start) as usize;
                            Ok(Fetched::new(bytes.clone(), at..at + len as usize))
                        }
                        Err(e) => Err(e.duplicate()),
                    },
                );
            }
        }
    }
}

/// The parts of one span as one body: the part itself when there is one (no copy).
fn join_parts(mut parts: Vec<Body>) -> Body {
    if parts.len() == 1 {
        return parts.pop().expect("one part");
    }
    let mut joined = Body::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in &parts {
        joined.extend_from_slice(part);
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_records_share_a_span_up_to_the_part_size() {
        // Records 0..4 of object 0 back to back (10 bytes each), asked out of order.
        let reqs = [(0, 20, 10), (0, 0, 10), (0, 10, 10), (0, 30, 10)];
        let spans = plan(&reqs, 0, 25);
        assert_eq!(
            spans,
            vec![
                Span {
                    object: 0,
                    bytes: 0..20,
                    members: vec![1, 2]
                },
                Span {
                    object: 0,
                    bytes: 20..40,
                    members: vec![0, 3]
                },
            ]
        );
    }

    #[test]
    fn gaps_and_objects_split_spans() {
        let reqs = [(0, 0, 10), (0, 15, 10), (0, 100, 10), (1, 25, 10)];
        let spans = plan(&reqs, 5, 1 << 20);
        let bytes: Vec<_> = spans.iter().map(|s| (s.object, s.bytes.clone())).collect();
        assert_eq!(bytes, vec![(0, 0..25), (0, 100..110), (1, 25..35)]);
        assert_eq!(plan(&reqs, 4, 1 << 20).len(), 4);
    }

    #[test]
    fn a_long_record_is_fetched_in_parts() {
        assert_eq!(parts(&(10..35), 10), vec![10..20, 20..30, 30..35]);
        assert_eq!(parts(&(10..20), 10), vec![10..20]);
        let spans = plan(&[(0, 0, 30), (0, 30, 5)], 0, 10);
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].bytes, 0..30);
    }
}
