// SPDX-License-Identifier: GPL-2.0
//! The reference model: what the driver must hold for each open file (buffers and their bytes,
//! queues and their ring accounting, copies in flight) and the rules that say which bytes are
//! known after which call.
//!
//! Bytes are `Option<u8>`: `None` where the ABI does not fix the value (a copy lost to a queue
//! reset, writes racing each other without ordering). Every other byte must match exactly.

use crate::dev::Mapping;

/// Buffer slots per file that the operations name.
pub const BUF_SLOTS: usize = 4;
/// Queue slots the operations name; slot `s` is always the same (engine, queue) pair.
pub const QUEUE_SLOTS: usize = 4;
/// Open files the state machine drives (two: the second's copies must be unaffected by the
/// first's faults and errors).
pub const FILES: usize = 2;
/// Slots kept free on each ring (`ring_reserve_descs`).
pub const RESERVE: u32 = 16;

/// One buffer of a file.
#[derive(Debug)]
pub struct BufM {
    /// Handle from `MEM_ALLOC`.
    pub handle: u64,
    /// Size in bytes (rounded up to 4 KiB by the driver).
    pub size: usize,
    /// Host (mappable) or device memory.
    pub host: bool,
    /// `mmap_offset` from `MEM_ALLOC`.
    pub mmap_offset: u64,
    /// Our mapping, if mapped.
    pub map: Option<Mapping>,
    /// The bytes the buffer must hold.
    pub data: Vec<Option<u8>>,
}

/// A copy prepared on a queue whose completion has not been observed yet.
#[derive(Clone, Debug)]
pub struct PendingCopy {
    /// Source buffer handle and byte range.
    pub src: (u64, usize),
    /// Destination buffer handle and byte range.
    pub dst: (u64, usize),
    /// Length in bytes.
    pub len: usize,
    /// Covered by a completion marker of an interrupted wait (it may have been retired since).
    pub fenced: bool,
    /// Raced by another write or copy without ordering: its destination is unknown once it
    /// lands.
    pub fuzzy: bool,
}

impl PendingCopy {
    fn dst_overlaps(&self, h: u64, off: usize, len: usize) -> bool {
        overlaps(self.dst.0, self.dst.1, self.len, h, off, len)
    }
    fn src_overlaps(&self, h: u64, off: usize, len: usize) -> bool {
        overlaps(self.src.0, self.src.1, self.len, h, off, len)
    }
}

/// Whether two byte ranges of buffers overlap.
pub fn overlaps(h1: u64, o1: usize, l1: usize, h2: u64, o2: usize, l2: usize) -> bool {
    h1 == h2 && o1 < o2 + l2 && o2 < o1 + l1
}

/// One queue taken by a file.
#[derive(Debug)]
pub struct QueueM {
    /// The file that owns it.
    pub owner: usize,
    /// Tx and Rx ring sizes, descriptors.
    pub tx: u32,
    /// See `tx`.
    pub rx: u32,
    /// Upper bound of the pairs handed out and not yet freed (markers included).
    pub hi: u32,
    /// Lower bound of the same (work behind an interrupted wait may have been freed since).
    pub lo: u32,
    /// Prepared, not yet started Tx descriptors.
    pub ptx: u32,
    /// Prepared, not yet started Rx descriptors.
    pub prx: u32,
    /// Copies in flight, in ring order.
    pub pending: Vec<PendingCopy>,
    /// A fault was injected on its engine: its waits may fail (EIO/ETIMEDOUT) until a wait
    /// with work completes after the faults were cleared.
    pub tainted: bool,
}

impl QueueM {
    /// Pairs the driver keeps available on a fresh queue (`min(tx, rx) - 16`).
    pub fn cap(&self) -> u32 {
        self.tx.min(self.rx) - RESERVE
    }
}

/// What the model knows of the engines the fuzzer uses, across test cases.
#[derive(Clone, Copy, Debug, Default)]
pub struct EngineM {
    /// A fault may still fire on it.
    pub armed: bool,
    /// It may be in abort state (a fault fired and no wait with work recovered it yet).
    pub maybe_aborted: bool,
}

