//! Per-thread zstd contexts (creating one per chunk would cost more than small chunks take
//! to compress) and the "store raw when compression does not pay" rule.

use std::cell::RefCell;

use zstd::bulk::{Compressor, Decompressor};

thread_local! {
    static CCTX: RefCell<Option<(i32, Compressor<'static>)>> = const { RefCell::new(None) };
    static DCTX: RefCell<Option<Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Compression must save at least 1/32 (about 3%) of the bytes to be kept.
fn pays(compressed: usize, raw: usize) -> bool {
    compressed + raw / 32 < raw
}

fn compress(data: &[u8], level: i32) -> Vec<u8> {
    CCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().map(|(l, _)| *l) != Some(level) {
            let c = Compressor::new(level).expect("zstd accepts every level in its range");
            *slot = Some((level, c));
        }
        let (_, c) = slot.as_mut().expect("set above");
        c.compress(data)
            .expect("compressing into a growable buffer cannot fail")
    })
}

/// Returns the zstd frame of `data` when it pays, `None` when `data` should be stored raw.
/// Inputs longer than `probe` bytes are first tried on their first `probe` bytes.
pub fn compress_if_pays(data: &[u8], level: i32, probe: usize) -> Option<Vec<u8>> {
    if data.is_empty() {
        return None;
    }
    if data.len() > probe && !pays(compress(&data[..probe], level).len(), probe) {
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
            return Err(format!(
                "zstd frame decodes to {n} bytes, expected {}",
                out.len()
            ));
        }
        Ok(())
    })
}
