//! Per-thread zstd contexts (creating one per chunk would cost more than small chunks take
//! to compress) and the "store raw when compression does not pay" rule.

use std::cell::RefCell;

use zstd::bulk::{Compressor, Decompressor};
use zstd::zstd_safe::{CParameter, ParamSwitch};

thread_local! {
    /// One context per level in use (the writer alternates INT_LEVEL and the float level: one
    /// context re-created at every switch cost a context allocation and reset per tensor).
    static CCTX: RefCell<Vec<(i32, Compressor<'static>)>> = const { RefCell::new(Vec::new()) };
    static DCTX: RefCell<Option<Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Compression contexts a thread keeps (one per zstd level, the least recently created dropped).
const MAX_CONTEXTS: usize = 4;

/// Compression must save at least 1/32 (about 3%) of the bytes to be kept.
pub fn pays(compressed: usize, raw: usize) -> bool {
    compressed + raw / 32 < raw
}

fn compress(data: &[u8], level: i32) -> Vec<u8> {
    let mut out = Vec::new();
    compress_append(data, level, &mut out);
    out
}

/// Appends the zstd frame of `data` to `out` (growing it once to the frame's bound: no
/// intermediate buffer) and returns the frame's length.
pub fn compress_append(data: &[u8], level: i32, out: &mut Vec<u8>) -> usize {
    out.reserve(zstd::zstd_safe::compress_bound(data.len()));
    let start = out.len();
    CCTX.with(|cell| {
        let mut contexts = cell.borrow_mut();
        let at = match contexts.iter().position(|(l, _)| *l == level) {
            Some(at) => at,
            None => {
                let mut c = Compressor::new(level).expect("zstd accepts every level in its range");
                // Huffman-code literals at every level (negative levels would store them raw).
                c.set_parameter(CParameter::LiteralCompressionMode(ParamSwitch::Enable))
                    .expect("a valid parameter");
                if contexts.len() == MAX_CONTEXTS {
                    contexts.remove(0);
                }
                contexts.push((level, c));
                contexts.len() - 1
            }
        };
        let (_, c) = &mut contexts[at];
        let mut at = std::io::Cursor::new(&mut *out);
        at.set_position(start as u64);
        c.compress_to_buffer(data, &mut at)
            .expect("compressing into a buffer of the frame's bound cannot fail")
    })
}

/// False when the first `probe` bytes of a longer `data` do not compress enough to pay:
/// the whole of `data` is then stored raw without compressing it (e.g. a mantissa plane).
pub fn probe_pays(data: &[u8], level: i32, probe: usize) -> bool {
    data.len() <= probe || pays(compress(&data[..probe], level).len(), probe)
}

/// The zstd frame of `data` when it pays, `None` when `data` should be stored raw.
pub fn compress_if_pays(data: &[u8], level: i32) -> Option<Vec<u8>> {
    if data.is_empty() {
        return None;
    }
    let z = compress(data, level);
    pays(z.len(), data.len()).then_some(z)
}

/// Decompresses exactly one zstd frame (nothing after it) into `out`, which it must fill exactly.
pub fn decompress_exact(frame: &[u8], out: &mut [u8]) -> Result<(), String> {
    match zstd::zstd_safe::find_frame_compressed_size(frame) {
        Ok(n) if n == frame.len() => {}
        Ok(n) => return Err(format!("{} bytes follow the zstd frame", frame.len() - n)),
        Err(_) => return Err("not a complete zstd frame".into()),
    }
    DCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Decompressor::new().map_err(|e| format!("zstd context: {e}"))?);
        }
        let d = slot.as_mut().expect("set above");
        let n = d
            .decompress_to_buffer(frame, out)
            .map_err(|e| format!("zstd frame does not decode: {e}"))?;
        if n != out.len() {
            return Err(format!("zstd frame decodes to {n} bytes, expected {}", out.len()));
        }
        Ok(())
    })
}
