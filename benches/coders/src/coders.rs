//! The candidates. Each codes one plane into one self-contained frame (its table included) and
//! decodes it back into a slice of the plane's length, as the codec would per chunk and plane.

use std::os::raw::{c_int, c_uint};

pub trait Coder {
    fn name(&self) -> &'static str;
    fn encode(&mut self, plane: &[u8], out: &mut Vec<u8>);
    fn decode(&mut self, frame: &[u8], out: &mut [u8]);
    /// False where encode is another candidate's (a decoder-only crate).
    fn times_encode(&self) -> bool {
        true
    }
}

pub fn all() -> Vec<Box<dyn Coder>> {
    vec![
        Box::new(ZstdShipped::new()),
        Box::new(Huff0::new(HufDecoder::Auto)),
        Box::new(Huff0::new(HufDecoder::X1)),
        Box::new(Huff0::new(HufDecoder::X2)),
        Box::new(RuzstdDecode::new()),
        Box::new(Hts {
            name: "htscodecs rANS 4x8 order-0 (CRAM 3.0)",
            kind: HtsKind::R4x8,
        }),
        Box::new(Hts {
            name: "htscodecs rANS Nx16 order-0, 4-way",
            kind: HtsKind::R4x16(0),
        }),
        Box::new(Hts {
            name: "htscodecs rANS Nx16 order-0, 32-way (AVX2)",
            kind: HtsKind::R4x16(RANS_ORDER_X32),
        }),
        Box::new(ZlibHuffman::new()),
        Box::new(RygRans::default()),
        Box::new(Constriction),
    ]
}

// ---------------------------------------------------------------------------------------------
// zstd as shipped: level -1000, Huffman literals forced, one frame per plane.

pub struct ZstdShipped {
    c: zstd::bulk::Compressor<'static>,
    d: zstd::bulk::Decompressor<'static>,
}

impl ZstdShipped {
    fn new() -> Self {
        use zstd::zstd_safe::{CParameter, ParamSwitch};
        let mut c = zstd::bulk::Compressor::new(-1000).expect("context");
        c.set_parameter(CParameter::LiteralCompressionMode(ParamSwitch::Enable))
            .expect("parameter");
        ZstdShipped {
            c,
            d: zstd::bulk::Decompressor::new().expect("context"),
        }
    }
}

impl Coder for ZstdShipped {
    fn name(&self) -> &'static str {
        "zstd -1000, Huffman literals forced (shipped)"
    }
    fn encode(&mut self, plane: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.reserve(zstd::zstd_safe::compress_bound(plane.len()));
        self.c.compress_to_buffer(plane, out).expect("compresses");
    }
    fn decode(&mut self, frame: &[u8], out: &mut [u8]) {
        let n = self.d.decompress_to_buffer(frame, out).expect("decodes");
        assert_eq!(n, out.len());
    }
}

// ---------------------------------------------------------------------------------------------
// zstd's Huffman stage alone: huff0 (`HUF_compress4X_repeat`, `HUF_decompress4X_hufOnly_wksp`,
// internal symbols of the libzstd that zstd-sys builds) on 128 KB blocks, a fresh table each,
// as zstd codes literals at level -1000 but without the frame, block and sequence machinery.
// Frame: per block its coded size (u32; 0 = stored raw), then the coded bytes.

const HUF_BLOCK: usize = 128 * 1024;
const HUF_TABLELOG: u32 = 11; // zstd's for literals
const HUF_DTABLE_LOG: u32 = 12;
const HUF_FLAGS_BMI2: c_int = 1;

extern "C" {
    fn HUF_compress4X_repeat(
        dst: *mut u8,
        dst_size: usize,
        src: *const u8,
        src_size: usize,
        max_symbol_value: c_uint,
        table_log: c_uint,
        work_space: *mut u64,
        wksp_size: usize,
        huf_table: *mut usize,
        repeat: *mut c_int,
        flags: c_int,
    ) -> usize;
    fn HUF_decompress4X_hufOnly_wksp(
        dctx: *mut u32,
        dst: *mut u8,
        dst_size: usize,
        c_src: *const u8,
        c_src_size: usize,
        work_space: *mut u32,
        wksp_size: usize,
        flags: c_int,
    ) -> usize;
    fn HUF_readDTableX1_wksp(
        dtable: *mut u32,
        src: *const u8,
        src_size: usize,
        work_space: *mut u32,
        wksp_size: usize,
        flags: c_int,
    ) -> usize;
    fn HUF_readDTableX2_wksp(
        dtable: *mut u32,
        src: *const u8,
        src_size: usize,
        work_space: *mut u32,
        wksp_size: usize,
        flags: c_int,
    ) -> usize;
    fn HUF_decompress4X_usingDTable(
        dst: *mut u8,
        max_dst_size: usize,
        c_src: *const u8,
        c_src_size: usize,
        dtable: *const u32,
        flags: c_int,
    ) -> usize;
}