/// The model of one open file.
#[derive(Debug, Default)]
pub struct FileM {
    /// Buffers by slot.
    pub bufs: [Option<BufM>; BUF_SLOTS],
    /// Buffers allocated into an occupied slot (still the file's, no longer named by a slot).
    pub extra: Vec<BufM>,
}

impl FileM {
    /// The buffer with `handle`, wherever it is.
    pub fn by_handle(&self, handle: u64) -> Option<&BufM> {
        self.bufs.iter().flatten().chain(self.extra.iter()).find(|b| b.handle == handle)
    }
    /// The buffer with `handle`, mutably.
    pub fn by_handle_mut(&mut self, handle: u64) -> Option<&mut BufM> {
        self.bufs.iter_mut().flatten().chain(self.extra.iter_mut()).find(|b| b.handle == handle)
    }
}

/// Marks every pending copy of `queues` owned by `owner` that reads or writes
/// `[off, off + len)` of `handle` as fuzzy: a write there races it.
pub fn touch_write(queues: &mut [Option<QueueM>], owner: usize, handle: u64, off: usize, len: usize) {
    for q in queues.iter_mut().flatten().filter(|q| q.owner == owner) {
        for p in q.pending.iter_mut() {
            if p.dst_overlaps(handle, off, len) || p.src_overlaps(handle, off, len) {
                p.fuzzy = true;
            }
        }
    }
}

/// Whether a pending copy of `owner` may write `[off, off + len)` of `handle` at any time
/// (a read there races it).
pub fn racy_read(queues: &[Option<QueueM>], owner: usize, handle: u64, off: usize, len: usize) -> bool {
    queues
        .iter()
        .flatten()
        .filter(|q| q.owner == owner)
        .any(|q| q.pending.iter().any(|p| p.dst_overlaps(handle, off, len)))
}

/// Records a new copy of queue `qi`: copies it races (unordered writes to the same bytes,
/// or a read of bytes another queue writes) become fuzzy, and so does the new one.
pub fn add_pending(queues: &mut [Option<QueueM>], qi: usize, mut c: PendingCopy) {
    let owner = queues[qi].as_ref().expect("queue").owner;
    if overlaps(c.src.0, c.src.1, c.len, c.dst.0, c.dst.1, c.len) {
        c.fuzzy = true;
    }
    for (j, q) in queues.iter_mut().enumerate() {
        let Some(q) = q.as_mut().filter(|q| q.owner == owner) else { continue };
        for p in q.pending.iter_mut() {
            // Same queue: reads are in ring order (read-after-write is ordered); two writes of
            // the same bytes without a barrier are not. Other queues: no order at all.
            let waw = p.dst_overlaps(c.dst.0, c.dst.1, c.len);
            let cross = j != qi && (p.src_overlaps(c.dst.0, c.dst.1, c.len) || p.dst_overlaps(c.src.0, c.src.1, c.len));
            if waw || cross {
                p.fuzzy = true;
                c.fuzzy = true;
            }
        }
    }
    queues[qi].as_mut().expect("queue").pending.push(c);
}

/// Applies a completed copy to the file's bytes.
pub fn land(file: &mut FileM, queues: &mut [Option<QueueM>], owner: usize, c: &PendingCopy) {
    let src: Vec<Option<u8>> = match file.by_handle(c.src.0) {
        Some(b) if !c.fuzzy => b.data[c.src.1..c.src.1 + c.len].to_vec(),
        _ => vec![None; c.len],
    };
    if let Some(d) = file.by_handle_mut(c.dst.0) {
        d.data[c.dst.1..c.dst.1 + c.len].copy_from_slice(&src);
    }
    touch_write(queues, owner, c.dst.0, c.dst.1, c.len);
}

/// Forgets copies that may or may not have happened (queue reset or release): their
/// destinations become unknown.
pub fn drop_pending(file: &mut FileM, pending: Vec<PendingCopy>) {
    for c in pending {
        if let Some(d) = file.by_handle_mut(c.dst.0) {
            d.data[c.dst.1..c.dst.1 + c.len].fill(None);
        }
    }
}

