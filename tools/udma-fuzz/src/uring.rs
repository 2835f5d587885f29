// SPDX-License-Identifier: GPL-2.0
//! io_uring (ABI 3): `IORING_OP_URING_CMD` SQEs with `cmd_op` `NEURON_UDMA_URING_COPY` and a
//! `struct neuron_udma_uring_copy` in the command area (the `io-uring` crate's `UringCmd16`), on
//! a normal ring and on an `IORING_SETUP_IOPOLL` one, several in flight, with the queue
//! released, released and taken again, the file closed or the device unbound between submit
//! and reap, and a forked child that exits with its commands in flight. The model follows the
//! semantics of issue 33 (`Documentation/udma-fuzz.rst`, "io_uring"):
//!
//! * a command prepares its copies and appends a fence, as `COPY_PREPARE` + `COPY_SUBMIT`;
//!   the fuzzer waits until io_uring has issued it (the driver takes SQEs from io_uring's
//!   workers), so the model knows its fence;
//! * its CQE is 0 only when its own copies completed: the model lands them and reads the
//!   destination bytes back at once; `-EIO` only for a fence that may have failed;
//! * a command still pending when its queue instance goes (`QUEUE_RELEASE`, also followed by a
//!   `QUEUE_INIT` of the same id, or an unbind) completes with `-ECANCELED` (S4), or with 0 if
//!   its copies completed before (then the bytes must be there);
//! * closing the device file does not end the instance: its commands complete normally, and
//!   the queue id is taken until they did (S5).
//!
//! An instance that ends with commands in flight becomes a *ghost*: its model (`QueueM`,
//! `gone` set) moves to an entry of `Sut::queues` past the slots, where its copies stay in
//! flight for the rest of the model (bytes they may write are not compared, writes that race
//! them make them fuzzy) until the last of its commands completed.

use crate::dev::{abi3, ioctl_ret, Dev, Errno, FaultKind, Mapping, RegionKind};
use crate::fuzz::{ctx, engines, expect, fact, fail, name, slot_queue, CopyOp, Entries, Sut, BEFORE_I33, PATTERN_SEQ};
use crate::model::*;
use crate::workers::Child;
use io_uring::{opcode, types, IoUring};
use libc::{E2BIG, EBADF, EBUSY, ECANCELED, EFAULT, EINVAL, EIO, ENODEV, ENOENT, ENOSPC, ENOTTY, ESTALE};
use neuron_udma::{sys, RegisteredRange};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// SQ entries of each ring (the CQ has twice as many).
const RING_ENTRIES: u32 = 64;
/// Commands in flight per ring at most (a submission reaps the ring first past this).
const MAX_INFLIGHT: usize = 24;
/// How long io_uring's workers may take to issue the SQEs of one submission.
const ISSUE_LIMIT: Duration = Duration::from_secs(10);
/// How long the commands of a ring may take to complete when every one must.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// How long a closed (or exited) file may hold its queue id after its commands completed.
const FREE_LIMIT: Duration = Duration::from_secs(10);
/// Slots of each ring's registered buffer table: one per region (`import.rs`), by index.
const FIXED_SLOTS: u32 = 6;
/// The queue of the forked child's file (engine `engines[3]`; the second process uses 2).
const CHILD_QUEUE: u32 = 3;
/// `_IOW(0xB9, 0x21, struct neuron_udma_uring_copy)`: a `cmd_op` the driver does not know.
const BAD_CMD_OP: u32 = (1 << 30) | (16 << 16) | (0xB9 << 8) | 0x21;

/// The rings between test cases (with no command in flight): closing a ring leaves io_uring
/// work that may end the next interruptible wait of the thread with `EINTR`, and making one
/// costs more than the case needs.
static POOL: Mutex<[Option<IoUring>; 2]> = Mutex::new([None, None]);
/// The next user_data.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The rings' names.
const RING: [&str; 2] = ["normal", "IOPOLL"];

/// One io_uring command in flight.
#[derive(Debug)]
pub(crate) struct CmdM {
    /// Its user_data.
    id: u64,
    /// Its ring: 0 normal, 1 IOPOLL.
    ring: usize,
    /// Its queue's entry in `Sut::queues`: the slot, or the ghost once the instance ended.
    q: usize,
    /// Its fence; `lo..=hi` when it was issued together with others (their order unknown).
    fences: (u64, u64),
    /// The copy entries, which the driver reads when io_uring issues the command.
    _copies: Vec<sys::neuron_udma_copy>,
    /// Until when its queue is stalled in the device model for certain (the stall injected
    /// just before its submission, less a margin): no packet of it can have run before then.
    stalled: Option<Instant>,
    /// Its instance was released while it was stalled: its copies never ran, so its CQE must
    /// not be 0 (S4).
    never_ran: bool,
}

/// The rings of a test case and the commands in flight on them.
#[derive(Default)]
pub(crate) struct UringM {
    /// The normal ring and the IOPOLL ring, made at their first use.
    rings: [Option<IoUring>; 2],
    /// Commands submitted and not reaped.
    cmds: Vec<CmdM>,
    /// The commands of this case that completed: (user_data, res).
    done: Vec<(u64, i32)>,
    /// The destinations of the SQEs being issued: their copies run, the model does not have
    /// them yet (a CQE of an earlier command checked meanwhile does not read there).
    issuing: Vec<(Loc, usize)>,
    /// The first user_data of this case (user_data are unique in the run: the rings outlive
    /// the cases).
    first: u64,
    /// Closes of files with commands in flight so far (`QueueM::ghost_of`).
    closes: u64,
}

/// One SQE of a submission and what it must answer when io_uring issues it.
struct Sqe {
    id: u64,
    entries: Entries,
    /// It may take a fence (its copies prepared and submitted).
    ok: bool,
    /// The errnos its CQE may carry when it is refused (nothing prepared).
    errs: Vec<Errno>,
    /// The errno of its CQE, once it was refused.
    refused: Option<Errno>,
}

/// The 16 bytes of the SQE's command area: `struct neuron_udma_uring_copy`.
fn command(engine: u32, queue: u32, count: u32, copies: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..2].copy_from_slice(&(engine as u16).to_ne_bytes());
    b[2..4].copy_from_slice(&(queue as u16).to_ne_bytes());
    b[4..8].copy_from_slice(&count.to_ne_bytes());
    b[8..16].copy_from_slice(&copies.to_ne_bytes());
    b
}

