//! Objects in an S3-compatible store, read with ranged GETs through the `object_store` crate.
//!
//! One tokio runtime per process (rebuilt after `fork`, like the decode pool: a forked child,
//! e.g. a DataLoader worker, has none of its parent's threads) runs every request; callers
//! block on it outside the GIL. Clients are built once per bucket and process from the
//! standard environment (`AWS_ENDPOINT`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_REGION`, `AWS_ALLOW_HTTP`, ...: docs/STORAGE.md). Transient failures (5xx, 429,
//! timeouts) are retried by `object_store` with exponential backoff; every request and every
//! such failure is counted ([`stats`]).

use std::cell::Cell;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use object_store::aws::AmazonS3Builder;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use tokio::runtime::Runtime;

use futures_util::StreamExt;

use super::body::Body;
use super::ByteSource;
use crate::error::{Error, Result};

/// Bytes fetched from each end of an object when it is opened: the header and schema sit at
/// the start of a shard, the footer and (usually) the whole index at its end.
const HEAD_BYTES: u64 = 64 << 10;
const TAIL_BYTES: u64 = 256 << 10;

static REQUESTS: AtomicU64 = AtomicU64::new(0);
static FAILURES: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

/// Counters of this process's object-storage traffic since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StorageStats {
    /// HTTP requests sent (retries included).
    pub requests: u64,
    /// Requests that failed transiently (5xx, 429, timeout, connection error) and were
    /// retried with backoff unless the retry budget was spent.
    pub retried: u64,
    /// Payload bytes received by reads.
    pub bytes: u64,
}

/// This process's object-storage counters.
pub fn stats() -> StorageStats {
    StorageStats {
        requests: REQUESTS.load(Ordering::Relaxed),
        retried: FAILURES.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
    }
}

tokio::task_local! {
    /// The HTTP status of the last failed response of the operation running in this task,
    /// so that an error can name it.
    static LAST_STATUS: Cell<Option<u16>>;
}

/// Counts requests and transient failures, and notes each failed status.
#[derive(Debug)]
struct Counting(HttpClient);

#[async_trait::async_trait]
impl HttpService for Counting {
    async fn call(&self, req: HttpRequest) -> std::result::Result<HttpResponse, HttpError> {
        REQUESTS.fetch_add(1, Ordering::Relaxed);
        let res = self.0.execute(req).await;
        let transient = match &res {
            Ok(r) => {
                let status = r.status().as_u16();
                if status >= 400 {
                    let _ = LAST_STATUS.try_with(|s| s.set(Some(status)));
                }
                status >= 500 || status == 429
            }
            Err(e) => matches!(
                e.kind(),
                HttpErrorKind::Connect | HttpErrorKind::Request | HttpErrorKind::Timeout | HttpErrorKind::Interrupted
            ),
        };
        if transient {
            FAILURES.fetch_add(1, Ordering::Relaxed);
        }
        res
    }
}

#[derive(Debug, Default)]
struct CountingConnector(ReqwestConnector);

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(Counting(self.0.connect(options)?)))
    }
}

struct Process {
    pid: u32,
    runtime: Arc<Runtime>,
    /// One client per `scheme://bucket` and endpoint (`AWS_ENDPOINT` as it was when built).
    stores: HashMap<String, Arc<dyn ObjectStore>>,
}

static PROCESS: Mutex<Option<Process>> = Mutex::new(None);

/// An object URL split into its store (`s3://bucket`) and the key in it.
pub struct ObjectUrl {
    pub full: String,
    store: String,
    pub key: ObjectPath,
}

type Url = ObjectUrl;

pub fn parse(path: &Path) -> Result<Url> {
    let full = path.to_string_lossy().into_owned();
    let bad = |what: &str| Error::Storage {
        url: full.clone(),
        status: None,
        message: what.to_owned(),
    };
    let (scheme, rest) = full.split_once("://").ok_or_else(|| bad("not an object URL"))?;
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(bad("no bucket in the URL"));
    }
    let key = ObjectPath::parse(key).map_err(|e| bad(&format!("bad object key ({e})")))?;
    Ok(Url {
        store: format!("{scheme}://{bucket}"),
        full,
        key,
    })
}