/// A byte pattern that differs between writes: byte `i` of write `seed`.
pub fn pattern(seed: u32, i: usize) -> u8 {
    let x = seed.wrapping_mul(0x9E37_79B9) ^ (i as u32).wrapping_mul(0x85EB_CA6B);
    (x ^ (x >> 13) ^ (x >> 24)) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(owner: usize) -> Option<QueueM> {
        Some(QueueM { owner, tx: 32, rx: 64, hi: 0, lo: 0, ptx: 0, prx: 0, pending: vec![], tainted: false })
    }
    fn copy(src: (u64, usize), dst: (u64, usize), len: usize) -> PendingCopy {
        PendingCopy { src, dst, len, fenced: false, fuzzy: false }
    }

    #[test]
    fn cap_keeps_the_reserve_of_the_smaller_ring() {
        assert_eq!(q(0).unwrap().cap(), 16);
    }

    #[test]
    fn same_queue_read_after_write_is_ordered_but_write_after_write_is_not() {
        let mut qs = vec![q(0), q(0)];
        add_pending(&mut qs, 0, copy((1, 0), (2, 0), 100));
        add_pending(&mut qs, 0, copy((2, 0), (3, 0), 100));
        assert!(qs[0].as_ref().unwrap().pending.iter().all(|p| !p.fuzzy));
        add_pending(&mut qs, 0, copy((1, 0), (3, 50), 100));
        let p = &qs[0].as_ref().unwrap().pending;
        assert!(!p[0].fuzzy && p[1].fuzzy && p[2].fuzzy);
    }

    #[test]
    fn other_queue_reading_a_pending_destination_is_fuzzy() {
        let mut qs = vec![q(0), q(0), q(1)];
        add_pending(&mut qs, 0, copy((1, 0), (2, 0), 100));
        add_pending(&mut qs, 2, copy((2, 0), (3, 0), 100));
        assert!(!qs[0].as_ref().unwrap().pending[0].fuzzy, "another file's queue cannot race");
        add_pending(&mut qs, 1, copy((2, 10), (4, 0), 10));
        assert!(qs[0].as_ref().unwrap().pending[0].fuzzy && qs[1].as_ref().unwrap().pending[0].fuzzy);
    }

    #[test]
    fn landing_copies_known_bytes_and_fuzzy_ones_become_unknown() {
        let buf = |handle, v| BufM { handle, size: 8, host: true, mmap_offset: 0, map: None, data: vec![Some(v); 8] };
        let mut f = FileM::default();
        f.bufs[0] = Some(buf(1, 7));
        f.bufs[1] = Some(buf(2, 0));
        let mut qs = vec![q(0)];
        land(&mut f, &mut qs, 0, &copy((1, 0), (2, 2), 4));
        assert_eq!(f.bufs[1].as_ref().unwrap().data, [0, 0, 7, 7, 7, 7, 0, 0].map(Some));
        let mut c = copy((1, 0), (2, 0), 2);
        c.fuzzy = true;
        land(&mut f, &mut qs, 0, &c);
        assert_eq!(f.bufs[1].as_ref().unwrap().data[..3], [None, None, Some(7)]);
        drop_pending(&mut f, vec![copy((1, 0), (2, 6), 2)]);
        assert_eq!(f.bufs[1].as_ref().unwrap().data[6..], [None, None]);
    }

    #[test]
    fn touch_write_marks_readers_and_writers() {
        let mut qs = vec![q(0)];
        add_pending(&mut qs, 0, copy((1, 0), (2, 0), 10));
        touch_write(&mut qs, 1, 1, 0, 10);
        assert!(!qs[0].as_ref().unwrap().pending[0].fuzzy, "another file");
        touch_write(&mut qs, 0, 1, 9, 1);
        assert!(qs[0].as_ref().unwrap().pending[0].fuzzy);
        assert!(racy_read(&qs, 0, 2, 5, 1) && !racy_read(&qs, 0, 2, 10, 5));
    }
}