/// Which huff0 decoder: zstd's choice (`HUF_selectDecoder`, X2 on these planes), or forced
/// single-symbol (X1) or double-symbol (X2) tables.
#[derive(Clone, Copy, PartialEq)]
pub enum HufDecoder {
    Auto,
    X1,
    X2,
}

fn zstd_is_error(r: usize) -> bool {
    r > usize::MAX - 200
}

pub struct Huff0 {
    wksp: Vec<u64>,
    ctable: Vec<usize>,
    dtable: Vec<u32>,
    dwksp: Vec<u32>,
    bmi2: c_int,
    dec: HufDecoder,
}

impl Huff0 {
    fn new(dec: HufDecoder) -> Self {
        let bmi2 = if std::is_x86_feature_detected!("bmi2") {
            HUF_FLAGS_BMI2
        } else {
            0
        };
        Huff0 {
            wksp: vec![0; 4096],
            ctable: vec![0; 1024],
            dtable: vec![0; 1 + (1 << HUF_DTABLE_LOG)],
            dwksp: vec![0; 4096],
            bmi2,
            dec,
        }
    }
}

impl Coder for Huff0 {
    fn name(&self) -> &'static str {
        match self.dec {
            HufDecoder::Auto => "zstd's huff0 alone (zstd-sys, 128 KB blocks, 4 streams)",
            HufDecoder::X1 => "zstd's huff0 alone, single-symbol decoder (X1) forced",
            HufDecoder::X2 => "zstd's huff0 alone, double-symbol decoder (X2) forced",
        }
    }
    fn times_encode(&self) -> bool {
        self.dec == HufDecoder::Auto
    }
    fn encode(&mut self, plane: &[u8], out: &mut Vec<u8>) {
        out.clear();
        for block in plane.chunks(HUF_BLOCK) {
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            let cap = block.len() + 1024;
            out.reserve(cap);
            let mut repeat: c_int = 0; // HUF_repeat_none
                                       // SAFETY: huff0 writes at most `cap` bytes into the reserved tail; the workspace and
                                       // table are larger than HUF_WORKSPACE_SIZE and HUF_CTABLE_SIZE(255).
            let r = unsafe {
                HUF_compress4X_repeat(
                    out.as_mut_ptr().add(out.len()),
                    cap,
                    block.as_ptr(),
                    block.len(),
                    255,
                    HUF_TABLELOG,
                    self.wksp.as_mut_ptr(),
                    self.wksp.len() * 8,
                    self.ctable.as_mut_ptr(),
                    &mut repeat,
                    self.bmi2,
                )
            };
            assert!(!zstd_is_error(r), "HUF_compress4X_repeat failed");
            if r <= 1 || r >= block.len() {
                out.extend_from_slice(block); // not compressible (or one repeated byte): raw
            } else {
                // SAFETY: huff0 wrote `r` bytes there.
                unsafe { out.set_len(out.len() + r) };
                out[at..at + 4].copy_from_slice(&(r as u32).to_le_bytes());
            }
        }
    }
    fn decode(&mut self, frame: &[u8], out: &mut [u8]) {
        let mut i = 0;
        for block in out.chunks_mut(HUF_BLOCK) {
            let n = u32::from_le_bytes(frame[i..i + 4].try_into().unwrap()) as usize;
            i += 4;
            if n == 0 {
                block.copy_from_slice(&frame[i..i + block.len()]);
                i += block.len();
                continue;
            }
            self.dtable[0] = (HUF_DTABLE_LOG - 1) * 0x0100_0001; // HUF_CREATE_STATIC_DTABLEX2
                                                                 // SAFETY: the DTable holds HUF_DTABLE_SIZE(12) entries, the workspace more than
                                                                 // HUF_DECOMPRESS_WORKSPACE_SIZE; huff0 writes exactly `block.len()` bytes.
            let (dt, src, wk, wn, f) = (
                self.dtable.as_mut_ptr(),
                frame[i..].as_ptr(),
                self.dwksp.as_mut_ptr(),
                self.dwksp.len() * 4,
                self.bmi2,
            );
            let r = unsafe {
                match self.dec {
                    HufDecoder::Auto => {
                        HUF_decompress4X_hufOnly_wksp(dt, block.as_mut_ptr(), block.len(), src, n, wk, wn, f)
                    }
                    HufDecoder::X1 | HufDecoder::X2 => {
                        let h = if self.dec == HufDecoder::X1 {
                            HUF_readDTableX1_wksp(dt, src, n, wk, wn, f)
                        } else {
                            HUF_readDTableX2_wksp(dt, src, n, wk, wn, f)
                        };
                        assert!(!zstd_is_error(h), "HUF_readDTable failed");
                        HUF_decompress4X_usingDTable(block.as_mut_ptr(), block.len(), src.add(h), n - h, dt, f)
                    }
                }
            };
            assert!(
                !zstd_is_error(r) && r == block.len(),
                "HUF_decompress4X_hufOnly_wksp failed"
            );
            i += n;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ruzstd: the pure-Rust zstd decoder on the same frames (encode is zstd's, not timed).

pub struct RuzstdDecode {
    zstd: ZstdShipped,
    d: ruzstd::decoding::FrameDecoder,
}

impl RuzstdDecode {
    fn new() -> Self {
        RuzstdDecode {
            zstd: ZstdShipped::new(),
            d: ruzstd::decoding::FrameDecoder::new(),
        }
    }
}

impl Coder for RuzstdDecode {
    fn name(&self) -> &'static str {
        "ruzstd 0.9 decoding the shipped frames"
    }
    fn encode(&mut self, plane: &[u8], out: &mut Vec<u8>) {
        self.zstd.encode(plane, out)
    }
    fn decode(&mut self, frame: &[u8], out: &mut [u8]) {
        let n = self.d.decode_all(frame, out).expect("decodes");
        assert_eq!(n, out.len());
    }
    fn times_encode(&self) -> bool {
        false
    }
}

// ---------------------------------------------------------------------------------------------
// htscodecs (through hts-sys, which compiles htslib with its htscodecs submodule).

const RANS_ORDER_X32: c_int = 0x04;

extern "C" {
    fn rans_compress_bound_4x16(size: c_uint, order: c_int) -> c_uint;
    fn rans_compress_to_4x16(
        input: *mut u8,
        in_size: c_uint,
        out: *mut u8,
        out_size: *mut c_uint,
        order: c_int,
    ) -> *mut u8;
    fn rans_uncompress_to_4x16(input: *mut u8, in_size: c_uint, out: *mut u8, out_size: *mut c_uint) -> *mut u8;
    fn rans_compress(input: *mut u8, in_size: c_uint, out_size: *mut c_uint, order: c_int) -> *mut u8;
    fn rans_uncompress(input: *mut u8, in_size: c_uint, out_size: *mut c_uint) -> *mut u8;
}

#[derive(Clone, Copy)]
enum HtsKind {
    R4x8,
    R4x16(c_int),
}

pub struct Hts {
    name: &'static str,
    kind: HtsKind,
}

impl Coder for Hts {
    fn name(&self) -> &'static str {
        self.name
    }
    fn encode(&mut self, plane: &[u8], out: &mut Vec<u8>) {
        out.clear();
        // SAFETY: htscodecs reads `in_size` bytes of the input (not written: the API is not
        // const-qualified) and writes at most `*out_size` bytes, the bound it computed itself.
        unsafe {
            match self.kind {
                HtsKind::R4x16(order) => {
                    let bound = rans_compress_bound_4x16(plane.len() as c_uint, order);
                    out.reserve(bound as usize);
                    let mut n = bound;
                    let r = rans_compress_to_4x16(
                        plane.as_ptr() as *mut u8,
                        plane.len() as c_uint,
                        out.as_mut_ptr(),
                        &mut n,
                        order,
                    );
                    assert!(!r.is_null(), "rans_compress_to_4x16 failed");
                    out.set_len(n as usize);
                }
                HtsKind::R4x8 => {
                    let mut n: c_uint = 0;
                    let r = rans_compress(plane.as_ptr() as *mut u8, plane.len() as c_uint, &mut n, 0);
                    assert!(!r.is_null(), "rans_compress failed");
                    out.extend_from_slice(std::slice::from_raw_parts(r, n as usize));
                    libc::free(r as *mut libc::c_void);
                }
            }
        }
    }
    fn decode(&mut self, frame: &[u8], out: &mut [u8]) {
        // SAFETY: as above; the output holds `*out_size` bytes.
        unsafe {
            match self.kind {
                HtsKind::R4x16(_) => {
                    let mut n = out.len() as c_uint;
                    let r = rans_uncompress_to_4x16(
                        frame.as_ptr() as *mut u8,
                        frame.len() as c_uint,
                        out.as_mut_ptr(),
                        &mut n,
                    );
                    assert!(
                        !r.is_null() && n as usize == out.len(),
                        "rans_uncompress_to_4x16 failed"
                    );
                }
                HtsKind::R4x8 => {
                    // rANS 4x8 has no decode-into API: it mallocs the output (counted here).
                    let mut n: c_uint = 0;
                    let r = rans_uncompress(frame.as_ptr() as *mut u8, frame.len() as c_uint, &mut n);
                    assert!(!r.is_null() && n as usize == out.len(), "rans_uncompress failed");
                    out.copy_from_slice(std::slice::from_raw_parts(r, n as usize));
                    libc::free(r as *mut libc::c_void);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// zlib-ng (libz-sys): raw deflate with the Z_HUFFMAN_ONLY strategy, i.e. zlib's order-0 Huffman
// coder (one stream, dynamic tables per deflate block, codes up to 15 bits), and its inflate.

pub struct ZlibHuffman {
    c: Box<libz_sys::z_stream>,
    d: Box<libz_sys::z_stream>,
}

unsafe extern "C" fn z_alloc(_: libz_sys::voidpf, items: libz_sys::uInt, size: libz_sys::uInt) -> libz_sys::voidpf {
    libc::calloc(items as usize, size as usize)
}

unsafe extern "C" fn z_free(_: libz_sys::voidpf, p: libz_sys::voidpf) {
    libc::free(p)
}

fn z_stream() -> Box<libz_sys::z_stream> {
    let mut s = Box::new(std::mem::MaybeUninit::<libz_sys::z_stream>::zeroed());
    // SAFETY: every field is an integer or raw pointer (zero is valid) except the two allocator
    // function pointers, written before the value is assumed initialised.
    unsafe {
        let p = s.as_mut_ptr();
        std::ptr::addr_of_mut!((*p).zalloc).write(z_alloc);
        std::ptr::addr_of_mut!((*p).zfree).write(z_free);
        Box::from_raw(Box::into_raw(s) as *mut libz_sys::z_stream)
    }
}

impl ZlibHuffman {
    fn new() -> Self {
        let (mut c, mut d) = (z_stream(), z_stream());
        let size = std::mem::size_of::<libz_sys::z_stream>() as c_int;
        // SAFETY: valid streams; raw deflate (-15), Z_HUFFMAN_ONLY (2), memLevel 8.
        unsafe {
            let v = libz_sys::zlibVersion();
            assert_eq!(
                libz_sys::deflateInit2_(&mut *c, 1, 8, -15, 8, 2, v, size),
                0,
                "deflateInit2"
            );
            assert_eq!(libz_sys::inflateInit2_(&mut *d, -15, v, size), 0, "inflateInit2");
        }
        ZlibHuffman { c, d }
    }
}

impl Coder for ZlibHuffman {
    fn name(&self) -> &'static str {
        "zlib-ng (libz-sys) deflate Z_HUFFMAN_ONLY"
    }
    fn encode(&mut self, plane: &[u8], out: &mut Vec<u8>) {
        // SAFETY: the stream reads `avail_in` bytes of the plane and writes at most `avail_out`
        // bytes, deflateBound's bound, into the reserved buffer.
        unsafe {
            let c = &mut *self.c;
            assert_eq!(libz_sys::deflateReset(c), 0);
            let bound = libz_sys::deflateBound(c, plane.len() as _) as usize;
            out.clear();
            out.reserve(bound);
            c.next_in = plane.as_ptr() as *mut u8;
            c.avail_in = plane.len() as _;
            c.next_out = out.as_mut_ptr();
            c.avail_out = bound as _;
            assert_eq!(libz_sys::deflate(c, 4), 1, "deflate Z_FINISH"); // Z_STREAM_END
            out.set_len(bound - c.avail_out as usize);
        }
    }
    fn decode(&mut self, frame: &[u8], out: &mut [u8]) {
        // SAFETY: as above, into `out`.
        unsafe {
            let d = &mut *self.d;
            assert_eq!(libz_sys::inflateReset(d), 0);
            d.next_in = frame.as_ptr() as *mut u8;
            d.avail_in = frame.len() as _;
            d.next_out = out.as_mut_ptr();
            d.avail_out = out.len() as _;
            assert_eq!(libz_sys::inflate(d, 4), 1, "inflate Z_FINISH");
            assert_eq!(d.avail_out, 0);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A normalised order-0 table, shared by the two crates that take frequencies from the caller
// (constriction, rans). Frame: plane length u32, symbol count u16, then per present symbol its
// byte and its frequency (u16), then the coder's stream.

struct Table {
    /// Present symbols in byte order and their frequencies summing to `1 << scale`.
    syms: Vec<u8>,
    freqs: Vec<u32>,
}

fn normalise(plane: &[u8], scale: u32) -> Table {
    let mut h = [0u64; 256];
    plane.iter().for_each(|&b| h[b as usize] += 1);
    let total = 1u64 << scale;
    let n = plane.len() as u64;
    let mut syms: Vec<u8> = (0..256).filter(|&s| h[s] > 0).map(|s| s as u8).collect();
    if syms.len() == 1 {
        // constriction rejects a one-symbol model: add an unused neighbour.
        syms.push(syms[0].wrapping_add(1));
        syms.sort_unstable();
    }
    let mut freqs: Vec<u32> = syms
        .iter()
        .map(|&s| ((h[s as usize] * total + n / 2) / n.max(1)).max(1) as u32)
        .collect();
    for (f, &s) in freqs.iter_mut().zip(&syms) {
        if h[s as usize] == 0 {
            *f = 1;
        }
    }
    // Fix the sum on the most frequent symbol(s).
    loop {
        let sum: i64 = freqs.iter().map(|&f| f as i64).sum();
        let diff = total as i64 - sum;
        if diff == 0 {
            break;
        }
        let i = (0..freqs.len()).max_by_key(|&i| freqs[i]).unwrap();
        let room = freqs[i] as i64 - 1;
        let step = if diff > 0 { diff } else { diff.max(-room) };
        freqs[i] = (freqs[i] as i64 + step) as u32;
        assert!(step != 0, "cannot normalise");
    }
    Table { syms, freqs }
}

fn write_table(t: &Table, len: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&(t.syms.len() as u16).to_le_bytes());
    for (&s, &f) in t.syms.iter().zip(&t.freqs) {
        out.push(s);
        out.extend_from_slice(&(f as u16).to_le_bytes());
    }
}

/// (plane length, table, stream).
fn read_table(frame: &[u8]) -> (usize, Table, &[u8]) {
    let len = u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize;
    let k = u16::from_le_bytes(frame[4..6].try_into().unwrap()) as usize;
    let mut syms = Vec::with_capacity(k);
    let mut freqs = Vec::with_capacity(k);
    for e in frame[6..6 + 3 * k].chunks_exact(3) {
        syms.push(e[0]);
        freqs.push(u16::from_le_bytes([e[1], e[2]]) as u32);
    }
    (len, Table { syms, freqs }, &frame[6 + 3 * k..])
}

// ---------------------------------------------------------------------------------------------
// rans (ryg_rans's rans64 through ryg-rans-sys): 4 interleaved states, one shared stream.

const RYG_SCALE: u32 = 14;
const RYG_WAYS: usize = 4;

#[derive(Default)]
pub struct RygRans {
    enc: Option<rans::b64_encoder::B64RansEncoderMulti<RYG_WAYS>>,
    cap: usize,
    scratch: Vec<u8>,
}

impl Coder for RygRans {
    fn name(&self) -> &'static str {
        "rans 0.4 (ryg_rans rans64), 4 interleaved states"
    }
    fn encode(&mut self, plane: &[u8], out: &mut Vec<u8>) {
        use rans::b64_encoder::{B64RansEncSymbol, B64RansEncoderMulti};
        use rans::{RansEncSymbol, RansEncoderMulti};
        let need = 2 * plane.len() + 64;
        if self.cap < need {
            self.enc = Some(B64RansEncoderMulti::new(need));
            self.cap = need;
        }
        let e = self.enc.as_mut().unwrap();
        e.reset();
        let t = normalise(plane, RYG_SCALE);
        let mut syms: Vec<Option<B64RansEncSymbol>> = (0..256).map(|_| None).collect();
        let mut cum = 0;
        for (&s, &f) in t.syms.iter().zip(&t.freqs) {
            syms[s as usize] = Some(B64RansEncSymbol::new(cum, f, RYG_SCALE));
            cum += f;
        }
        // Decoded forward, symbol i by state i % 4: so encoded backwards, flushed 3..0.
        for (i, &b) in plane.iter().enumerate().rev() {
            e.put_at(i % RYG_WAYS, syms[b as usize].as_ref().unwrap());
        }
        for ch in (0..RYG_WAYS).rev() {
            e.flush_at(ch);
        }
        out.clear();
        write_table(&t, plane.len(), out);
        out.extend_from_slice(e.data());
    }
    fn decode(&mut self, frame: &[u8], out: &mut [u8]) {
        use rans::b64_decoder::{B64RansDecSymbol, B64RansDecoderMulti};
        use rans::{RansDecSymbol, RansDecoderMulti};
        let (len, t, stream) = read_table(frame);
        assert_eq!(len, out.len());
        let mut slot = vec![0u8; 1 << RYG_SCALE];
        let mut dsyms: Vec<Option<B64RansDecSymbol>> = (0..256).map(|_| None).collect();
        let mut cum = 0u32;
        for (&s, &f) in t.syms.iter().zip(&t.freqs) {
            slot[cum as usize..(cum + f) as usize].fill(s);
            dsyms[s as usize] = Some(B64RansDecSymbol::new(cum, f));
            cum += f;
        }
        // The crate's decoder takes a mutable buffer.
        self.scratch.clear();
        self.scratch.extend_from_slice(stream);
        let mut d = B64RansDecoderMulti::<RYG_WAYS>::new(&mut self.scratch[..]);
        for (i, o) in out.iter_mut().enumerate() {
            let ch = i % RYG_WAYS;
            let s = slot[d.get_at(ch, RYG_SCALE) as usize];
            d.advance_at(ch, dsyms[s as usize].as_ref().unwrap(), RYG_SCALE);
            *o = s;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// constriction: SmallAnsCoder (u16 words, 32-bit state, 12-bit probabilities), categorical
// model for encode, its lookup-table decoder model for decode.

pub struct Constriction;

impl Coder for Constriction {
    fn name(&self) -> &'static str {
        "constriction 0.5 SmallAnsCoder + lookup decoder model"
    }
    fn encode(&mut self, plane: &[u8], out: &mut Vec<u8>) {
        use constriction::stream::{model::SmallContiguousCategoricalEntropyModel, stack::SmallAnsCoder};
        let t = normalise(plane, 12);
        let probs: Vec<u16> = t.freqs.iter().map(|&f| f as u16).collect();
        let model =
            SmallContiguousCategoricalEntropyModel::<Vec<u16>>::from_nonzero_fixed_point_probabilities(&probs, false)
                .expect("model");
        let mut dense = [0usize; 256];
        for (i, &s) in t.syms.iter().enumerate() {
            dense[s as usize] = i;
        }
        let mut coder = SmallAnsCoder::new();
        coder
            .encode_iid_symbols_reverse(plane.iter().map(|&b| dense[b as usize]), &model)
            .expect("encodes");
        let words = coder.into_compressed().expect("compressed");
        out.clear();
        write_table(&t, plane.len(), out);
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
    fn decode(&mut self, frame: &[u8], out: &mut [u8]) {
        use constriction::stream::{model::SmallContiguousCategoricalEntropyModel, stack::SmallAnsCoder, Decode};
        let (len, t, stream) = read_table(frame);
        assert_eq!(len, out.len());
        let probs: Vec<u16> = t.freqs.iter().map(|&f| f as u16).collect();
        let model =
            SmallContiguousCategoricalEntropyModel::<Vec<u16>>::from_nonzero_fixed_point_probabilities(&probs, false)
                .expect("model")
                .to_lookup_decoder_model();
        let words: Vec<u16> = stream
            .chunks_exact(2)
            .map(|w| u16::from_le_bytes([w[0], w[1]]))
            .collect();
        let mut coder = SmallAnsCoder::from_compressed(words).expect("stream");
        for (o, s) in out.iter_mut().zip(coder.decode_iid_symbols(len, &model)) {
            *o = t.syms[s.expect("decodes")];
        }
    }
}