/// The process's runtime and the client of `url`'s bucket, built on first use.
fn client(url: &Url) -> Result<(Arc<Runtime>, Arc<dyn ObjectStore>)> {
    let pid = std::process::id();
    let mut slot = PROCESS.lock().unwrap_or_else(|p| p.into_inner());
    if slot.as_ref().is_none_or(|p| p.pid != pid) {
        // A parent's runtime has no threads in this (forked) process: dropping it could wait
        // on them forever, so it is leaked.
        if let Some(stale) = slot.take() {
            std::mem::forget(stale);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("eagle-io-storage")
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("cannot start the object-storage runtime: {e}")))?;
        *slot = Some(Process {
            pid,
            runtime: Arc::new(runtime),
            stores: HashMap::new(),
        });
    }
    let process = slot.as_mut().expect("set above");
    let endpoint = std::env::var("AWS_ENDPOINT")
        .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
        .unwrap_or_default();
    let profile_name = std::env::var("AWS_PROFILE").unwrap_or_default();
    let cache_key = format!("{} {endpoint} {profile_name}", url.store);
    if let Some(store) = process.stores.get(&cache_key) {
        return Ok((process.runtime.clone(), store.clone()));
    }
    let store: Arc<dyn ObjectStore> = if url.store.starts_with("s3://") {
        let built = with_profile(AmazonS3Builder::from_env(), &url.full)?
            .with_url(url.store.clone())
            .with_http_connector(CountingConnector::default())
            .build()
            .map_err(|e| storage_error(&url.full, e, None))?;
        Arc::new(built)
    } else {
        return Err(Error::Storage {
            url: url.full.clone(),
            status: None,
            message: "unsupported URL scheme (this build reads s3:// URLs, which cover S3-compatible stores; \
                      GCS and Azure are object_store features not built in)"
                .into(),
        });
    };
    process.stores.insert(cache_key, store.clone());
    Ok((process.runtime.clone(), store))
}

/// `builder` with what the AWS profile sets (`super::profile`) and the environment does not.
fn with_profile(mut builder: AmazonS3Builder, url: &str) -> Result<AmazonS3Builder> {
    let profile = super::profile::load().map_err(|e| match e {
        Error::Storage { url: file, message, .. } => Error::Storage {
            url: url.to_owned(),
            status: None,
            message: format!("{file}: {message}"),
        },
        other => other,
    })?;
    let unset = |vars: &[&str]| vars.iter().all(|v| std::env::var_os(v).is_none());
    if unset(&["AWS_ACCESS_KEY_ID"]) {
        if let Some(key) = profile.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = profile.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        if let Some(token) = profile.session_token {
            builder = builder.with_token(token);
        }
    }
    if let Some(region) = profile.region.filter(|_| unset(&["AWS_REGION", "AWS_DEFAULT_REGION"])) {
        builder = builder.with_region(region);
    }
    if let Some(endpoint) = profile
        .endpoint_url
        .filter(|_| unset(&["AWS_ENDPOINT", "AWS_ENDPOINT_URL"]))
    {
        builder = builder.with_endpoint(endpoint);
    }
    Ok(builder)
}

/// The HTTP status `err` stands for, when its variant says it.
fn variant_status(err: &object_store::Error) -> Option<u16> {
    match err {
        object_store::Error::NotFound { .. } => Some(404),
        object_store::Error::PermissionDenied { .. } => Some(403),
        object_store::Error::Unauthenticated { .. } => Some(401),
        object_store::Error::Precondition { .. } => Some(412),
        object_store::Error::NotModified { .. } => Some(304),
        _ => None,
    }
}

fn storage_error(url: &str, err: object_store::Error, seen: Option<u16>) -> Error {
    let message = err.to_string();
    Error::Storage {
        url: url.to_owned(),
        status: variant_status(&err).or(seen),
        message: match no_credentials(&message) {
            Some(why) => format!(
                "no object-storage credentials found ({why}), so the cloud instance-metadata endpoint was \
                 asked for some and refused: set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or AWS_PROFILE \
                 with a credentials file (docs/STORAGE.md); it answered: {message}"
            ),
            None => message,
        },
    }
}