fn make_ring(iopoll: bool, entries: u32) -> std::io::Result<IoUring> {
    let mut b = IoUring::builder();
    if iopoll {
        b.setup_iopoll();
    }
    b.build(entries)
}

/// Submits what is queued and takes the CQEs there (an IOPOLL ring is polled once).
fn take_cqes(ring: &mut IoUring) -> Result<Vec<(u64, i32)>, std::io::Error> {
    match ring.submit() {
        Ok(_) => {}
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {}
        Err(e) => return Err(e),
    }
    Ok(ring.completion().map(|c| (c.user_data(), c.result())).collect())
}

impl Sut {
    /// The newest fence of file `f`'s last instance of queue slot `q`: the new instance's
    /// numbering continues it (S1; 0 with `--before-i33`).
    pub(crate) fn fence_base(&self, f: usize, q: usize) -> u64 {
        if BEFORE_I33.load(Relaxed) {
            0
        } else {
            self.files[f].last_fence[q]
        }
    }

    /// Whether io_uring commands are in flight: task work of this thread (a normal ring's
    /// CQE, the start of one of io_uring's workers) ends an interruptible `COPY_WAIT` with
    /// `EINTR` as a signal would (the driver checks `signal_pending()`, which the task work's
    /// notification sets, and answers `EINTR`: the wait may have appended a marker, so it is
    /// not restarted; `FENCE_WAIT` is).
    pub(crate) fn task_work_eintr(&self) -> bool {
        // Either ring: a normal ring's CQE is posted by task work, and io_uring's workers
        // (every SQE goes to them) are started by task work of the submitter as well.
        !self.uring.cmds.is_empty()
    }

    /// Whether a normal ring has commands in flight on entry `q` of `Sut::queues` (the
    /// completion engine watches the queue for them).
    pub(crate) fn task_work_on(&self, q: usize) -> bool {
        self.uring.cmds.iter().any(|c| c.ring == 0 && c.q == q)
    }

    /// The stall of queue slot `q` (or of every queue, `q` >= `QUEUE_SLOTS`) may end early (a
    /// new stall, a fault cleared): its commands may have run.
    pub(crate) fn unstall(&mut self, q: usize) {
        for c in self.uring.cmds.iter_mut().filter(|c| q >= QUEUE_SLOTS || c.q % QUEUE_SLOTS == q) {
            c.stalled = None;
        }
    }

    /// Whether a closed file may still hold the id of queue slot `q` (a ghost `Closed`).
    pub(crate) fn held(&self, q: usize) -> bool {
        self.ghosts(q).any(|g| self.queues[g].as_ref().is_some_and(|m| m.gone == Some(Gone::Closed)))
    }

    /// The ghost entries of queue slot `q` in `queues`.
    fn ghosts(&self, q: usize) -> impl Iterator<Item = usize> {
        (QUEUE_SLOTS..QUEUE_ENTRIES).filter(move |g| g % QUEUE_SLOTS == q % QUEUE_SLOTS)
    }

    /// Before an operation that may end the instance of queue slot `q`: if commands are in
    /// flight (it may need a ghost) and every ghost entry of the slot is taken, reaps every
    /// command first.
    pub(crate) fn ghost_room(&mut self, q: usize) {
        if !self.uring.cmds.is_empty() && self.ghosts(q).all(|g| self.queues[g].is_some()) {
            self.uring_drain();
        }
    }

    /// Whether file `f` has io_uring commands in flight on its queues.
    pub(crate) fn file_has_commands(&self, f: usize) -> bool {
        self.uring.cmds.iter().any(|c| {
            self.queues[c.q].as_ref().is_some_and(|m| if c.q < QUEUE_SLOTS { m.owner == f } else { m.former == f })
        })
    }

    /// File `f` is being closed as close `close` (its commands in flight hold it): the ghosts
    /// of its released instances join the close, whose queues come free with its last command.
    pub(crate) fn closing(&mut self, f: usize, close: u64) {
        for m in self.queues[QUEUE_SLOTS..].iter_mut().flatten().filter(|m| m.former == f) {
            m.former = usize::MAX;
            m.ghost_of = close;
        }
    }

    /// Whether commands in flight are on entry `q` of `Sut::queues`.
    pub(crate) fn cmds_on_entry(&self, q: usize) -> bool {
        self.uring.cmds.iter().any(|c| c.q == q)
    }

    /// A new `QueueM::ghost_of`.
    pub(crate) fn next_close(&mut self) -> u64 {
        self.uring.closes += 1;
        self.uring.closes
    }

    /// The instance of queue slot `q` ended (`gone`): its commands in flight move to a ghost
    /// with its model (also without commands with `close`: a closed file that io_uring still
    /// holds keeps its queues); otherwise the model forgets it (its copies may or may not
    /// have run).
    pub(crate) fn end_instance(&mut self, q: usize, gone: Gone, close: Option<u64>) {
        if close.is_none() && !self.uring.cmds.iter().any(|c| c.q == q) {
            self.forget_queue(q);
            return;
        }
        let Some(g) = self.ghosts(q).find(|&g| self.queues[g].is_none()) else {
            fail!("no ghost entry free for queue slot {q} (ghost_room was not called)")
        };
        let mut m = self.queues[q].take().expect("the queue of commands in flight");
        if let Some(f) = (m.owner < FILES).then_some(m.owner) {
            self.files[f].last_fence[q] = m.newest.1;
        }
        m.former = if gone == Gone::Released { m.owner } else { usize::MAX };
        m.owner = usize::MAX;
        m.gone = Some(gone);
        m.ghost_of = close.unwrap_or(0);
        self.queues[g] = Some(m);
        let now = Instant::now();
        for c in self.uring.cmds.iter_mut().filter(|c| c.q == q) {
            c.q = g;
            if gone == Gone::Released && c.stalled.is_some_and(|t| now < t) {
                c.never_ran = true;
                fact("io_uring: commands released before their queue's stall ended", 1);
            }
        }
        fact(
            match gone {
                Gone::Released => "io_uring: queue instances released with commands in flight",
                Gone::Closed => "io_uring: files closed with commands in flight",
                Gone::Unbound => "io_uring: devices unbound with commands in flight",
            },
            1,
        );
    }

    fn ring_mut(&mut self, r: usize) -> &mut IoUring {
        if self.uring.rings[r].is_none() {
            self.uring.rings[r] = POOL.lock().unwrap_or_else(|e| e.into_inner())[r].take();
        }
        if self.uring.rings[r].is_none() {
            let ring =
                make_ring(r == 1, RING_ENTRIES).unwrap_or_else(|e| fail!("io_uring setup ({} ring): {e}", RING[r]));
            self.uring.rings[r] = Some(ring);
        }
        self.uring.rings[r].as_mut().expect("ring")
    }

