// SPDX-License-Identifier: GPL-2.0
//! Descriptor trace: one JSON object per consumed descriptor, one per line.
//!
//! Format (spec-independent, model-defined):
//! `{"engine":32,"queue":0,"ring":"tx","index":5,"raw":"<32 hex chars>",
//! "len_ctrl":"0x0d001000","meta_ctrl":"0x05080003","addr":"0x100000001000",
//! "len":4096,"ring_id":1,"first":true,"last":true,"dmb":false,"wb":true}`.
//! `raw` is the 16 descriptor bytes in memory order. For Rx descriptors
//! `meta_ctrl` is word 1 (`buf2_ptr_lo`), and `first`/`last`/`dmb`/`wb` decode
//! the same bit positions (the kernel never sets them on Rx).

use crate::regs::desc;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

/// One consumed descriptor.
#[derive(Clone, Copy, Debug)]
pub struct TraceRec {
    /// Engine id.
    pub engine: u32,
    /// Queue id.
    pub queue: u8,
    /// true = Tx (M2S) ring, false = Rx (S2M) ring.
    pub tx: bool,
    /// Slot index in the ring.
    pub index: u32,
    /// The 16 raw bytes.
    pub raw: [u8; 16],
}

impl TraceRec {
    /// Formats the record as one JSON line (without newline).
    pub fn to_json(&self) -> String {
        let w0 = u32::from_le_bytes([self.raw[0], self.raw[1], self.raw[2], self.raw[3]]);
        let w1 = u32::from_le_bytes([self.raw[4], self.raw[5], self.raw[6], self.raw[7]]);
        let mut a = [0u8; 8];
        a.copy_from_slice(&self.raw[8..16]);
        let addr = u64::from_le_bytes(a);
        let mut hex = String::with_capacity(32);
        for b in self.raw {
            let _ = write!(hex, "{b:02x}");
        }
        let len = match w0 & desc::LEN_MASK {
            0 => 65536,
            l => l,
        };
        format!(
            "{{\"engine\":{},\"queue\":{},\"ring\":\"{}\",\"index\":{},\"raw\":\"{}\",\"len_ctrl\":\"0x{:08x}\",\"meta_ctrl\":\"0x{:08x}\",\"addr\":\"0x{:x}\",\"len\":{},\"ring_id\":{},\"first\":{},\"last\":{},\"dmb\":{},\"wb\":{}}}",
            self.engine,
            self.queue,
            if self.tx { "tx" } else { "rx" },
            self.index,
            hex,
            w0,
            w1,
            addr,
            len,
            (w0 >> desc::RING_ID_SHIFT) & desc::RING_ID_MASK,
            w0 & desc::FIRST != 0,
            w0 & desc::LAST != 0,
            w0 & desc::DMB != 0,
            self.tx && w1 & desc::META_WB != 0,
        )
    }
}

/// Trace file writer (shared by all engine workers).
pub struct Tracer {
    out: Mutex<BufWriter<File>>,
}

impl Tracer {
    /// Creates (truncates) `path`.
    pub fn create(path: &Path) -> std::io::Result<Tracer> {
        Ok(Tracer { out: Mutex::new(BufWriter::new(File::create(path)?)) })
    }

    /// Appends the records of one packet and flushes.
    pub fn record(&self, recs: &[TraceRec]) {
        let mut g = self.out.lock().unwrap_or_else(|e| e.into_inner());
        for r in recs {
            if writeln!(g, "{}", r.to_json()).is_err() {
                log::warn!("trace write failed");
                return;
            }
        }
        let _ = g.flush();
    }
}
