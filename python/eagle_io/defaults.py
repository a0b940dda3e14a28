"""Every tunable's default, defined once: in the Rust core (``WriterOptions::default`` in
``src/dataset/writer.rs``, ``CodecOptions::default`` in ``src/codec/mod.rs``, the ring's constants in
``src/ring/mod.rs``, ``FetchOptions::default`` in ``src/storage/fetch.rs``), exported as
``eagle_io._native.DEFAULTS``. The writer, the capture ring, ``eagle_io.capture``, the object-storage reader,
the SGLang capture, ``import-specforge`` and the command line (options, progress lines) all take their defaults
from here.
"""

from __future__ import annotations

from ._native import DEFAULTS as _CORE

SHARD_BYTES: int = _CORE["shard_bytes"]
"""A shard is committed once it reaches this many bytes."""
CHUNK_BYTES: int = _CORE["chunk_bytes"]
"""Decoded bytes per codec chunk (whole rows)."""
THREADS: int = _CORE["threads"]
"""Encoding threads; 0 = one per CPU."""
ZSTD_LEVEL: int = _CORE["zstd_level"]
"""zstd level of the byte planes (Huffman literals always on; -1000 = fast order-0 coding, benches/README.md)."""
QUEUE_DEPTH: int = _CORE["queue_depth"]
"""Encoded records in flight before the writer blocks its caller."""
RING_BYTES: int = _CORE["ring_bytes"]
"""Capture ring (arena) size in bytes, per writing process."""
RING_BATCH: int = _CORE["ring_batch"]
"""Committed samples the sink thread encodes together."""
RING_TIMEOUT_S: float = _CORE["ring_timeout_s"]
"""Seconds a producer waits on a full ring before ``RingTimeoutError``."""
DROP_WHEN_FULL: bool = _CORE["drop_when_full"]
"""Whether a producer facing a full ring drops the sample (counted, ``dropped_samples``) instead of waiting."""
FOLLOW_POLL_S: float = _CORE["follow_poll_s"]
"""Seconds between two looks at a followed capture's manifest (``ShardDataset(..., follow=True)``)."""
FOLLOW_TIMEOUT_S: float = _CORE["follow_timeout_s"]
"""Seconds a followed capture may go without committing a shard (nor completing) before ``CaptureStalledError``."""
STOP_TIMEOUT_S: float = _CORE["stop_timeout_s"]
"""Seconds ``stop_capture`` / ``SGLangCapture.close`` wait for every SGLang scheduler to drain, commit and answer."""
PROGRESS_LOG_S: float = _CORE["progress_log_s"]
"""Seconds between two progress lines when stderr is not a terminal (each a full line; a terminal gets a bar)."""
REMOTE_IN_FLIGHT: int = _CORE["remote_in_flight"]
"""Object-storage requests in flight at once per reader (a batch read's ranged GETs)."""
REMOTE_COALESCE_GAP: int = _CORE["remote_coalesce_gap"]
"""Records of one shard object at most this many bytes apart are fetched by one ranged GET in a batch read."""
REMOTE_PART_BYTES: int = _CORE["remote_part_bytes"]
"""Most bytes per ranged GET: a coalesced span stops there; a longer record is fetched in parts of this size."""
CACHE_BYTES: int = _CORE["cache_bytes"]
"""Size cap of a read-through cache directory (``Dataset(..., cache_dir=)``), least recently used shards evicted."""
STAGING_BYTES: int = _CORE["staging_bytes"]
"""Bytes of committed shards a capture to object storage (``out_dir="s3://..."``) keeps staged awaiting upload
before it blocks; the shard being written comes on top (docs/STORAGE.md)."""

# Shared prefixes stored once (docs/FORMAT.md 4.7): a capture's samples that begin with the same system prompt.
DEDUP_PREFIXES: bool = True
"""Whether a capture that can (into a local directory: the Hugging Face backend, and a live capture on SGLang)
stores a prefix shared by several samples once, as a prefix record each later sample references (``eagle-io
generate --dedup-prefixes``, ``eagle-io live start --dedup-prefixes``)."""
PREFIX_BLOCK_TOKENS: int = 64
"""A shared prefix is a multiple of this many tokens, and at least this many (shorter ones are stored whole)."""
PREFIX_DIGESTS_KEPT: int = 1 << 16
"""Block digests of earlier samples a capture remembers to find shared prefixes (about 100 bytes each; least
recently seen forgotten first): bounds a live capture's memory over served traffic."""

# The client of a running SGLang server (eagle_io.capture(url), eagle-io generate --server): client-side only.
SERVER_CONCURRENCY: int = 32
"""Sample requests in flight at once per server (speculators' data generation runs 32; SpecForge's 64)."""
SERVER_RETRIES: int = 3
"""Retries of a sample request that failed to reach the server (connection error, HTTP 5xx or 429), with backoff."""
SERVER_BACKOFF_S: float = 1.0
"""The first retry's wait; each further one waits twice as long."""
SERVER_REQUEST_TIMEOUT_S: float = 600.0
"""Seconds one HTTP request to the server may take (a sample request waits for its prefill, or its answer)."""

# The operator's bounds on a remote capture (capturing/sglang/operator.py) where EAGLE_IO_CAPTURE_LIMITS sets none.
CAPTURE_MAX_RING_BYTES: int = 4 * RING_BYTES
"""The largest capture ring a client may ask a server's scheduler for."""


# A capture inside a serving SGLang scheduler (eagle-io live, capturing/sglang/live.py and handoff.py).
LIVE_MAX_INFLIGHT: int = 64
"""Sampled requests of a live capture not finished yet (each holds its rows in device memory until it finishes)."""
LIVE_ADMIT_TTL_S: float = 600.0
"""A sampled request not in any forward this long after it arrived is forgotten (counted ``never_started``): SGLang
aborts waiting requests without a hook the capture sees."""
HANDOFF_SLOTS: int = 64
"""Finished samples waiting for the capture's hand-off thread (value checks, ring copy); a live capture drops the
sample when they are all taken (counted ``queue_full``), a client-driven one waits. SpecForge's online-live queue
holds 64 too."""

# eagle-io swap-draft (eagle_io.spec.swap): the served accept length that proves a swap.
SWAP_PROMPTS: tuple[tuple[int, ...], ...] = (
    (1, 2, 3, 4, 5, 6, 7, 8),
    (10, 20, 30, 40, 50, 60),
    (11, 13, 17, 19, 23, 29, 31, 37),
    (5, 15, 25, 35, 45, 55, 65, 75, 85),
)
"""The prompts (token ids, every one below 100: valid for any target vocabulary) a swap is checked on when the caller
gives none; a served traffic's own prompts (``--prompts-file``) measure a draft better."""
SWAP_MAX_NEW_TOKENS: int = 32
"""New tokens per check prompt, greedy."""
SWAP_ACCEPT_FLOOR: float = 1.2
"""A swap whose served accept length (SGLang's pooled count) stays below this is refused as collapsed (a draft whose
weights did not land accepts nothing: about 1.0)."""
SWAP_ACCEPT_FRACTION: float = 0.5
"""... or below this fraction of the accept length the new draft's ``speculation_profile.json`` predicts."""