    /// The CQEs of ring `r` now.
    fn collect(&mut self, r: usize) -> Vec<(u64, i32)> {
        let ring = self.ring_mut(r);
        take_cqes(ring).unwrap_or_else(|e| fail!("io_uring_enter ({} ring): {e}", RING[r]))
    }

    /// `Uring`: `n` SQEs of `NEURON_UDMA_URING_COPY` on queue slot `q` (the owner's file, or
    /// with `other` the other one), the copies shared out among them, on the normal or the
    /// IOPOLL ring. `stall` % 3 == 1 stalls the queue in the device model first (20..220 ms:
    /// the commands stay in flight). `how`: 0 valid; 1 count 0, 2 count above `max_batch`
    /// (`EINVAL`); 3 an unmapped copies pointer (`EFAULT`); 4 another `cmd_op` (`ENOTTY`); 5
    /// the read-only file (`EBADF`); 6 the other file (`ENOENT`); 7 (and 0 with `stall` % 8 ==
    /// 3) valid, the queue stalled, and the file then releases the id and takes it again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn uring(&mut self, other: u8, q: usize, iopoll: bool, n: u8, copies: &[CopyOp], stall: u8, how: u8) {
        let r = usize::from(iopoll);
        if self.uring.cmds.iter().filter(|c| c.ring == r).count() >= MAX_INFLIGHT {
            self.reap_until(r, |s| !s.uring.cmds.iter().any(|c| c.ring == r), DRAIN_LIMIT, true);
        }
        self.ring_mut(r);
        let q = self.qslot(q);
        self.refresh(q);
        self.resync(q);
        let how = how % 8;
        let f = self.qfile(q, u8::from(other == 1 || how == 6));
        let (engine, queue, _) = slot_queue(q);
        let owned = self.queues[q].as_ref().is_some_and(|m| m.owner == f);
        let fd = if how == 5 { self.ro.raw() } else { self.devs[f].raw() };
        // Issue 33's sequence: the commands in flight on a stalled queue, whose id the file then
        // releases and takes again at once (`QueueRelease` `how` 3).
        let recycle = owned && (how == 7 || (how == 0 && stall % 8 == 3));
        let mut stalled = None;
        if stall % 3 == 1 || recycle {
            if let Some(w) = ctx().window.as_ref() {
                let ms = 20 + u32::from(stall) % 200;
                let t = Instant::now();
                self.unstall(q);
                if !w.inject(FaultKind::Stall, engine, queue, ms) {
                    fail!("the model rejected a stall of engine {engine} queue {queue}");
                }
                // The model's clock started after ours; 10 ms of margin.
                stalled = t.checked_add(Duration::from_millis(u64::from(ms).saturating_sub(10)));
                fact("io_uring: queues stalled before a submission", 1);
            }
        }
        let first_id = NEXT_ID.load(Relaxed);
        let n = 1 + usize::from(n) % 3;
        let per = copies.len().div_ceil(n);
        let mut sqes: Vec<Sqe> = vec![];
        let mut ring_sqes = vec![];
        let parts: Vec<&[CopyOp]> = copies.chunks(per).collect();
        for part in &parts {
            let mut e = self.entries(f, part);
            // Sometimes a valid SQE names one of its imports as a registered buffer range
            // instead (the same pages: the model, runs and errors do not change).
            let fixed = if stall >= 128 && owned && matches!(how, 0 | 7) && e.errs.is_none() {
                self.fixed_range(r, f, &mut e)
            } else {
                None
            };
            let mut count = e.raw.len() as u32;
            let mut ptr = e.raw.as_ptr() as u64;
            let mut op = sys::NEURON_UDMA_URING_COPY;
            let mut ok = false;
            let mut errs = vec![];
            match how {
                1 => {
                    count = 0;
                    errs.push(EINVAL);
                }
                2 => {
                    count = ctx().info.max_batch + 1;
                    errs.push(EINVAL);
                }
                3 => {
                    ptr = 8;
                    errs.push(EFAULT);
                    if !owned {
                        errs.push(ENOENT);
                    }
                }
                4 => {
                    op = BAD_CMD_OP;
                    errs.push(ENOTTY);
                }
                5 => errs.push(EBADF),
                _ if !owned => errs.push(ENOENT),
                _ => match e.errs.clone() {
                    Some(v) => errs = v,
                    None => {
                        let (must, may) = self.fenced_space_errs(q, &e, parts.len());
                        ok = !must;
                        errs = may;
                    }
                },
            }
            let id = NEXT_ID.fetch_add(1, Relaxed);
            if self.uring.first == 0 {
                self.uring.first = id;
            }
            let mut cmd = opcode::UringCmd16::new(types::Fd(fd), op).cmd(command(engine, queue, count, ptr));
            if let Some((index, addr)) = fixed {
                cmd = cmd.buf_index(Some(index)).addr(Some(addr));
            }
            if crate::fuzz::TRACE.load(Relaxed) {
                let names: Vec<(u64, u64)> = e.raw.iter().map(|c| (c.src_handle, c.dst_handle)).collect();
                println!("#       SQE {id}: copies {names:?}, registered range {fixed:?}");
            }
            let sqe = cmd.build().user_data(id);
            ring_sqes.push(sqe);
            sqes.push(Sqe { id, entries: e, ok, errs, refused: None });
        }
        let k = sqes.len();
        let ring = self.ring_mut(r);
        for s in &ring_sqes {
            // SAFETY: the command area points at entries that live in `sqes` (then in the
            // commands' records) until the command's CQE; the SQ has room (MAX_INFLIGHT).
            if unsafe { ring.submission().push(s) }.is_err() {
                fail!("io_uring ({} ring): the submission queue is full", RING[r]);
            }
        }
        match ring.submit() {
            Ok(m) if m == k => {}
            got => fail!("io_uring_enter ({} ring) submitting {k} SQEs: {got:?}", RING[r]),
        }
        fact(&format!("io_uring SQEs ({} ring)", RING[r]), k as u64);
        self.issued(q, r, f, owned, sqes);
        for c in self.uring.cmds.iter_mut().filter(|c| c.id >= first_id) {
            c.stalled = stalled;
        }
        if recycle && self.queues[q].as_ref().is_some_and(|m| m.owner == f) {
            fact("io_uring: submissions followed by a release and a QUEUE_INIT of the id", 1);
            self.queue_release(0, q, 3);
        }
    }

    /// For an SQE of file `f` on ring `r` with the valid entries `e`: names the first import
    /// of `e` that views a registrable region (anonymous, THP, memfd) as the SQE's registered
    /// buffer range (`IORING_URING_CMD_FIXED`, handle `NEURON_UDMA_FIXED_BUFFER`, the range
    /// starting where the import does) in every entry, registers that region's current pages
    /// in its slot of the ring's table, and returns `(buf_index, addr)` for the SQE. The
    /// import's bytes, runs and pair counts are the range's (the same pages), so the model's
    /// bytes do not change, but its pending pairs no longer name the import (`MEM_FREE` of it
    /// is not `EBUSY` for them); `None` without such an import or on a driver without the
    /// feature.
    fn fixed_range(&mut self, r: usize, f: usize, e: &mut Entries) -> Option<(u16, u64)> {
        if ctx().info.features & sys::NEURON_UDMA_FEATURE_URING_FIXED == 0 {
            return None;
        }
        let (handle, ri, off) = e.raw.iter().flat_map(|c| [c.src_handle, c.dst_handle]).find_map(|h| {
            let b = self.files[f].by_handle(h)?;
            let Kind::Import { region, .. } = b.kind else { return None };
            let kind = self.regions.get(region)?.kind;
            matches!(kind, RegionKind::Anon | RegionKind::Thp | RegionKind::Memfd).then_some((h, region, b.at.1))
        })?;
        let iov =
            libc::iovec { iov_base: self.regions[ri].addr(0) as *mut libc::c_void, iov_len: self.regions[ri].len };
        let ring = self.ring_mut(r);
        // SAFETY: the region stays mapped while the slot names it (it is registered again,
        // with the region's current pages, before each SQE that names it).
        let mut res = unsafe { ring.submitter().register_buffers_update(ri as u32, &[iov], None) };
        if res.as_ref().err().and_then(|e| e.raw_os_error()) == Some(libc::ENXIO) {
            if let Err(e) = ring.submitter().register_buffers_sparse(FIXED_SLOTS) {
                fail!("io_uring ({} ring): a sparse buffer table: {e}", RING[r]);
            }
            // SAFETY: as above.
            res = unsafe { ring.submitter().register_buffers_update(ri as u32, &[iov], None) };
        }
        if let Err(e) = res {
            fail!("io_uring ({} ring): registering region {ri} ({} bytes): {e}", RING[r], iov.iov_len);
        }
        for c in &mut e.raw {
            if c.src_handle == handle {
                c.src_handle = RegisteredRange::HANDLE;
            }
            if c.dst_handle == handle {
                c.dst_handle = RegisteredRange::HANDLE;
            }
        }
        // The pairs hold the range's own buffer, not the import: MEM_FREE of the import is
        // not EBUSY for them, and its success says nothing of their fence.
        for p in &mut e.pend {
            if p.handles.0 == handle {
                p.handles.0 = RegisteredRange::HANDLE;
            }
            if p.handles.1 == handle {
                p.handles.1 = RegisteredRange::HANDLE;
            }
        }
        fact(&format!("io_uring: SQEs naming a registered buffer range ({} ring)", RING[r]), 1);
        Some((ri as u16, self.regions[ri].addr(off)))
    }

    /// Ring space for a fenced write of `e` on queue slot `q` (pairs and a marker) with
    /// `others` SQEs issued together in an unknown order: (must fail, errnos it may answer).
    fn fenced_space_errs(&self, q: usize, e: &Entries, others: usize) -> (bool, Vec<Errno>) {
        let m = self.queues[q].as_ref().expect("owned");
        let cap = m.cap();
        if e.largest > cap {
            return (true, vec![E2BIG]);
        }
        let mut may = vec![];
        // Another SQE of the same submission may go first: its fence covers what is prepared,
        // which may then complete and be retired before this SQE is issued. So only a lone SQE
        // is certain to find the prepared pairs still in the rings.
        let lo = if others > 1 { 0 } else { m.lo() };
        if e.total > cap.saturating_sub(lo) {
            return (true, vec![ENOSPC]);
        }
        // The others may take their pairs first (each at most 6 copies of 17 pieces).
        let theirs = (others as u32 - 1) * (6 * 17 + 1);
        if e.total + 1 + theirs > cap.saturating_sub(m.hi()) {
            may.push(ENOSPC);
        }
        if m.groups.len() + others >= MAX_FENCES as usize {
            may.push(EBUSY);
        }
        (false, may)
    }

    /// Waits until io_uring issued the SQEs `sqes` of ring `r` (each refused with a CQE, or
    /// given a fence on queue slot `q` of file `f`), then puts the issued ones into the model.
    fn issued(&mut self, q: usize, r: usize, f: usize, owned: bool, mut sqes: Vec<Sqe>) {
        let (engine, queue, _) = slot_queue(q);
        let before = self.queues[q].as_ref().filter(|_| owned).map(|m| m.newest.1);
        self.uring.issuing = sqes.iter().flat_map(|s| s.entries.pend.iter().map(|p| (p.dst, p.len))).collect();
        let t = Instant::now();
        let mut later = vec![];
        let fenced = loop {
            for (id, res) in self.collect(r) {
                match sqes.iter_mut().find(|s| s.id == id) {
                    Some(s) if res < 0 && !matches!(-res, EIO | ESTALE | ECANCELED) => {
                        if s.refused.is_some() {
                            fail!("io_uring ({} ring): two CQEs for command {id}", RING[r]);
                        }
                        if !s.errs.contains(&-res) {
                            let what = format!(
                                "io_uring URING_COPY of {} copies on queue slot {q} ({} ring), refused",
                                s.entries.raw.len(),
                                RING[r]
                            );
                            expect(&what, Err::<(), Errno>(-res), s.ok, &s.errs).ok();
                        }
                        if crate::fuzz::TRACE.load(Relaxed) {
                            println!("#       SQE {id} refused: {}", name(-res));
                        }
                        s.refused = Some(-res);
                    }
                    // One of these, completed already: after they are in the model.
                    Some(_) => later.push((id, res)),
                    // An earlier command: it completed before these were added to the model (a
                    // reset it reports came before their fences, or fails them too: a fault on
                    // the engine makes them may-fail anyway).
                    None => self.cqe(id, res),
                }
            }
            let refused = sqes.iter().filter(|s| s.refused.is_some()).count();
            let fenced = match before {
                Some(n0) => {
                    let mut a = sys::neuron_udma_fence_status { engine, queue, fence: n0 + 1, ..Default::default() };
                    match ioctl_ret(self.devs[f].raw(), abi3::FENCE_STATUS, &mut a) {
                        Ok(_) => a.submitted.saturating_sub(n0) as usize,
                        Err(EINVAL) => 0,
                        Err(e) => {
                            fail!("FENCE_STATUS of queue slot {q} (to see the io_uring commands issued): {}", name(e))
                        }
                    }
                }
                None => 0,
            };
            if refused + fenced == sqes.len() {
                break fenced;
            }
            if refused + fenced > sqes.len() {
                fail!(
                    "io_uring ({} ring): {} SQEs on queue slot {q}, {refused} refused and {fenced} fences submitted",
                    RING[r],
                    sqes.len()
                );
            }
            if t.elapsed() > ISSUE_LIMIT {
                fail!(
                    "io_uring ({} ring): {} SQEs on queue slot {q}, {refused} refused and {fenced} fences submitted after {ISSUE_LIMIT:?} (CQEs seen: {later:?})",
                    RING[r],
                    sqes.len()
                );
            }
            std::thread::sleep(Duration::from_micros(500));
        };
        self.uring.issuing.clear();
        for s in sqes.iter().filter(|s| s.refused.is_none()) {
            if !s.ok {
                let ring = self.queues[q].as_ref().map_or(String::new(), |m| {
                    format!(
                        "; rings {}/{} descriptors (room for {} pairs), {}..={} pairs in use, prepared {:?}",
                        m.tx,
                        m.rx,
                        m.cap(),
                        m.lo(),
                        m.hi(),
                        m.prep
                    )
                });
                let (engine, queue, _) = slot_queue(q);
                let mut st = sys::neuron_udma_queue_state { engine, queue, ..Default::default() };
                let dev = self.queues[q].as_ref().map_or(0, |m| m.owner);
                let driver = match self.devs[dev].ioctl(sys::NEURON_UDMA_QUEUE_STATE, &mut st) {
                    Ok(_) => format!(
                        "; the driver's Tx ring: size {} next {} ack {} available {}, Rx: size {} next {} ack {}",
                        st.tx.size,
                        st.tx.sw_next,
                        st.tx.sw_ack,
                        st.tx.sw_available,
                        st.rx.size,
                        st.rx.sw_next,
                        st.rx.sw_ack
                    ),
                    Err(e) => format!("; QUEUE_STATE: {}", name(e)),
                };
                fail!(
                    "io_uring URING_COPY on queue slot {q} ({} ring): issued with a fence, expected {} (pairs {} of entries {:?} {:?}{ring}{driver})",
                    RING[r],
                    s.errs.iter().map(|e| name(*e)).collect::<Vec<_>>().join(" or "),
                    s.entries.total,
                    s.entries.per,
                    s.entries.raw.iter().map(|c| (c.src_offset, c.dst_offset, c.size)).collect::<Vec<_>>()
                );
            }
        }
        for s in sqes.iter().filter(|s| s.refused.is_some()) {
            self.uring.done.push((s.id, -s.refused.expect("refused")));
            crate::fuzz::count(Err(s.refused.expect("refused")));
            fact(&format!("io_uring SQEs refused ({})", name(s.refused.expect("refused"))), 1);
        }
        if fenced > 0 {
            let lo = before.expect("owned") + 1;
            let hi = lo + fenced as u64 - 1;
            let unf_before = self.queues[q].as_ref().expect("owned").unf;
            let mut maxp = 0;
            let mut ids = vec![];
            for s in sqes.into_iter().filter(|s| s.refused.is_none()) {
                let Sqe { id, mut entries, .. } = s;
                maxp = maxp.max(entries.total);
                for p in entries.pend.iter_mut() {
                    p.tag = id;
                }
                let raw = std::mem::take(&mut entries.raw);
                self.prepared(q, entries);
                let m = self.queues[q].as_mut().expect("owned");
                m.fence_now();
                let seq = m.newest.1;
                self.uring.cmds.push(CmdM {
                    id,
                    ring: r,
                    q,
                    fences: (seq, seq),
                    _copies: raw,
                    stalled: None,
                    never_ran: false,
                });
                ids.push(id);
                crate::fuzz::count(Ok(()));
            }
            let m = self.queues[q].as_mut().expect("owned");
            m.learn_newest(hi);
            if fenced > 1 {
                // Issued in an unknown order: each copy is covered by the last fence, each fence
                // may hold the largest command's pairs, and a copy reading what another command
                // writes reads either.
                for p in m.pending.iter_mut().filter(|p| ids.contains(&p.tag)) {
                    p.fence = hi;
                }
                for g in m.groups.iter_mut().filter(|g| g.0 >= lo) {
                    g.1 = unf_before + maxp + 1;
                }
                let writes: Vec<(u64, Loc, usize)> =
                    m.pending.iter().filter(|p| ids.contains(&p.tag)).map(|p| (p.tag, p.dst, p.len)).collect();
                for p in m.pending.iter_mut().filter(|p| ids.contains(&p.tag)) {
                    if writes.iter().any(|&(t, at, len)| t != p.tag && overlaps(at, len, p.src, p.len)) {
                        p.fuzzy = true;
                    }
                }
                for c in self.uring.cmds.iter_mut().filter(|c| ids.contains(&c.id)) {
                    c.fences = (lo, hi);
                }
                fact("io_uring: submissions of several SQEs issued", 1);
            }
        }
        for (id, res) in later {
            self.cqe(id, res);
        }
    }

    /// The CQE of command `id`: its res must be one the model allows (its fence's state, how
    /// its instance ended), and for 0 its destinations must hold the copy's bytes.
    fn cqe(&mut self, id: u64, res: i32) {
        let Some(i) = self.uring.cmds.iter().position(|c| c.id == id) else {
            let whose = if let Some(&(_, r)) = self.uring.done.iter().find(|d| d.0 == id) {
                format!("a second CQE of a command of this case (its first: res {r})")
            } else if self.uring.first == 0 || id < self.uring.first {
                "a command of an earlier test case, all of whose commands completed".to_string()
            } else {
                "no command in flight".to_string()
            };
            fail!("io_uring: a CQE (res {res}) with user_data {id}: {whose}")
        };
        let c = self.uring.cmds.remove(i);
        self.uring.done.push((id, res));
        let (lo, hi) = c.fences;
        let slot = c.q % QUEUE_SLOTS;
        let eng = engines()[slot_queue(slot).2];
        let m = self.queues[c.q].as_ref().expect("the queue (or ghost) of a command in flight");
        let mut may = (lo..=hi).fold(0, |s, k| s | m.may(k));
        if eng.armed || eng.maybe_aborted || m.tainted || m.maybe_reset {
            may |= fs::FAIL;
        }
        let mut errs = vec![];
        if may & fs::FAIL != 0 {
            errs.push(EIO);
        }
        if may & fs::EXPIRED != 0 {
            errs.push(ESTALE);
        }
        let before = BEFORE_I33.load(Relaxed);
        match m.gone {
            None | Some(Gone::Closed) => {}
            Some(Gone::Released) => {
                errs.push(ECANCELED);
                if before && c.ring == 1 {
                    // Polled against whatever instance holds the id now (or none, or unbound).
                    errs.extend([ENOENT, EINVAL, EIO, ESTALE, ENODEV]);
                }
                if before && c.ring == 0 {
                    // Released between its fence and its queueing on the instance.
                    errs.push(ENODEV);
                }
            }
            Some(Gone::Unbound) => {
                errs.push(ECANCELED);
                if before {
                    errs.push(ENODEV);
                }
            }
        }
        let gone = match m.gone {
            None => String::new(),
            Some(Gone::Released) => ", its queue instance released before".into(),
            Some(Gone::Closed) => ", its file closed before".into(),
            Some(Gone::Unbound) => ", the device unbound before".into(),
        };
        let what = format!(
            "io_uring URING_COPY {id} ({} ring) on queue slot {slot}, fence {lo}{}{gone}: CQE",
            RING[c.ring],
            if hi > lo { format!("..={hi}") } else { String::new() }
        );
        let got = if res == 0 { Ok(()) } else { Err(-res) };
        fact(
            &format!(
                "io_uring CQEs ({} ring{}) {}",
                RING[c.ring],
                if m.gone.is_some() { ", instance gone" } else { "" },
                if res == 0 { "0".into() } else { format!("-{}", name(-res)) }
            ),
            1,
        );
        let what = if c.never_ran {
            format!("{what} (its instance was released while its queue was stalled: its copies never ran)")
        } else {
            what
        };
        let r = expect(&what, got, may & fs::DONE != 0 && !c.never_ran, &errs);
        let m = self.queues[c.q].as_mut().expect("queue");
        match r {
            Ok(()) => {
                // Its fence (the first of its group at least) is done, and so are its copies.
                let mut landed = m.done(lo);
                let dsts: Vec<(Loc, usize)> =
                    landed.iter().chain(m.pending.iter()).filter(|p| p.tag == id).map(|p| (p.dst, p.len)).collect();
                landed.extend(m.pending.iter().filter(|p| p.tag == id).cloned());
                m.pending.retain(|p| p.tag != id);
                self.land_all(landed);
                for (at, len) in dsts {
                    self.verify(at, len, &format!("{what} res 0, so its copy landed; its destination:"));
                }
            }
            Err(EIO) if m.may(lo) & fs::PENDING != 0 || lo != hi => {
                if lo == hi {
                    self.fence_wait_failed(c.q, lo);
                } else {
                    m.maybe_reset_now();
                }
            }
            Err(EIO) => m.failed_seen(lo),
            Err(_) => {}
        }
        if c.q >= QUEUE_SLOTS && !self.uring.cmds.iter().any(|o| o.q == c.q) {
            self.bury(c.q);
        }
    }

    /// The last command of ghost `g` completed: forgets it. The ghosts of a closed file go
    /// with its last command, and their queue ids must come free (S5).
    pub(crate) fn bury(&mut self, g: usize) {
        let Some(m) = self.queues[g].as_ref() else { return };
        if m.ghost_of == 0 {
            self.forget_queue(g);
            return;
        }
        let close = m.ghost_of;
        let siblings: Vec<usize> = (QUEUE_SLOTS..QUEUE_ENTRIES)
            .filter(|&s| self.queues[s].as_ref().is_some_and(|m| m.ghost_of == close))
            .collect();
        if self.uring.cmds.iter().any(|c| siblings.contains(&c.q)) {
            return;
        }
        for s in siblings {
            let slot = s % QUEUE_SLOTS;
            let closed = self.queues[s].as_ref().is_some_and(|m| m.gone == Some(Gone::Closed));
            if closed && self.queues[slot].is_none() {
                let (engine, queue, _) = slot_queue(slot);
                if let Err(e) = wait_free(engine, queue) {
                    fail!("S5: the queue of a closed file (slot {slot}) {e} after its last io_uring command completed");
                }
            }
            self.forget_queue(s);
        }
    }

    /// Reads `len` bytes at `at` from the device's side and compares them with the model (the
    /// bytes no copy in flight may write).
    fn verify(&mut self, at: Loc, len: usize, what: &str) {
        if len == 0
            || self.mem.get(at, len).iter().all(|v| v.is_none())
            || self.uring.issuing.iter().any(|&(d, n)| overlaps(d, n, at, len))
        {
            return;
        }
        let got = if at.0 >= REGION_SPACE {
            let reg = &self.regions[(at.0 - REGION_SPACE) as usize];
            if reg.kind == RegionKind::NoAccess {
                return;
            }
            reg.read(at.1, len)
        } else {
            let found =
                (0..FILES).find_map(|f| self.files[f].all().find(|b| b.own_space() && b.at.0 == at.0).map(|b| (f, b)));
            let Some((f, b)) = found else { return };
            match (&b.kind, b.map.as_ref()) {
                (Kind::Host, Some(map)) => map.read()[at.1..at.1 + len].to_vec(),
                (Kind::Host, None) => {
                    let rw = libc::PROT_READ | libc::PROT_WRITE;
                    let map = Mapping::new(self.devs[f].raw(), b.size, b.mmap_offset, rw, libc::MAP_SHARED)
                        .unwrap_or_else(|e| fail!("mmap of host buffer {}: {}", b.handle, name(e)));
                    map.read()[at.1..at.1 + len].to_vec()
                }
                _ => {
                    let mut m = sys::neuron_udma_memcpy {
                        src_handle: b.handle,
                        src_offset: at.1 as u64,
                        dst_handle: self.scratch[f].0,
                        size: len as u64,
                        ..Default::default()
                    };
                    let r = self.devs[f].ioctl(sys::NEURON_UDMA_MEMCPY, &mut m);
                    expect("MEMCPY to the scratch buffer", r, true, &[]).ok();
                    self.scratch[f].1.read()[..len].to_vec()
                }
            }
        };
        self.compare(at, len, &got, what);
    }

    /// Takes the CQEs of ring `r` until `done` (checked after each batch) or `limit`; past
    /// `limit` fails if `must`.
    fn reap_until(&mut self, r: usize, done: impl Fn(&Self) -> bool, limit: Duration, must: bool) -> usize {
        let t = Instant::now();
        let mut n = 0;
        loop {
            for (id, res) in self.collect(r) {
                self.cqe(id, res);
                n += 1;
            }
            if done(self) {
                return n;
            }
            if t.elapsed() > limit {
                if must {
                    let left: Vec<&CmdM> = self.uring.cmds.iter().filter(|c| c.ring == r).collect();
                    fail!("io_uring ({} ring): no CQE within {limit:?} for {left:?}", RING[r]);
                }
                return n;
            }
            std::thread::sleep(Duration::from_micros(if r == 1 { 200 } else { 1000 }));
        }
    }

    /// `UringReap`: `how` 0 takes what is there, 1 and 2 wait (up to 1 s) for one CQE, 3
    /// waits for every command of the ring (each must complete).
    pub(crate) fn uring_reap(&mut self, iopoll: bool, how: u8) {
        let r = usize::from(iopoll);
        if self.uring.rings[r].is_none() {
            return;
        }
        let n = match how % 4 {
            0 => self.reap_until(r, |_| true, Duration::ZERO, false),
            3 => self.reap_until(r, |s| !s.uring.cmds.iter().any(|c| c.ring == r), DRAIN_LIMIT, true),
            _ => {
                let before = self.uring.cmds.len();
                let none = !self.uring.cmds.iter().any(|c| c.ring == r);
                self.reap_until(r, move |s| none || s.uring.cmds.len() < before, Duration::from_secs(1), false)
            }
        };
        if n > 0 {
            crate::fuzz::succeeded();
        }
    }

    /// Reaps every command of both rings (each must complete): the end of a test case, or a
    /// ghost entry needed.
    pub(crate) fn uring_drain(&mut self) {
        for r in 0..2 {
            if self.uring.rings[r].is_some() {
                self.reap_until(r, |s| !s.uring.cmds.iter().any(|c| c.ring == r), DRAIN_LIMIT, true);
            }
        }
        if let Some(g) = (QUEUE_SLOTS..QUEUE_ENTRIES).find(|&g| self.queues[g].is_some()) {
            fail!("io_uring: ghost {g} left without commands");
        }
    }

    /// Gives the rings back for the next case (every command completed).
    pub(crate) fn uring_keep(&mut self) {
        if self.uring.cmds.is_empty() {
            let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
            for r in 0..2 {
                if let Some(ring) = self.uring.rings[r].take() {
                    pool[r] = Some(ring);
                }
            }
        }
    }

    /// A failed case: lets the commands complete (5 s at most, nothing checked) so that the
    /// queues are free for the next sequence. Its rings are not given back: a command the case
    /// submitted but had not put into the model yet (the failure came while it was being
    /// issued) would complete on them in the next case, as a command of an earlier case, and
    /// the sequence proptest then shrinks would fail on that instead of the case's own error.
    pub(crate) fn uring_quiesce(&mut self) {
        let t = Instant::now();
        while !self.uring.cmds.is_empty() && t.elapsed() < Duration::from_secs(5) {
            for r in 0..2 {
                if let Some(ring) = self.uring.rings[r].as_mut() {
                    for (id, _) in take_cqes(ring).unwrap_or_default() {
                        self.uring.cmds.retain(|c| c.id != id);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // Closing them lets io_uring cancel or wait for what is left, off this case's files.
        self.uring.rings = Default::default();
    }

    /// `UringFork`: a forked child with its own file and ring (`iopoll`) copies from its host
    /// buffer into an import of the case's memfd region (memory it shares with the parent) on
    /// queue `CHILD_QUEUE` of `engines[3]`, with one or two SQEs, the queue stalled first when
    /// `how` is odd, and exits with them in flight (`how / 2 % 3`: at once, after closing its
    /// device file, after closing its ring). S5: its file is released only once io_uring
    /// completed or cancelled the commands; the queue must come free, and from then on the
    /// bytes must stay put, each the old one or the copy's.
    pub(crate) fn uring_fork(&mut self, iopoll: bool, how: u8, x: u16) {
        let Some(ri) = self.regions.iter().position(|r| r.kind == RegionKind::Memfd) else { return };
        let len = [4096usize, 12288, 65536, 5000][x as usize % 4];
        let off = (x as usize * 61) % (self.regions[ri].len - len);
        let addr = self.regions[ri].addr(off);
        let at = (REGION_SPACE + ri as u64, off);
        let seed = PATTERN_SEQ.fetch_add(1, Relaxed) as u32;
        let engine = ctx().engines[3];
        let stall = if how % 2 == 1 { 50 + u32::from(x % 200) } else { 0 };
        let mode = how / 2 % 3;
        let path = ctx().path.clone();
        let child = Child::spawn(None, move || uring_child(&path, engine, iopoll, addr, len, seed, stall, mode));
        match child.join(Duration::from_secs(20)) {
            Ok(0) => {}
            r => fail!(
                "a child that submitted io_uring copies ({} ring) and {}: {r:?}",
                RING[usize::from(iopoll)],
                ["exited", "closed its file and exited", "closed its ring and exited"][mode as usize]
            ),
        }
        if let Err(e) = wait_free(engine, CHILD_QUEUE) {
            fail!("S5: the queue of a child that exited with io_uring copies in flight {e}");
        }
        crate::fuzz::succeeded();
        fact(&format!("io_uring: children exited with commands in flight ({} ring)", RING[usize::from(iopoll)]), 1);
        if racy_read(&self.queues, at, len) {
            self.mem.forget(at, len);
            touch_write(&mut self.queues, at, len);
            return;
        }
        let first = self.regions[ri].read(off, len);
        std::thread::sleep(Duration::from_millis(5));
        let got = self.regions[ri].read(off, len);
        if let Some(i) = (0..len).find(|&i| first[i] != got[i]) {
            fail!("S5: byte {i} of the exited child's copy destination changed after its file was released ({:#04x} -> {:#04x})", first[i], got[i]);
        }
        let old = self.mem.get(at, len);
        let mut new = 0;
        for i in 0..len {
            let want = pattern(seed, i);
            if got[i] == want {
                new += 1;
            } else if old[i].is_some_and(|o| o != got[i]) {
                fail!(
                    "S5: byte {i} of the exited child's copy destination (memfd region offset {}) is {:#04x}: neither the old {:#04x} nor the copy's {want:#04x}",
                    off + i,
                    got[i],
                    old[i].unwrap_or(0)
                );
            }
        }
        fact(
            if new == len {
                "io_uring: exited children's copies found complete"
            } else {
                "io_uring: exited children's copies found incomplete"
            },
            1,
        );
        self.mem.set(at, &got.iter().map(|&v| Some(v)).collect::<Vec<_>>());
        touch_write(&mut self.queues, at, len);
    }
}

/// The last test case failed (`Sut`'s drop while panicking).
pub(crate) static FAILED_CASE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Waits (boundedly, nothing checked) until the queues of the slots can be taken again.
pub(crate) fn wait_slots_free() {
    for q in 0..QUEUE_SLOTS {
        let (engine, queue, _) = slot_queue(q);
        let _ = wait_free(engine, queue);
    }
}

/// Waits until queue (`engine`, `queue`) can be taken by a new file ([`FREE_LIMIT`]); the
/// probe gives it back at once.
fn wait_free(engine: u32, queue: u32) -> Result<(), String> {
    let t = Instant::now();
    let dev = Dev::open(&ctx().path, false).map_err(|e| format!("open: {}", name(e)))?;
    loop {
        let mut a = sys::neuron_udma_queue_init { engine, queue, tx_descs: 32, rx_descs: 32, ..Default::default() };
        match dev.ioctl(sys::NEURON_UDMA_QUEUE_INIT, &mut a) {
            Ok(()) => {
                let mut rel = sys::neuron_udma_queue_id { engine, queue, reserved: 0 };
                dev.ioctl(sys::NEURON_UDMA_QUEUE_RELEASE, &mut rel)
                    .map_err(|e| format!("probe release: {}", name(e)))?;
                return Ok(());
            }
            Err(EBUSY) if t.elapsed() < FREE_LIMIT => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(format!("was still taken after {:?} ({})", t.elapsed(), name(e))),
        }
    }
}

/// The forked child of `Sut::uring_fork` (see there).
#[allow(clippy::too_many_arguments)]
fn uring_child(
    path: &std::path::Path,
    engine: u32,
    iopoll: bool,
    addr: u64,
    len: usize,
    seed: u32,
    stall: u32,
    mode: u8,
) -> Result<(), String> {
    let dev = Dev::open(path, false).map_err(|e| format!("open: {}", name(e)))?;
    let size = len.div_ceil(4096) * 4096;
    let mut a =
        sys::neuron_udma_mem_alloc { size: size as u64, type_: sys::NEURON_UDMA_MEM_HOST, ..Default::default() };
    dev.ioctl(sys::NEURON_UDMA_MEM_ALLOC, &mut a).map_err(|e| format!("MEM_ALLOC: {}", name(e)))?;
    let map = Mapping::new(dev.raw(), size, a.mmap_offset, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED)
        .map_err(|e| format!("mmap: {}", name(e)))?;
    map.write(0, &(0..len).map(|i| pattern(seed, i)).collect::<Vec<u8>>());
    let mut im = sys::neuron_udma_mem_import {
        addr,
        size: len as u64,
        flags: sys::NEURON_UDMA_IMPORT_WRITE,
        ..Default::default()
    };
    dev.ioctl(sys::NEURON_UDMA_MEM_IMPORT, &mut im).map_err(|e| format!("MEM_IMPORT: {}", name(e)))?;
    let mut qi =
        sys::neuron_udma_queue_init { engine, queue: CHILD_QUEUE, tx_descs: 128, rx_descs: 128, ..Default::default() };
    dev.ioctl(sys::NEURON_UDMA_QUEUE_INIT, &mut qi).map_err(|e| format!("QUEUE_INIT: {}", name(e)))?;
    if stall > 0 {
        if let Some(w) = ctx().window.as_ref() {
            w.inject(FaultKind::Stall, engine, CHILD_QUEUE, stall);
        }
    }
    let half = if len > 4096 { len / 2 } else { len };
    let copies: Vec<sys::neuron_udma_copy> = [(0, half), (half, len - half)]
        .iter()
        .filter(|&&(_, n)| n > 0)
        .map(|&(o, n)| sys::neuron_udma_copy {
            src_handle: a.handle,
            src_offset: o as u64,
            dst_handle: im.handle,
            dst_offset: o as u64,
            size: n as u32,
            barrier: sys::NEURON_UDMA_BARRIER_NONE,
            flags: sys::NEURON_UDMA_COPY_SPLIT,
            reserved: 0,
        })
        .collect();
    let mut ring = make_ring(iopoll, 8).map_err(|e| format!("io_uring setup: {e}"))?;
    for (i, c) in copies.iter().enumerate() {
        let cmd = command(engine, CHILD_QUEUE, 1, c as *const sys::neuron_udma_copy as u64);
        let sqe = opcode::UringCmd16::new(types::Fd(dev.raw()), sys::NEURON_UDMA_URING_COPY)
            .cmd(cmd)
            .build()
            .user_data(i as u64);
        // SAFETY: `copies` outlives the commands (the process exits with them in flight).
        unsafe { ring.submission().push(&sqe) }.map_err(|_| "SQ full".to_string())?;
    }
    ring.submit().map_err(|e| format!("io_uring_enter: {e}"))?;
    // Issued (their fences submitted), or refused (a CQE: an error here).
    let t = Instant::now();
    loop {
        let mut s = sys::neuron_udma_fence_status {
            engine,
            queue: CHILD_QUEUE,
            fence: copies.len() as u64,
            ..Default::default()
        };
        if ioctl_ret(dev.raw(), abi3::FENCE_STATUS, &mut s).is_ok() {
            break;
        }
        if let Some(&(id, res)) =
            take_cqes(&mut ring).map_err(|e| format!("io_uring_enter: {e}"))?.iter().find(|c| c.1 < 0)
        {
            return Err(format!("URING_COPY {id}: CQE res {res}"));
        }
        if t.elapsed() > ISSUE_LIMIT {
            return Err("the commands were not issued within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    match mode {
        1 => {
            drop(map);
            drop(dev);
            std::mem::forget(ring);
        }
        2 => {
            drop(ring);
            std::mem::forget((map, dev));
        }
        _ => std::mem::forget((map, dev, ring)),
    }
    std::mem::forget(copies);
    Ok(())
}