/// Why no credentials were configured, when `message` is a failed request to the instance-metadata
/// endpoint (object_store's last resort, `AWS_METADATA_ENDPOINT`, default 169.254.169.254): the real
/// cause of that error is that nothing else gave credentials. None when some source was configured.
fn no_credentials(message: &str) -> Option<String> {
    let endpoint = std::env::var("AWS_METADATA_ENDPOINT").unwrap_or_else(|_| "169.254.169.254".into());
    let host = endpoint
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .trim_end_matches('/');
    if host.is_empty() || !message.contains(host) {
        return None;
    }
    let set = |v: &str| std::env::var_os(v).is_some_and(|x| !x.is_empty());
    let sources = [
        "AWS_ACCESS_KEY_ID",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ];
    if sources.iter().any(|v| set(v)) {
        return None;
    }
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    match super::profile::load() {
        Ok(p) if p.access_key_id.is_some() => None,
        _ => Some(format!(
            "{} unset, and the AWS profile {profile:?} gives no aws_access_key_id",
            sources.join(", ")
        )),
    }
}

/// Runs one storage operation on the process runtime, mapping its error to `Error::Storage`
/// with the HTTP status of the failed response.
pub fn run<T>(
    url: &Url,
    op: impl FnOnce(
        Arc<dyn ObjectStore>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = object_store::Result<T>> + Send>>,
) -> Result<T> {
    let (runtime, store) = client(url)?;
    runtime.block_on(LAST_STATUS.scope(Cell::new(None), async move {
        let out = op(store).await;
        out.map_err(|e| storage_error(&url.full, e, LAST_STATUS.with(|s| s.get())))
    }))
}

/// The whole object at `path` (one GET).
pub fn get_all(path: &Path) -> Result<Vec<u8>> {
    let url = parse(path)?;
    let key = url.key.clone();
    let bytes = run(&url, move |store| {
        Box::pin(async move { store.get(&key).await?.bytes().await })
    })?;
    BYTES.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    Ok(bytes.to_vec())
}

/// The whole object and its ETag, or `None` when there is no such object (404).
pub fn get_with_etag(url: &Url) -> Result<Option<(Vec<u8>, Option<String>)>> {
    let key = url.key.clone();
    let got = run(url, move |store| {
        Box::pin(async move {
            match store.get(&key).await {
                Ok(r) => {
                    let etag = r.meta.e_tag.clone();
                    Ok(Some((r.bytes().await?, etag)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    })?;
    Ok(got.map(|(bytes, etag)| {
        BYTES.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        (bytes.to_vec(), etag)
    }))
}

/// The objects directly under the prefix `path` and under `path/{sub}` for each `sub`: their
/// URLs and sizes, in key order (one LIST request per folder, more only past 1000 objects).
pub fn list(path: &Path, subs: &[&str]) -> Result<Vec<(String, u64)>> {
    let root = path.to_string_lossy().trim_end_matches('/').to_owned();
    let mut out = Vec::new();
    for folder in std::iter::once(root.clone()).chain(subs.iter().map(|s| format!("{root}/{s}"))) {
        let url = parse(Path::new(&folder))?;
        let prefix = url.key.clone();
        let listed = run(&url, move |store| {
            Box::pin(async move { store.list_with_delimiter(Some(&prefix)).await })
        })?;
        let base = &url.store;
        out.extend(
            listed
                .objects
                .into_iter()
                .map(|m| (format!("{base}/{}", m.location), m.size)),
        );
    }
    out.sort();
    Ok(out)
}

/// One object, read by ranged GETs.
pub struct RemoteObject {
    url: Url,
    len: u64,
    /// `(offset, bytes)` fetched at open: the object's first and last bytes.
    prefetch: Mutex<Vec<(u64, bytes::Bytes)>>,
}

impl RemoteObject {
    /// Fetches the object's size and first `HEAD_BYTES` (one GET), then its last `TAIL_BYTES`
    /// when the object is larger (a second GET). (A bounded range, not a suffix one, comes
    /// first: some S3-compatible servers fail a suffix longer than the object.)
    pub fn open(path: &Path) -> Result<RemoteObject> {
        let url = parse(path)?;
        let key = url.key.clone();
        let (len, head) = run(&url, move |store| {
            Box::pin(async move {
                let got = store
                    .get_opts(
                        &key,
                        GetOptions::default().with_range(Some(GetRange::Bounded(0..HEAD_BYTES))),
                    )
                    .await?;
                let len = got.meta.size;
                Ok((len, got.bytes().await?))
            })
        })?;
        BYTES.fetch_add(head.len() as u64, Ordering::Relaxed);
        let head_len = head.len() as u64;
        let object = RemoteObject {
            url,
            len,
            prefetch: Mutex::new(vec![(0, head)]),
        };
        if len > head_len {
            let tail_at = len.saturating_sub(TAIL_BYTES).max(head_len);
            // Copied out (at most TAIL_BYTES), so the receive buffer goes back to the pool.
            let tail = bytes::Bytes::copy_from_slice(&object.get(tail_at, len - tail_at)?);
            object
                .prefetch
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((tail_at, tail));
        }
        Ok(object)
    }

    /// The object at `path`, of `len` bytes as its manifest says, without a request.
    pub fn sized(path: &Path, len: u64) -> Result<RemoteObject> {
        Ok(RemoteObject {
            url: parse(path)?,
            len,
            prefetch: Mutex::new(Vec::new()),
        })
    }

    /// Bytes `offset..offset + len` in one ranged GET; fewer bytes than asked is an error.
    fn get(&self, offset: u64, len: u64) -> Result<Body> {
        self.runtime()?.block_on(self.range_future(offset, len))
    }

    /// The process's storage runtime, which runs [`RemoteObject::range_future`]s.
    pub fn runtime(&self) -> Result<Arc<Runtime>> {
        Ok(client(&self.url)?.0)
    }

    /// The ranged GET of bytes `offset..offset + len` as a task for the storage runtime (it
    /// owns what it needs); fewer bytes than asked is an error naming the object and offset.
    pub fn range_future(
        &self,
        offset: u64,
        len: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Body>> + Send>> {
        let store = match client(&self.url) {
            Ok((_, store)) => store,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let (full, key) = (self.url.full.clone(), self.url.key.clone());
        Box::pin(LAST_STATUS.scope(Cell::new(None), async move {
            let failed = |e| storage_error(&full, e, LAST_STATUS.with(|s| s.get()));
            let range = GetOptions::default().with_range(Some(GetRange::Bounded(offset..offset + len)));
            let mut stream = store.get_opts(&key, range).await.map_err(failed)?.into_stream();
            // The body is copied into a pooled buffer as it arrives (`body.rs`); a longer body
            // than asked is refused before it is buffered.
            let mut body = Body::with_capacity(len as usize);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(failed)?;
                if (body.len() + chunk.len()) as u64 > len {
                    return Err(Error::Storage {
                        url: full.clone(),
                        status: None,
                        message: format!("the server sent more than the {len} bytes asked at byte offset {offset}"),
                    });
                }
                body.extend_from_slice(&chunk);
            }
            BYTES.fetch_add(body.len() as u64, Ordering::Relaxed);
            if body.len() as u64 != len {
                return Err(Error::Storage {
                    url: full.clone(),
                    status: None,
                    message: format!(
                        "truncated object: {} of {len} bytes at byte offset {offset} (the object is shorter than \
                         its index says)",
                        body.len()
                    ),
                });
            }
            Ok(body)
        }))
    }
}

impl ByteSource for RemoteObject {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let end = offset + buf.len() as u64;
        {
            let blocks = self.prefetch.lock().unwrap_or_else(|p| p.into_inner());
            for (at, bytes) in blocks.iter() {
                if offset >= *at && end <= at + bytes.len() as u64 {
                    let start = (offset - at) as usize;
                    buf.copy_from_slice(&bytes[start..start + buf.len()]);
                    return Ok(());
                }
            }
        }
        if end > self.len {
            return Err(Error::Storage {
                url: self.url.full.clone(),
                status: None,
                message: format!(
                    "read of bytes {offset}..{end} past the end of a {}-byte object",
                    self.len
                ),
            });
        }
        buf.copy_from_slice(&self.get(offset, buf.len() as u64)?);
        Ok(())
    }

    fn remote(&self) -> Option<&RemoteObject> {
        Some(self)
    }

    fn forget_prefetch(&self) {
        self.prefetch.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}
