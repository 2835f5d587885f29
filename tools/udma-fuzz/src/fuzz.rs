// SPDX-License-Identifier: GPL-2.0
//! The state machine: the operations (every ioctl with valid and invalid arguments, mmap and
//! munmap, fork, close and reopen, signals during waits, a second process and threads, and
//! the model's faults), how they are generated, and what the device must answer to each one
//! according to the reference model (`model.rs`). Imports live in `import.rs`, fences and
//! their events in `fence.rs`, two threads on one file in `race.rs`, unbind in `unbind.rs`.
//!
//! Operations name buffers and queues by small slot numbers, so every operation is valid in
//! every state and any subsequence of a failing run is a run: proptest's shrinking deletes and
//! simplifies operations freely. The expected answer of an operation is computed from the
//! model at the time it runs.

use crate::dev::{ioctl_raw, ioctl_ret, Dev, Errno, FaultKind, FaultWindow, Mapping, Region};
use crate::model::*;
use crate::workers::{self, Child};
use libc::{
    E2BIG, EBADF, EBUSY, EFAULT, EINTR, EINVAL, EIO, ENOENT, ENOMEM, ENOSPC, ENOTTY, EOPNOTSUPP, EPERM, ERANGE, ESTALE,
    ETIMEDOUT, EXDEV,
};
use neuron_udma::sys;
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// One copy entry of a `Prepare` operation.
#[derive(Clone, Debug)]
pub struct CopyOp {
    pub(crate) src: u8,
    pub(crate) dst: u8,
    pub(crate) soff: u16,
    pub(crate) doff: u16,
    pub(crate) size: u8,
    pub(crate) barrier: u8,
    /// `NEURON_UDMA_COPY_SPLIT`.
    pub(crate) split: bool,
    pub(crate) bad: u8,
}

/// One operation of the state machine. `file` fields pick a file (0 or 1) or, for queue
/// operations, the queue's owner (0) or the other file (1); `how` picks the valid call (0,
/// the most likely) or one of the invalid variants.
#[derive(Clone, Debug)]
pub enum Op {
    /// `MEM_ALLOC` into a buffer slot.
    Alloc { file: u8, slot: u8, kind: u8, size: u8 },
    /// `MEM_FREE` of a slot's buffer.
    Free { file: u8, slot: u8, how: u8 },
    /// `mmap()` of a slot's buffer.
    Map { file: u8, slot: u8, how: u8 },
    /// `munmap()` of a slot's mapping.
    Unmap { file: u8, slot: u8 },
    /// Writes bytes through a mapping (or into an import's memory).
    Write { file: u8, slot: u8, off: u16, len: u16, seed: u8 },
    /// Compares a buffer's bytes with the model (through its mapping, the import's memory, or
    /// a MEMCPY).
    Check { file: u8, slot: u8 },
    /// `QUEUE_INIT` of a queue slot.
    QueueInit { file: u8, q: u8, tx: u8, rx: u8, how: u8 },
    /// `QUEUE_RELEASE`.
    QueueRelease { file: u8, q: u8, how: u8 },
    /// `COPY_PREPARE` (or `COPY_PREPARE_ONE` of the first entry).
    Prepare { file: u8, q: u8, one: bool, copies: Vec<CopyOp>, how: u8 },
    /// `COPY_START`.
    Start { file: u8, q: u8, n: u8, tx: bool, how: u8 },
    /// `COPY_WAIT` (default or short timeout, or with a signal arriving).
    Wait { file: u8, q: u8, how: u8, us: u16 },
    /// `QUEUE_STATE` (also from a read-only file).
    State { file: u8, q: u8, ro: bool },
    /// `MEMCPY` between two slots.
    Memcpy { file: u8, src: u8, dst: u8, soff: u16, doff: u16, size: u8, how: u8 },
    /// `fork()`: the child uses the file, exits, or closes it.
    Fork { file: u8, how: u8 },
    /// Closes a file (releasing everything it owns) and opens it again.
    Reopen { file: u8 },
    /// Starts (or joins) the second process.
    Second { join: bool },
    /// A thread copies with MEMCPY on its own file while this one waits on a queue.
    Thread { q: u8 },
    /// Injects one of the model's faults (fault storms).
    Fault { kind: u8, q: u8, arg: u8 },
    /// Unknown commands, bad pointers, writes through a read-only file.
    BadIoctl { how: u8 },
    /// `MEM_IMPORT` of part of a memory region of the process into a slot.
    Import { file: u8, slot: u8, region: u8, off: u16, len: u8, write: bool, how: u8 },
    /// `COPY_SUBMIT`.
    Submit { file: u8, q: u8, how: u8 },
    /// `FENCE_STATUS`.
    FenceStatus { file: u8, q: u8, which: u8, ro: bool },
    /// `FENCE_WAIT`.
    FenceWait { file: u8, q: u8, which: u8, how: u8, us: u16 },
    /// `QUEUE_EVENTS`.
    Events { file: u8, how: u8 },
    /// `QUEUE_EVENTFD` (register, unregister, bad descriptors) or reading the eventfd.
    EventFd { file: u8, q: u8, how: u8 },
    /// `poll()` of a file.
    Poll { file: u8, how: u8 },
    /// `fork()` with live imports: the child copies from (or into) an import, the parent
    /// checks the bytes.
    ForkImport { file: u8, src: u8, dst: u8, soff: u16, size: u8, how: u8 },
    /// Two threads call into one file at once.
    Race { kind: u8, a: u8, b: u8, x: u16 },
    /// Unbinds the device and binds it again (`--unbind` only).
    Unbind { how: u8 },
    /// `MEMSET` of part of a slot's buffer.
    Memset { file: u8, slot: u8, off: u16, size: u8, value: u8, how: u8 },
    /// `DMABUF_IMPORT` of the udmabuf or of an export into a slot.
    DmabufImport { file: u8, slot: u8, src: u8, write: bool, how: u8 },
    /// `DMABUF_EXPORT` of a slot's device buffer (or closing an export's descriptor).
    DmabufExport { file: u8, slot: u8, cloexec: bool, how: u8 },
    /// io_uring `NEURON_UDMA_URING_COPY`: 1..3 SQEs (the copies shared out among them) on the
    /// normal or the IOPOLL ring, the queue stalled first or not (`uring.rs`).
    Uring { file: u8, q: u8, iopoll: bool, n: u8, copies: Vec<CopyOp>, stall: u8, how: u8 },
    /// Reaps CQEs of one ring: what is there, one, or every command's.
    UringReap { iopoll: bool, how: u8 },
    /// A forked child submits `URING_COPY`s into the parent's shared memory and exits with
    /// them in flight.
    UringFork { iopoll: bool, how: u8, x: u16 },
}

/// Names of the operation kinds, for the operation mix.
pub const OP_NAMES: [&str; OPS] = [
    "alloc",
    "free",
    "mmap",
    "munmap",
    "write",
    "check",
    "queue_init",
    "queue_release",
    "prepare",
    "start",
    "wait",
    "queue_state",
    "memcpy",
    "fork",
    "reopen",
    "second_process",
    "thread",
    "fault",
    "bad_ioctl",
    "import",
    "submit",
    "fence_status",
    "fence_wait",
    "queue_events",
    "eventfd",
    "poll",
    "fork_import",
    "race",
    "unbind",
    "memset",
    "dmabuf_import",
    "dmabuf_export",
    "uring",
    "uring_reap",
    "uring_fork",
];
/// Operation kinds.
pub const OPS: usize = 35;
/// `CUR_OP` of a wait run by another operation.
pub(crate) const OP_WAIT: u64 = 10;

impl Op {
    fn kind(&self) -> usize {
        match self {
            Op::Alloc { .. } => 0,
            Op::Free { .. } => 1,
            Op::Map { .. } => 2,
            Op::Unmap { .. } => 3,
            Op::Write { .. } => 4,
            Op::Check { .. } => 5,
            Op::QueueInit { .. } => 6,
            Op::QueueRelease { .. } => 7,
            Op::Prepare { .. } => 8,
            Op::Start { .. } => 9,
            Op::Wait { .. } => 10,
            Op::State { .. } => 11,
            Op::Memcpy { .. } => 12,
            Op::Fork { .. } => 13,
            Op::Reopen { .. } => 14,
            Op::Second { .. } => 15,
            Op::Thread { .. } => 16,
            Op::Fault { .. } => 17,
            Op::BadIoctl { .. } => 18,
            Op::Import { .. } => 19,
            Op::Submit { .. } => 20,
            Op::FenceStatus { .. } => 21,
            Op::FenceWait { .. } => 22,
            Op::Events { .. } => 23,
            Op::EventFd { .. } => 24,
            Op::Poll { .. } => 25,
            Op::ForkImport { .. } => 26,
            Op::Race { .. } => 27,
            Op::Unbind { .. } => 28,
            Op::Memset { .. } => 29,
            Op::DmabufImport { .. } => 30,
            Op::DmabufExport { .. } => 31,
            Op::Uring { .. } => 32,
            Op::UringReap { .. } => 33,
            Op::UringFork { .. } => 34,
        }
    }
}

/// Operations run, by kind (`OP_NAMES`), since the start of the program.
pub static OP_COUNTS: [AtomicU64; OPS] = [const { AtomicU64::new(0) }; OPS];
/// Faults injected, by kind: fail_nth, abort, stall, slow, slow off, clear.
pub static FAULT_COUNTS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
/// Calls that succeeded, by operation kind (`OP_NAMES`; the last entry: teardown).
pub static OP_OK: [AtomicU64; OPS + 1] = [const { AtomicU64::new(0) }; OPS + 1];
/// Wall time spent, by operation kind (`OP_NAMES`; the last entry: opening and closing test
/// cases), in nanoseconds.
pub static OP_NANOS: [AtomicU64; OPS + 1] = [const { AtomicU64::new(0) }; OPS + 1];

/// Profile of parts of operations: (what, nanoseconds).
pub static PARTS: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// Nanoseconds since `t`.
fn nanos_since(t: std::time::Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Runs `f`, adding its wall time to part `what` of `PARTS`.
pub(crate) fn part<R>(what: &str, f: impl FnOnce() -> R) -> R {
    let t = std::time::Instant::now();
    let r = f();
    add_to(&PARTS, what, nanos_since(t));
    r
}

/// Adds the time since `t` to entry `kind` of `OP_NANOS`.
fn spent(kind: usize, t: std::time::Instant) {
    OP_NANOS[kind].fetch_add(nanos_since(t), Relaxed);
}
pub(crate) static CUR_OP: AtomicU64 = AtomicU64::new(0);
/// Facts seen: imports by region kind and their runs, split copies and their pairs, unbinds.
pub static FACTS: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// Counts a fact for the summary.
pub(crate) fn fact(what: &str, n: u64) {
    add_to(&FACTS, what, n);
}

/// Adds `n` to the entry `what` of a summary list (`FACTS`, `PARTS`), first seen first.
fn add_to(list: &Mutex<Vec<(String, u64)>>, what: &str, n: u64) {
    let mut v = list.lock().unwrap_or_else(|e| e.into_inner());
    match v.iter_mut().find(|(k, _)| k == what) {
        Some(e) => e.1 += n,
        None => v.push((what.to_string(), n)),
    }
}

/// Counts the running operation as one that succeeded (for calls not checked by `expect`).
pub(crate) fn succeeded() {
    OP_OK[CUR_OP.load(Relaxed) as usize].fetch_add(1, Relaxed);
}
/// Answers checked, by errno (0: success).
pub static OUTCOMES: [AtomicU64; 128] = [const { AtomicU64::new(0) }; 128];
/// Whether generated sequences contain fault injections.
pub static FAULTS: AtomicBool = AtomicBool::new(false);
/// `--before-i33`: the model of the driver before the fix of issue 33 (fence numbers restart at
/// 1 with each `QUEUE_INIT`; an IOPOLL command of an ended queue instance may complete with
/// the errno of whatever instance holds the id when it is polled). A CQE with res 0 still
/// promises the copy's bytes.
pub static BEFORE_I33: AtomicBool = AtomicBool::new(false);
/// Whether the io_uring operations are generated (`--uring`).
pub static URING: AtomicBool = AtomicBool::new(true);

/// What every test case shares: the device and the engines the slots use.
#[derive(Debug)]
pub struct Ctx {
    /// The device node.
    pub path: PathBuf,
    /// Its `INFO`.
    pub info: sys::neuron_udma_info,
    /// Engines: slots 0 and 1 use `engines[0]` (queues 2 and 3), slot 2 `engines[1]`, slot 3
    /// `engines[2]`; the second process `engines[3]`.
    pub engines: [u32; 4],
    /// The model's fault window, if this is the model and we may map it.
    pub window: Option<FaultWindow>,
    /// The PCI device behind the node (for unbind), if known.
    pub bdf: Option<String>,
    /// Generate `Unbind` operations.
    pub unbind: bool,
}

static CTX: OnceLock<Ctx> = OnceLock::new();
/// The model of the engines, kept across test cases (an abort outlives a case).
static ENGINES: Mutex<[EngineM; 3]> = Mutex::new([EngineM { armed: false, maybe_aborted: false }; 3]);
/// The newest handle seen: handles are never reused, so each new one is larger.
static LAST_HANDLE: AtomicU64 = AtomicU64::new(0);
pub(crate) static PATTERN_SEQ: AtomicU64 = AtomicU64::new(1);

/// Sets the shared context (once).
pub fn init(ctx: Ctx) {
    CTX.set(ctx).expect("init once");
    extern "C" fn on_alarm(_: libc::c_int) {}
    // SAFETY: installs an empty handler without SA_RESTART, so a SIGALRM interrupts a wait.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
    }
}

pub(crate) fn ctx() -> &'static Ctx {
    CTX.get().expect("fuzz::init")
}

/// (engine, queue) of queue slot `q`, and the index of its engine in `ENGINES`.
pub(crate) fn slot_queue(q: usize) -> (u32, u32, usize) {
    let e = &ctx().engines;
    match q % QUEUE_SLOTS {
        0 => (e[0], 2, 0),
        1 => (e[0], 3, 0),
        2 => (e[1], 2, 1),
        _ => (e[2], 2, 2),
    }
}

pub(crate) fn engines() -> std::sync::MutexGuard<'static, [EngineM; 3]> {
    ENGINES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Fails the test case with the operation's context.
macro_rules! fail {
    ($($arg:tt)*) => { panic!($($arg)*) };
}
pub(crate) use fail;

/// Counts an answer checked.
pub(crate) fn count(got: Result<(), Errno>) {
    OUTCOMES[got.err().unwrap_or(0).clamp(0, 127) as usize].fetch_add(1, Relaxed);
    if got.is_ok() {
        OP_OK[CUR_OP.load(Relaxed) as usize].fetch_add(1, Relaxed);
    }
}

/// Print every operation and every answer checked (`--trace`).
pub static TRACE: AtomicBool = AtomicBool::new(false);

/// Checks a call's result against the allowed outcomes: `ok` (success allowed) and `errs`.
pub(crate) fn expect<T>(what: &str, got: Result<T, Errno>, ok: bool, errs: &[Errno]) -> Result<T, Errno> {
    count(got.as_ref().map(|_| ()).map_err(|e| *e));
    if TRACE.load(Relaxed) {
        println!("#       {what}: {}", show(got.as_ref().map(|_| ()).map_err(|e| *e)));
    }
    match got {
        Ok(v) if ok => Ok(v),
        Err(e) if errs.contains(&e) => Err(e),
        got => fail!(
            "{what}: got {}, expected {}{}",
            show(got.as_ref().map(|_| ()).map_err(|e| *e)),
            if ok { "success" } else { "" },
            errs.iter().map(|e| format!("{}{}", if ok { " or " } else { " " }, name(*e))).collect::<String>()
        ),
    }
}

pub(crate) fn show(r: Result<(), Errno>) -> String {
    match r {
        Ok(()) => "success".into(),
        Err(e) => name(e).into(),
    }
}

/// The errno's name.
pub fn name(e: Errno) -> &'static str {
    match e {
        E2BIG => "E2BIG",
        EBADF => "EBADF",
        EBUSY => "EBUSY",
        EFAULT => "EFAULT",
        EINTR => "EINTR",
        EINVAL => "EINVAL",
        EIO => "EIO",
        ENOENT => "ENOENT",
        ENOMEM => "ENOMEM",
        ENOSPC => "ENOSPC",
        ENOTTY => "ENOTTY",
        EOPNOTSUPP => "EOPNOTSUPP",
        EPERM => "EPERM",
        ERANGE => "ERANGE",
        ESTALE => "ESTALE",
        ETIMEDOUT => "ETIMEDOUT",
        EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ECANCELED => "ECANCELED",
        libc::ENXIO => "ENXIO",
        libc::EMFILE => "EMFILE",
        _ => "another errno",
    }
}

/// The reference state machine's own state: nothing (operations are valid in every state;
/// the model lives next to the device in [`Sut`]).
pub struct FuzzRef;

fn how(invalid: u8) -> impl Strategy<Value = u8> {
    prop_oneof![6 => Just(0u8), 1 => 1..=invalid]
}

fn copy_op() -> impl Strategy<Value = CopyOp> {
    (
        any::<u8>(),
        any::<u8>(),
        any::<u16>(),
        any::<u16>(),
        any::<u8>(),
        0u8..3,
        prop_oneof![3 => Just(true), 1 => Just(false)],
        prop_oneof![60 => Just(0u8), 1 => 1u8..=10],
    )
        .prop_map(|(src, dst, soff, doff, size, barrier, split, bad)| CopyOp {
            src: src % 4,
            dst: dst % 4,
            soff,
            doff,
            size,
            barrier,
            split,
            bad,
        })
}

fn file() -> impl Strategy<Value = u8> {
    prop_oneof![9 => Just(0u8), 1 => Just(1u8)]
}

impl ReferenceStateMachine for FuzzRef {
    type State = ();
    type Transition = Op;

    fn init_state() -> BoxedStrategy<()> {
        Just(()).boxed()
    }

    fn transitions(_: &()) -> BoxedStrategy<Op> {
        let q = 0u8..QUEUE_SLOTS as u8;
        let slot = 0u8..BUF_SLOTS as u8;
        let f = 0u8..FILES as u8;
        let base = prop_oneof![
            7 => (f.clone(), slot.clone(), any::<u8>(), any::<u8>()).prop_map(|(file, slot, kind, size)| Op::Alloc { file, slot, kind, size }),
            3 => (f.clone(), slot.clone(), how(3)).prop_map(|(file, slot, how)| Op::Free { file, slot, how }),
            4 => (f.clone(), slot.clone(), how(5)).prop_map(|(file, slot, how)| Op::Map { file, slot, how }),
            1 => (f.clone(), slot.clone()).prop_map(|(file, slot)| Op::Unmap { file, slot }),
            5 => (f.clone(), slot.clone(), any::<u16>(), any::<u16>(), any::<u8>()).prop_map(|(file, slot, off, len, seed)| Op::Write { file, slot, off, len, seed }),
            4 => (f.clone(), slot.clone()).prop_map(|(file, slot)| Op::Check { file, slot }),
            5 => (f.clone(), q.clone(), any::<u8>(), any::<u8>(), how(7)).prop_map(|(file, q, tx, rx, how)| Op::QueueInit { file, q, tx, rx, how }),
            3 => (file(), q.clone(), prop_oneof![4 => Just(0u8), 1 => 1u8..=2, 3 => Just(3u8)]).prop_map(|(file, q, how)| Op::QueueRelease { file, q, how }),
            12 => (file(), q.clone(), any::<bool>(), prop_oneof![3 => prop::collection::vec(copy_op(), 1..=8), 1 => prop::collection::vec(copy_op(), 9..=40)], how(3)).prop_map(|(file, q, one, copies, how)| Op::Prepare { file, q, one, copies, how }),
            3 => (file(), q.clone(), any::<u8>(), any::<bool>(), how(3)).prop_map(|(file, q, n, tx, how)| Op::Start { file, q, n, tx, how }),
            9 => (file(), q.clone(), prop_oneof![6 => Just(0u8), 1 => 1u8..=3], any::<u16>()).prop_map(|(file, q, how, us)| Op::Wait { file, q, how, us }),
            2 => (file(), q.clone(), any::<bool>()).prop_map(|(file, q, ro)| Op::State { file, q, ro }),
            5 => (f.clone(), slot.clone(), slot.clone(), any::<u16>(), any::<u16>(), any::<u8>(), how(5)).prop_map(|(file, src, dst, soff, doff, size, how)| Op::Memcpy { file, src, dst, soff, doff, size, how }),
            1 => (f.clone(), 0u8..3).prop_map(|(file, how)| Op::Fork { file, how }),
            1 => f.clone().prop_map(|file| Op::Reopen { file }),
            1 => any::<bool>().prop_map(|join| Op::Second { join }),
            1 => q.clone().prop_map(|q| Op::Thread { q }),
            2 => (0u8..8).prop_map(|how| Op::BadIoctl { how }),
            7 => (f.clone(), slot.clone(), 0u8..5, any::<u16>(), any::<u8>(), prop_oneof![3 => Just(true), 1 => Just(false)], how(8)).prop_map(|(file, slot, region, off, len, write, how)| Op::Import { file, slot, region, off, len, write, how }),
            4 => (file(), q.clone(), how(3)).prop_map(|(file, q, how)| Op::Submit { file, q, how }),
            2 => (file(), q.clone(), any::<u8>(), prop_oneof![7 => Just(false), 1 => Just(true)]).prop_map(|(file, q, which, ro)| Op::FenceStatus { file, q, which, ro }),
            3 => (file(), q.clone(), any::<u8>(), prop_oneof![6 => Just(0u8), 1 => 1u8..=3], any::<u16>()).prop_map(|(file, q, which, how, us)| Op::FenceWait { file, q, which, how, us }),
            2 => (f.clone(), how(2)).prop_map(|(file, how)| Op::Events { file, how }),
            3 => (file(), q.clone(), prop_oneof![3 => Just(0u8), 2 => Just(1u8), 5 => Just(2u8), 1 => 3u8..=5]).prop_map(|(file, q, how)| Op::EventFd { file, q, how }),
            2 => (f.clone(), 0u8..4).prop_map(|(file, how)| Op::Poll { file, how }),
            1 => (f.clone(), slot.clone(), slot.clone(), any::<u16>(), any::<u8>(), 0u8..4).prop_map(|(file, src, dst, soff, size, how)| Op::ForkImport { file, src, dst, soff, size, how }),
            2 => (0u8..11, any::<u8>(), any::<u8>(), any::<u16>()).prop_map(|(kind, a, b, x)| Op::Race { kind, a, b, x }),
            4 => (f.clone(), slot.clone(), any::<u16>(), any::<u8>(), any::<u8>(), how(7)).prop_map(|(file, slot, off, size, value, how)| Op::Memset { file, slot, off, size, value, how }),
            3 => (f.clone(), slot.clone(), any::<u8>(), prop_oneof![2 => Just(true), 1 => Just(false)], how(6)).prop_map(|(file, slot, src, write, how)| Op::DmabufImport { file, slot, src, write, how }),
            3 => (f.clone(), slot.clone(), any::<bool>(), prop_oneof![4 => Just(0u8), 2 => Just(1u8), 1 => 2u8..=6]).prop_map(|(file, slot, cloexec, how)| Op::DmabufExport { file, slot, cloexec, how }),
            8 => (file(), q.clone(), any::<bool>(), prop_oneof![3 => Just(0u8), 1 => 1u8..3], prop::collection::vec(copy_op(), 1..=6), any::<u8>(), how(7)).prop_map(|(file, q, iopoll, n, copies, stall, how)| Op::Uring { file, q, iopoll, n, copies, stall, how }),
            3 => (any::<bool>(), 0u8..4).prop_map(|(iopoll, how)| Op::UringReap { iopoll, how }),
            1 => (any::<bool>(), any::<u8>(), any::<u16>()).prop_map(|(iopoll, how, x)| Op::UringFork { iopoll, how, x }),
        ];
        let base = if ctx().unbind {
            prop_oneof![200 => base, 1 => (0u8..2).prop_map(|how| Op::Unbind { how })].boxed()
        } else {
            base.boxed()
        };
        if FAULTS.load(Relaxed) && ctx().window.is_some() {
            prop_oneof![
                30 => base,
                2 => (0u8..6, q, any::<u8>()).prop_map(|(kind, q, arg)| Op::Fault { kind, q, arg }),
            ]
            .boxed()
        } else {
            base
        }
    }

    fn apply(state: (), _: &Op) {
        state
    }
}

/// The device side and the reference model of one test case.
pub struct Sut {
    pub(crate) devs: [Dev; FILES],
    pub(crate) ro: Dev,
    pub(crate) files: [FileM; FILES],
    /// The queues by slot, then the ghosts of ended instances (`QUEUE_ENTRIES`, `uring.rs`).
    pub(crate) queues: [Option<QueueM>; QUEUE_ENTRIES],
    /// The bytes of every buffer and region.
    pub(crate) mem: Mem,
    /// Memory regions of the process that imports take (`import.rs`).
    pub(crate) regions: Vec<Region>,
    /// Per file, a host buffer (not in any slot) that device buffers are read into.
    pub(crate) scratch: [(u64, Mapping); FILES],
    /// Handles that no longer exist (freed, or of a closed file).
    pub(crate) stale: Vec<u64>,
    pub(crate) second: Option<Child>,
    /// `QUEUE_INIT`s so far (the order of a file's queues).
    pub(crate) serial: u64,
    /// The `DMABUF_EXPORT` descriptors held (`dmabuf.rs`).
    pub(crate) exports: Vec<crate::dmabuf::ExportM>,
    /// The io_uring rings and the commands in flight (`uring.rs`).
    pub(crate) uring: crate::uring::UringM,
}

pub(crate) const SCRATCH: usize = 73728;

pub(crate) fn open_file() -> (Dev, (u64, Mapping)) {
    let dev = Dev::open(&ctx().path, false).unwrap_or_else(|e| fail!("open: {}", name(e)));
    let mut a =
        sys::neuron_udma_mem_alloc { size: SCRATCH as u64, type_: sys::NEURON_UDMA_MEM_HOST, ..Default::default() };
    dev.ioctl(sys::NEURON_UDMA_MEM_ALLOC, &mut a).unwrap_or_else(|e| fail!("scratch MEM_ALLOC: {}", name(e)));
    let map = Mapping::new(dev.raw(), SCRATCH, a.mmap_offset, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED)
        .unwrap_or_else(|e| fail!("scratch mmap: {}", name(e)));
    note_handle(a.handle);
    (dev, (a.handle, map))
}

pub(crate) fn note_handle(h: u64) {
    let last = LAST_HANDLE.swap(h, Relaxed);
    if h <= last {
        fail!("MEM_ALLOC returned handle {h}, not above the previous one ({last}): handles must never be reused");
    }
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(4096) * 4096
}

/// What a `MEMCPY` (or a child's) will do and must answer.
pub(crate) struct McPlan {
    pub(crate) arg: sys::neuron_udma_memcpy,
    pub(crate) ok: bool,
    pub(crate) errs: Vec<Errno>,
    pub(crate) src: Loc,
    pub(crate) dst: Loc,
    pub(crate) n: usize,
}

impl Sut {
    fn new() -> Self {
        // After a failed case (shrinking runs the next at once), its files may still hold
        // queues for a moment (a file whose last reference an io_uring request dropped is
        // released by a work item).
        if crate::uring::FAILED_CASE.swap(false, Relaxed) {
            crate::uring::wait_slots_free();
        }
        let ((d0, s0), (d1, s1)) = part("open: files", || (open_file(), open_file()));
        let mut s = Self {
            devs: [d0, d1],
            ro: Dev::open(&ctx().path, true).unwrap_or_else(|e| fail!("open read-only: {}", name(e))),
            files: Default::default(),
            queues: Default::default(),
            mem: Mem::default(),
            regions: vec![],
            scratch: [s0, s1],
            stale: vec![u64::MAX >> 1],
            second: None,
            serial: 0,
            exports: vec![],
            uring: Default::default(),
        };
        part("open: regions", || s.map_regions());
        s
    }

    /// The handle a copy's or MEMCPY's slot number names in file `f`: 0..3 its own slots (an
    /// empty one stands for the next buffer of the file), 4 another file's buffer, 5 a stale
    /// handle (the last two, and a file without buffers, are `ENOENT`).
    pub(crate) fn handle(&self, f: usize, slot: u8) -> Option<u64> {
        let bufs = &self.files[f].bufs;
        match slot % 6 {
            s @ 0..=3 => (0..BUF_SLOTS).find_map(|i| bufs[(s as usize + i) % BUF_SLOTS].as_ref()).map(|b| b.handle),
            4 => self.files[1 - f].bufs.iter().flatten().next().map(|b| b.handle),
            _ => None,
        }
    }

    /// The buffer slot an operation on slot `slot` of file `f` uses: `slot`, or if it is empty
    /// (or not one the CPU can write when `cpu`), the next one that fits (`slot` when none
    /// does).
    pub(crate) fn bslot(&self, f: usize, slot: usize, cpu: bool) -> usize {
        (0..BUF_SLOTS)
            .map(|i| (slot + i) % BUF_SLOTS)
            .find(|&s| self.files[f].bufs[s].as_ref().is_some_and(|b| !cpu || self.cpu_writable(b)))
            .unwrap_or(slot)
    }

    /// Whether the CPU can write the buffer's bytes (a host buffer through its mapping, an
    /// import through the process's own writable memory).
    pub(crate) fn cpu_writable(&self, b: &BufM) -> bool {
        match b.kind {
            Kind::Host => true,
            Kind::Device | Kind::OwnExport { .. } => false,
            Kind::Import { region, .. } => self.region_writable(region),
        }
    }

    /// The queue slot an operation on slot `q` uses: `q`, or if it has no queue, the next
    /// slot that has one (`q` when none has).
    pub(crate) fn qslot(&self, q: usize) -> usize {
        (0..QUEUE_SLOTS).map(|i| (q + i) % QUEUE_SLOTS).find(|&s| self.queues[s].is_some()).unwrap_or(q)
    }

    pub(crate) fn stale_handle(&self) -> u64 {
        *self.stale.last().expect("never empty")
    }

    /// The file a queue operation runs on: the owner, or with `other` the other file.
    pub(crate) fn qfile(&self, q: usize, other: u8) -> usize {
        let owner = self.queues[q].as_ref().map_or(0, |q| q.owner);
        if other == 1 {
            1 - owner
        } else {
            owner
        }
    }

    pub(crate) fn lenient(&self, q: usize) -> bool {
        let (_, _, e) = slot_queue(q);
        let eng = engines()[e];
        eng.armed || eng.maybe_aborted || self.queues[q].as_ref().is_some_and(|q| q.tainted || q.maybe_reset)
    }

    /// Before an operation on queue slot `q`: a tainted queue that somebody listens to (a
    /// polled file, an eventfd, a normal ring's io_uring command) may be reset at any time by the completion engine, which
    /// reads the engine's error state.
    pub(crate) fn refresh(&mut self, q: usize) {
        // io_uring commands waiting on a normal ring listen too (their CQEs come from the
        // completion engine).
        let uring = self.task_work_on(q);
        let Some(m) = self.queues[q].as_mut() else { return };
        if m.tainted && (self.files[m.owner].polled || m.eventfd.is_some() || uring) {
            m.maybe_reset_now();
        }
    }

    /// Lands copies that completed.
    pub(crate) fn land_all(&mut self, landed: Vec<PendingCopy>) {
        for c in &landed {
            land(&mut self.mem, &mut self.queues, c);
        }
    }

    /// The newest fence of queue slot `q`, asked from the driver (`FENCE_STATUS` of fence 1)
    /// when a reset the model did not see leaves it uncertain.
    pub(crate) fn resync(&mut self, q: usize) {
        let Some(m) = self.queues[q].as_ref() else { return };
        if m.newest.0 == m.newest.1 {
            return;
        }
        let (engine, queue, _) = slot_queue(q);
        // The instance's first fence: EINVAL until it is submitted (S1).
        let first = m.first;
        let mut a = sys::neuron_udma_fence_status { engine, queue, fence: first, ..Default::default() };
        let r = ioctl_ret(self.devs[m.owner].raw(), crate::dev::abi3::FENCE_STATUS, &mut a);
        let n = match r {
            Ok(_) => a.submitted,
            Err(EINVAL) => first - 1,
            Err(e) => fail!("FENCE_STATUS of queue slot {q} (to learn its newest fence): {}", name(e)),
        };
        let m = self.queues[q].as_mut().expect("queue");
        if n < m.newest.0 || n > m.newest.1 {
            fail!("queue slot {q}: newest fence {n}, the model says {}..={}", m.newest.0, m.newest.1);
        }
        m.learn_newest(n);
    }

    /// For `--trace`: each queue's fences as the model sees them (newest, done, reported).
    fn fence_views(&self) -> Vec<String> {
        (0..self.queues.len())
            .filter_map(|q| {
                let m = self.queues[q].as_ref()?;
                Some(format!(
                    "queue slot {q}: fences {}..={}, done up to {}, reported {:?}",
                    m.newest.0,
                    m.newest.1,
                    m.done_floor(),
                    m.reported
                ))
            })
            .collect()
    }

    fn apply(&mut self, op: Op) {
        OP_COUNTS[op.kind()].fetch_add(1, Relaxed);
        CUR_OP.store(op.kind() as u64, Relaxed);
        match op {
            Op::Alloc { file, slot, kind, size } => self.alloc(file as usize, slot as usize, kind, size),
            Op::Free { file, slot, how } => {
                self.free(file as usize, self.bslot(file as usize, slot as usize, false), how)
            }
            Op::Map { file, slot, how } => {
                self.map(file as usize, self.map_slot(file as usize, slot as usize, how), how)
            }
            Op::Unmap { file, slot } => {
                let f = file as usize;
                let slot = self.map_slot(f, slot as usize, 0);
                if let Some(b) = self.files[f].bufs[slot].as_mut() {
                    if b.map.take().is_some() {
                        succeeded();
                    }
                }
            }
            Op::Write { file, slot, off, len, seed } => {
                self.write(file as usize, self.bslot(file as usize, slot as usize, true), off, len, seed)
            }
            Op::Check { file, slot } => self.check(file as usize, self.bslot(file as usize, slot as usize, false)),
            Op::QueueInit { file, q, tx, rx, how } => self.queue_init(file as usize, q as usize, tx, rx, how),
            Op::QueueRelease { file, q, how } => self.queue_release(file, q as usize, how),
            Op::Prepare { file, q, one, copies, how } => self.prepare(file, q as usize, one, &copies, how),
            Op::Start { file, q, n, tx, how } => self.start(file, q as usize, n, tx, how),
            Op::Wait { file, q, how, us } => self.wait(file, q as usize, how, us),
            Op::State { file, q, ro } => self.state(file, q as usize, ro),
            Op::Memcpy { file, src, dst, soff, doff, size, how } => {
                let f = file as usize;
                let plan = self.memcpy_plan(f, src, dst, soff, doff, size, how);
                let mut a = plan.arg;
                let r = self.devs[f].ioctl(sys::NEURON_UDMA_MEMCPY, &mut a);
                if expect("MEMCPY", r, plan.ok, &plan.errs).is_ok() {
                    self.memcpy_apply(&plan);
                }
            }
            Op::Fork { file, how } => self.fork(file as usize, how),
            Op::Reopen { file } => self.reopen(file as usize),
            Op::Second { join } => self.second(join),
            Op::Thread { q } => self.thread(q as usize),
            Op::Fault { kind, q, arg } => self.fault(kind, q as usize, arg),
            Op::BadIoctl { how } => self.bad_ioctl(how),
            Op::Import { file, slot, region, off, len, write, how } => {
                self.import(file as usize, slot as usize, region, off, len, write, how)
            }
            Op::Submit { file, q, how } => self.submit(file, q as usize, how),
            Op::FenceStatus { file, q, which, ro } => self.fence_status(file, q as usize, which, ro),
            Op::FenceWait { file, q, which, how, us } => self.fence_wait(file, q as usize, which, how, us),
            Op::Events { file, how } => self.events(file as usize, how),
            Op::EventFd { file, q, how } => self.eventfd(file, q as usize, how),
            Op::Poll { file, how } => self.poll(file as usize, how),
            Op::ForkImport { file, src, dst, soff, size, how } => {
                self.fork_import(file as usize, src, dst, soff, size, how)
            }
            Op::Race { kind, a, b, x } => self.race(kind, a, b, x),
            Op::Unbind { how } => self.unbind(how),
            Op::Memset { file, slot, off, size, value, how } => {
                let f = file as usize;
                self.memset(f, slot, off, size, value, how)
            }
            Op::DmabufImport { file, slot, src, write, how } => {
                self.dmabuf_import(file as usize, slot as usize, src, write, how)
            }
            Op::DmabufExport { file, slot, cloexec, how } => {
                self.dmabuf_export(file as usize, slot as usize, cloexec, how)
            }
            // `--uring off`: the operations are drawn (the seeds replay the same cases) but not
            // run.
            Op::Uring { .. } | Op::UringReap { .. } | Op::UringFork { .. } if !URING.load(Relaxed) => {}
            Op::Uring { file, q, iopoll, n, copies, stall, how } => {
                self.uring(file, q as usize, iopoll, n, &copies, stall, how)
            }
            Op::UringReap { iopoll, how } => self.uring_reap(iopoll, how),
            Op::UringFork { iopoll, how, x } => self.uring_fork(iopoll, how, x),
        }
    }

    /// The slot a mapping operation uses: a host buffer for the valid call.
    fn map_slot(&self, f: usize, slot: usize, how: u8) -> usize {
        if how != 0 {
            return self.bslot(f, slot, false);
        }
        (0..BUF_SLOTS)
            .map(|i| (slot + i) % BUF_SLOTS)
            .find(|&s| self.files[f].bufs[s].as_ref().is_some_and(|b| b.host()))
            .unwrap_or(slot)
    }

    fn alloc(&mut self, f: usize, slot: usize, kind: u8, size: u8) {
        const SIZES: [u64; 8] = [4096, 1, 5000, 65536, 65537, 12288, 100, 8192];
        let info = &ctx().info;
        let mut a = sys::neuron_udma_mem_alloc { size: SIZES[size as usize % 8], ..Default::default() };
        let host = kind % 8 < 4;
        a.type_ = if host { sys::NEURON_UDMA_MEM_HOST } else { sys::NEURON_UDMA_MEM_DEVICE };
        let mut errs = vec![];
        match kind % 8 {
            6 => {
                match size % 5 {
                    0 => a.size = 0,
                    1 => a.type_ = 7,
                    2 => a.flags = 1,
                    3 => a.reserved[1] = 1,
                    _ => {
                        a.type_ = sys::NEURON_UDMA_MEM_HOST;
                        a.size = info.max_host_buffer + 1;
                    }
                }
                errs.push(EINVAL);
            }
            7 => {
                a.size = info.device_mem_size + 4096;
                errs.push(ENOMEM);
            }
            _ => {}
        }
        let want = round_up(a.size);
        let r = self.devs[f].ioctl(sys::NEURON_UDMA_MEM_ALLOC, &mut a);
        if expect("MEM_ALLOC", r, errs.is_empty(), &errs).is_err() {
            return;
        }
        note_handle(a.handle);
        // ABI 3: device buffers map too (through BAR4), so every allocation has an offset.
        if a.size != want || a.mmap_offset == 0 {
            fail!(
                "MEM_ALLOC: size {} mmap_offset {:#x}, expected size {want} and an mmap offset",
                a.size,
                a.mmap_offset
            );
        }
        self.mem.add(a.handle, a.size as usize, Some(0));
        let b = BufM {
            handle: a.handle,
            size: a.size as usize,
            kind: if host { Kind::Host } else { Kind::Device },
            mmap_offset: a.mmap_offset,
            map: None,
            at: (a.handle, 0),
        };
        self.put(f, slot, b);
    }

    /// Puts a new buffer into a slot (the slot's old buffer stays the file's).
    pub(crate) fn put(&mut self, f: usize, slot: usize, b: BufM) {
        if let Some(old) = self.files[f].bufs[slot].replace(b) {
            self.files[f].extra.push(old);
        }
    }

    /// Pending copies of file `f` that reference `handle`, per queue slot: whether one is not
    /// covered by a fence yet (the buffer is certainly busy), and the newest fence that covers
    /// one.
    pub(crate) fn refs(&self, f: usize, handle: u64) -> (bool, Vec<(usize, u64)>) {
        let mut busy = false;
        let mut fenced = vec![];
        for (qi, q) in self.queues.iter().enumerate() {
            let Some(q) = q.as_ref().filter(|q| q.owner == f) else { continue };
            let mut newest = None;
            for p in q.pending.iter().filter(|p| p.handles.0 == handle || p.handles.1 == handle) {
                if p.fence == 0 {
                    busy |= !q.maybe_reset;
                    newest = Some(q.newest.1.max(1));
                } else {
                    newest = Some(newest.unwrap_or(0).max(p.fence));
                }
            }
            if let Some(n) = newest {
                fenced.push((qi, n));
            }
        }
        (busy, fenced)
    }

    fn free(&mut self, f: usize, slot: usize, how: u8) {
        let own = self.files[f].bufs[slot].as_ref().map(|b| b.handle);
        let mut arg = sys::neuron_udma_mem_free::default();
        for q in 0..QUEUE_SLOTS {
            self.refresh(q);
        }
        let (ok, errs): (bool, Vec<Errno>) = match (how % 4, own) {
            (0, Some(h)) => {
                arg.handle = h;
                if TRACE.load(Relaxed) {
                    println!("#       MEM_FREE of buffer {h}: used by {:?}", self.refs(f, h));
                }
                match self.refs(f, h) {
                    // Exported: a descriptor or an import of its dma-buf holds it.
                    _ if self.exported(h) => {
                        fact("MEM_FREE of exported device buffers", 1);
                        (false, vec![EBUSY])
                    }
                    (true, _) => (false, vec![EBUSY]),
                    (false, v) if !v.is_empty() => (true, vec![EBUSY]),
                    _ => (true, vec![]),
                }
            }
            (1, _) => {
                arg.handle = self.handle(f, 4).unwrap_or(self.stale_handle());
                (false, vec![ENOENT])
            }
            (3, h) => {
                arg.handle = h.unwrap_or(0);
                arg.reserved = 1;
                (false, vec![EINVAL])
            }
            _ => {
                arg.handle = self.stale_handle();
                (false, vec![ENOENT])
            }
        };
        let r = self.devs[f].ioctl(sys::NEURON_UDMA_MEM_FREE, &mut arg);
        if expect("MEM_FREE", r, ok, &errs).is_err() || !ok {
            return;
        }
        self.freed(f, slot);
    }

    /// The buffer in slot `slot` of file `f` was freed.
    pub(crate) fn freed(&mut self, f: usize, slot: usize) {
        let h = self.files[f].bufs[slot].as_ref().expect("freed buffer").handle;
        // Freed while only fenced copies used it: the fences that cover them were retired (or,
        // on a queue that may have been reset, dropped).
        for (qi, fence) in self.refs(f, h).1 {
            let m = self.queues[qi].as_mut().expect("queue");
            if m.maybe_reset {
                let last = m.pending.iter().rposition(|p| p.handles.0 == h || p.handles.1 == h).unwrap_or(0);
                let gone: Vec<PendingCopy> = m.pending.drain(..=last).collect();
                drop_pending(&mut self.mem, gone);
            } else {
                let landed = m.done(fence);
                self.land_all(landed);
            }
        }
        let b = self.files[f].bufs[slot].take().expect("freed buffer");
        if b.own_space() {
            self.mem.remove(b.at.0);
        }
        self.stale.push(h);
    }

    fn map(&mut self, f: usize, slot: usize, how: u8) {
        let other = self.files[1 - f].bufs.iter().flatten().find(|b| b.host()).map(|b| b.mmap_offset);
        let fd = self.devs[f].raw();
        let Some(b) = self.files[f].bufs[slot].as_mut() else {
            let r = Mapping::new(fd, 4096, 1 << 40, libc::PROT_READ, libc::MAP_SHARED).map(drop);
            expect("mmap of no buffer", r, false, &[EINVAL]).ok();
            return;
        };
        let host = b.host();
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let (len, off, prot, flags, errs) = match how % 6 {
            0 if host => (b.size, b.mmap_offset, rw, libc::MAP_SHARED, vec![]),
            1 if host => (
                if b.size > 4096 { b.size - 4096 } else { b.size + 4096 },
                b.mmap_offset,
                rw,
                libc::MAP_SHARED,
                vec![EINVAL],
            ),
            2 if host => (b.size, b.mmap_offset, rw, libc::MAP_PRIVATE, vec![EINVAL]),
            3 if host => (b.size, b.mmap_offset, rw | libc::PROT_EXEC, libc::MAP_SHARED, vec![EINVAL, EPERM]),
            4 if other.is_some() => (4096, other.unwrap_or(0), rw, libc::MAP_SHARED, vec![EINVAL]),
            // A device buffer or an import (not mappable through the node), or an offset
            // inside a host buffer.
            _ => (b.size, if host { b.mmap_offset + 4096 } else { 0 }, rw, libc::MAP_SHARED, vec![EINVAL]),
        };
        let r = Mapping::new(fd, len, off, prot, flags);
        let ok = errs.is_empty();
        match r {
            Ok(m) if ok => {
                succeeded();
                // A second mapping of the same buffer is allowed: it must show the bytes of
                // the model (those no copy in flight may write).
                if b.map.is_some() {
                    let (at, size, got) = (b.at, b.size, m.read());
                    self.compare(at, size, &got, "bytes through a second mapping");
                } else {
                    b.map = Some(m);
                }
            }
            r => {
                expect("mmap", r.map(drop), ok, &errs).ok();
            }
        }
    }

    fn write(&mut self, f: usize, slot: usize, off: u16, len: u16, seed: u8) {
        let fd = self.devs[f].raw();
        let Some(b) = self.files[f].bufs[slot].as_ref() else { return };
        if !self.cpu_writable(b) {
            return;
        }
        let o = (off as usize * b.size) >> 16;
        let l = ((len as usize * (b.size - o)) >> 16).max(1);
        let s = PATTERN_SEQ.fetch_add(1, Relaxed) as u32 ^ u32::from(seed) << 24;
        let data: Vec<u8> = (0..l).map(|i| pattern(s, i)).collect();
        let at = b.loc(o);
        if let Kind::Import { region, .. } = b.kind {
            self.regions[region].write(at.1, &data);
        } else {
            let b = self.files[f].bufs[slot].as_mut().expect("slot");
            if b.map.is_none() {
                let rw = libc::PROT_READ | libc::PROT_WRITE;
                let r = Mapping::new(fd, b.size, b.mmap_offset, rw, libc::MAP_SHARED);
                b.map = Some(r.unwrap_or_else(|e| fail!("mmap of host buffer {}: {}", b.handle, name(e))));
            }
            b.map.as_ref().expect("mapped").write(o, &data);
        }
        succeeded();
        self.mem.set(at, &data.iter().map(|&v| Some(v)).collect::<Vec<_>>());
        touch_write(&mut self.queues, at, l);
    }

    /// Compares `got`, the bytes at `at`, with the model (those no copy in flight may write).
    pub(crate) fn compare(&self, at: Loc, len: usize, got: &[u8], what: &str) {
        let want = self.mem.get(at, len);
        let mut racy = vec![false; len];
        for q in self.queues.iter().flatten() {
            for p in q.pending.iter().filter(|p| overlaps(p.dst, p.len, at, len)) {
                let s = p.dst.1.max(at.1) - at.1;
                let e = (p.dst.1 + p.len).min(at.1 + len) - at.1;
                racy[s..e].fill(true);
            }
        }
        for i in 0..len {
            if let (Some(v), false) = (want[i], racy[i]) {
                if got[i] != v {
                    fail!(
                        "{what}: {} byte {i} (of {len}) is {:#04x}, the model says {v:#04x}",
                        if at.0 >= REGION_SPACE {
                            format!("region {} at offset {}", at.0 - REGION_SPACE, at.1)
                        } else {
                            format!("buffer {}", at.0)
                        },
                        got[i]
                    );
                }
            }
        }
    }

    pub(crate) fn check(&mut self, f: usize, slot: usize) {
        let Some(b) = self.files[f].bufs[slot].as_ref() else { return };
        let (h, at, size) = (b.handle, b.at, b.size);
        if let Kind::Import { region, .. } = b.kind {
            let got = self.regions[region].read(at.1, size);
            self.compare(at, size, &got, "bytes of an import (the process's memory)");
            return;
        }
        if let Some(m) = b.map.as_ref() {
            let got = m.read();
            self.compare(at, size, &got, "bytes through mmap");
            return;
        }
        let mut m = sys::neuron_udma_memcpy {
            src_handle: h,
            dst_handle: self.scratch[f].0,
            size: size as u64,
            ..Default::default()
        };
        let r = self.devs[f].ioctl(sys::NEURON_UDMA_MEMCPY, &mut m);
        expect("MEMCPY to the scratch buffer", r, true, &[]).ok();
        let got = self.scratch[f].1.read();
        self.compare(at, size, &got, "bytes copied out with MEMCPY");
    }

    fn queue_init(&mut self, f: usize, q: usize, tx: u8, rx: u8, how: u8) {
        const LOG2: [u32; 8] = [5, 6, 5, 7, 12, 8, 5, 6];
        // Mostly a free slot (EBUSY stays reachable: every fourth call, or all slots taken).
        let free = |s: usize| self.queues[s].is_none();
        // A free id whose released instance still has io_uring commands in flight first: the
        // new instance's fences are what an IOPOLL command of the old one must not take.
        let again = (QUEUE_SLOTS..QUEUE_ENTRIES)
            .filter(|&g| self.queues[g].as_ref().is_some_and(|m| m.gone == Some(Gone::Released) && m.former == f))
            .map(|g| g % QUEUE_SLOTS)
            .find(|&s| free(s));
        let q = if tx % 4 == 3 {
            q
        } else if let Some(s) = again.filter(|_| rx.is_multiple_of(2)) {
            s
        } else {
            (0..QUEUE_SLOTS).map(|i| (q + i) % QUEUE_SLOTS).find(|&s| free(s)).unwrap_or(q)
        };
        let (engine, queue, e) = slot_queue(q);
        let info = &ctx().info;
        let mut a = sys::neuron_udma_queue_init {
            engine,
            queue,
            tx_descs: 1 << LOG2[tx as usize % 8],
            rx_descs: 1 << LOG2[rx as usize % 8],
            ..Default::default()
        };
        let busy = self.queues[q].is_some();
        // A closed file's instance of the id may live on until its io_uring commands complete
        // (S5); once they all did, the id must come free.
        let held = how.is_multiple_of(8) && !busy && self.held(q);
        let (ok, errs) = match how % 8 {
            0 if busy => (false, vec![EBUSY]),
            0 if held => (true, vec![EBUSY]),
            0 => (true, vec![]),
            1 => {
                a.tx_descs = 48;
                (false, vec![EINVAL, EBUSY])
            }
            2 => {
                a.rx_descs = 16;
                (false, vec![EINVAL, EBUSY])
            }
            3 => {
                a.tx_descs = 1 << 24;
                (false, vec![EINVAL, EBUSY])
            }
            4 => {
                a.reserved[0] = 1;
                (false, vec![EINVAL])
            }
            5 => {
                a.engine = info.engines;
                (false, vec![EINVAL])
            }
            6 => {
                // Queue 14 of engine 4 is reserved for collectives on both generations.
                a.engine = 4;
                a.queue = 14;
                (false, vec![EBUSY])
            }
            _ => {
                if info.generation == sys::NEURON_UDMA_GEN_V3 {
                    a.engine = 0; // no host connectivity on Trainium2
                    (false, vec![EOPNOTSUPP])
                } else {
                    a.queue = 16;
                    (false, vec![EINVAL])
                }
            }
        };
        let r = self.devs[f].ioctl(sys::NEURON_UDMA_QUEUE_INIT, &mut a);
        if expect("QUEUE_INIT", r, ok, &errs).is_ok() {
            let eng = engines()[e];
            self.serial += 1;
            let m = QueueM::new(f, self.serial, a.tx_descs, a.rx_descs, eng.armed || eng.maybe_aborted);
            self.queues[q] = Some(m.continue_after(self.fence_base(f, q)));
        }
    }

    /// A queue of the model is gone (released, its file closed, unbind): its copies may or
    /// may not have run.
    pub(crate) fn forget_queue(&mut self, q: usize) {
        if let Some(m) = self.queues[q].take() {
            if let Some(f) = (m.gone.is_none() && m.owner < FILES).then_some(m.owner) {
                self.files[f].last_fence[q] = m.newest.1;
            }
            drop_pending(&mut self.mem, m.pending);
        }
    }

    pub(crate) fn queue_release(&mut self, other: u8, q: usize, how: u8) {
        let q = self.qslot(q);
        let f = self.qfile(q, other);
        let (engine, queue, _) = slot_queue(q);
        let mut a = sys::neuron_udma_queue_id { engine, queue, ..Default::default() };
        let owned = self.queues[q].as_ref().is_some_and(|m| m.owner == f);
        let (ok, errs) = match how % 4 {
            0 | 3 if owned => (true, vec![]),
            2 => {
                a.reserved = 1;
                (false, vec![EINVAL])
            }
            _ => {
                let f2 = 1 - self.queues[q].as_ref().map_or(1, |m| m.owner);
                let r = self.devs[f2].ioctl(sys::NEURON_UDMA_QUEUE_RELEASE, &mut a);
                expect("QUEUE_RELEASE by a file that does not own the queue", r, false, &[ENOENT]).ok();
                return;
            }
        };
        if ok {
            // The newest fence of the instance, exactly (S1: the next one continues it), and
            // room for a ghost of its io_uring commands.
            self.resync(q);
            self.ghost_room(q);
        }
        let rings = self.queues[q].as_ref().map(|m| (m.tx, m.rx));
        let r = self.devs[f].ioctl(sys::NEURON_UDMA_QUEUE_RELEASE, &mut a);
        if expect("QUEUE_RELEASE", r, ok, &errs).is_err() {
            return;
        }
        self.end_instance(q, Gone::Released, None);
        if let (3, Some((tx, rx))) = (how % 4, rings) {
            // Taken again at once by the same file (issue 33): a new instance of the id, whose
            // fences continue the released one's (S1).
            let mut i = sys::neuron_udma_queue_init { engine, queue, tx_descs: tx, rx_descs: rx, ..Default::default() };
            let r = self.devs[f].ioctl(sys::NEURON_UDMA_QUEUE_INIT, &mut i);
            if expect("QUEUE_INIT of the id just released", r, true, &[]).is_ok() {
                let eng = engines()[slot_queue(q).2];
                self.serial += 1;
                let m = QueueM::new(f, self.serial, tx, rx, eng.armed || eng.maybe_aborted);
                self.queues[q] = Some(m.continue_after(self.fence_base(f, q)));
                fact("queue ids released and taken again at once", 1);
            }
        }
    }

    /// The entries of a prepare call on queue slot `q` of file `f`: the raw copies, the model's
    /// copies, the errors of the first bad entry (if any), the pairs each valid entry takes and
    /// whether any asks for `COPY_SPLIT`.
    pub(crate) fn entries(&self, f: usize, copies: &[CopyOp]) -> Entries {
        const SIZES: [u32; 8] = [4096, 1, 64, 65, 1000, 65536, 8192, 3];
        let mut e = Entries::default();
        for c in copies {
            // Bad entries 8 and 9: another file's buffer, a stale handle.
            let sh = self.handle(f, if c.bad == 8 { 4 } else { c.src });
            let dh = self.handle(f, if c.bad == 9 { 5 } else { c.dst });
            let sb = sh.and_then(|h| self.files[f].by_handle(h));
            let db = dh.and_then(|h| self.files[f].by_handle(h));
            let ssz = sb.map_or(4096, |b| b.size);
            let dsz = db.map_or(4096, |b| b.size);
            let so = (c.soff as usize * ssz) >> 16;
            let doff = (c.doff as usize * dsz) >> 16;
            let size = (SIZES[c.size as usize % 8] as usize).min(ssz - so).min(dsz - doff);
            let mut raw = sys::neuron_udma_copy {
                src_handle: sh.unwrap_or(self.stale_handle()),
                src_offset: so as u64,
                dst_handle: dh.unwrap_or(self.stale_handle()),
                dst_offset: doff as u64,
                size: size as u32,
                barrier: u32::from(c.barrier),
                flags: if c.split { sys::NEURON_UDMA_COPY_SPLIT } else { 0 },
                reserved: 0,
            };
            match c.bad {
                1 => raw.size = 0,
                2 => raw.size = 65537,
                3 => raw.barrier = 3,
                // The first copy flag bit the ABI does not define (DST_INT, SPLIT are bits 0, 1).
                4 => raw.flags = 4,
                5 => raw.reserved = 1,
                6 => raw.dst_offset = dsz as u64,
                7 => raw.src_offset = u64::MAX - 1,
                // DST_INT is reserved since ABI 3.
                10 => raw.flags |= sys::NEURON_UDMA_COPY_DST_INT,
                _ => {}
            }
            let mut errs = vec![];
            if matches!(c.bad, 1..=5 | 10) {
                errs.push(EINVAL);
            }
            if matches!(c.bad, 6 | 7) {
                errs.push(ERANGE);
            }
            if sb.is_none() || db.is_none() {
                errs.push(ENOENT);
            }
            let mut pairs = 1;
            if let (Some(sb), Some(db)) = (sb, db) {
                if errs.is_empty() && !db.writable() {
                    errs.push(EPERM);
                }
                pairs = pieces(sb.runs(), so, db.runs(), doff, size);
                if errs.is_empty() && pairs > 1 && !c.split {
                    errs.push(EXDEV);
                }
            }
            if !errs.is_empty() && e.errs.is_none() {
                e.errs = Some(errs);
            }
            e.split |= raw.flags & sys::NEURON_UDMA_COPY_SPLIT != 0;
            e.total += pairs;
            e.largest = e.largest.max(pairs);
            e.per.push(pairs);
            e.raw.push(raw);
            e.pend.push(PendingCopy {
                handles: (raw.src_handle, raw.dst_handle),
                src: sb.map_or((raw.src_handle, so), |b| b.loc(so)),
                dst: db.map_or((raw.dst_handle, doff), |b| b.loc(doff)),
                len: size,
                fence: 0,
                fuzzy: false,
                unordered_read: sb.is_some_and(|b| b.device_memory()) && raw.barrier != sys::NEURON_UDMA_BARRIER_DMB,
                tag: 0,
            });
        }
        e
    }

    /// Adds the pairs of a successful prepare to queue slot `q`.
    pub(crate) fn prepared(&mut self, q: usize, e: Entries) {
        let fuzzy = self.lenient(q);
        let eng = engines()[slot_queue(q).2];
        let m = self.queues[q].as_mut().expect("owned");
        m.unf += e.total;
        m.prep = m.prep.map(|(t, r)| (t + e.total, r + e.total));
        // Pairs prepared while a fault is armed prove nothing: it may strike the engine (from
        // another queue) after they ran.
        if !eng.armed {
            m.since_fault = true;
        }
        if eng.armed || eng.maybe_aborted {
            m.taint();
        }
        for mut p in e.pend {
            p.fuzzy = fuzzy;
            add_pending(&mut self.queues, q, p);
        }
    }

    /// The errors a prepare of `e` on queue slot `q` may answer beyond its entries' (ring
    /// space): (must fail, may fail).
    pub(crate) fn space_errs(&self, q: usize, e: &Entries) -> (bool, Vec<Errno>) {
        let m = self.queues[q].as_ref().expect("owned");
        let cap = m.cap();
        if e.largest > cap {
            return (true, vec![E2BIG]);
        }
        if e.total > cap.saturating_sub(m.lo()) {
            (true, vec![ENOSPC])
        } else if e.total > cap.saturating_sub(m.hi()) {
            (false, vec![ENOSPC])
        } else {
            (false, vec![])
        }
    }

    fn prepare(&mut self, other: u8, q: usize, one: bool, copies: &[CopyOp], how: u8) {
        let q = self.qslot(q);
        self.refresh(q);
        let f = self.qfile(q, other);
        let (engine, queue, _) = slot_queue(q);
        let owned = self.queues[q].as_ref().is_some_and(|m| m.owner == f);
        let copies = if one { &copies[..1] } else { copies };
        let e = self.entries(f, copies);
        let count = e.raw.len() as u32;
        let mut errs: Vec<Errno>;
        let r = if one {
            errs = if owned { e.errs.clone().unwrap_or_default() } else { vec![ENOENT] };
            let mut a = sys::neuron_udma_copy_prepare_one { engine, queue, copy: e.raw[0] };
            ioctl_ret(self.devs[f].raw(), sys::NEURON_UDMA_COPY_PREPARE_ONE, &mut a)
        } else {
            let mut a =
                sys::neuron_udma_copy_prepare { engine, queue, count, reserved: 0, copies: e.raw.as_ptr() as u64 };
            errs = match how % 4 {
                1 => {
                    a.count = 0;
                    vec![EINVAL]
                }
                2 => {
                    a.copies = 8;
                    vec![EFAULT]
                }
                3 => {
                    a.count = ctx().info.max_batch + 1;
                    vec![EINVAL]
                }
                _ if !owned => vec![ENOENT],
                _ => e.errs.clone().unwrap_or_default(),
            };
            ioctl_ret(self.devs[f].raw(), sys::NEURON_UDMA_COPY_PREPARE, &mut a)
        };
        let mut ok = errs.is_empty();
        if ok {
            let (must, more) = self.space_errs(q, &e);
            ok = !must;
            errs.extend(more);
        }
        let what =
            format!("COPY_PREPARE{} of {count} ({} pairs) on queue slot {q}", if one { "_ONE" } else { "" }, e.total);
        let Ok(n) = expect(&what, r, ok, &errs) else { return };
        let want = if e.split { e.total as i32 } else { 0 };
        if n != want {
            fail!("{what}: returned {n}, expected {want} (the pairs written with COPY_SPLIT, else 0)");
        }
        if e.split {
            fact("split copies (calls with COPY_SPLIT)", 1);
            fact("pairs of split calls", u64::from(e.total));
            if e.largest > 1 {
                fact("split calls that crossed runs", 1);
            }
        }
        self.prepared(q, e);
    }

    fn start(&mut self, other: u8, q: usize, n: u8, tx: bool, how: u8) {
        let q = self.qslot(q);
        self.refresh(q);
        let f = self.qfile(q, other);
        let (engine, queue, _) = slot_queue(q);
        let Some(m) = self.queues[q].as_ref().filter(|m| m.owner == f) else {
            let mut a = sys::neuron_udma_copy_start { engine, queue, m2s_count: 0, s2m_count: 1, reserved: 0 };
            let r = self.devs[f].ioctl(sys::NEURON_UDMA_COPY_START, &mut a);
            expect("COPY_START on a queue not of this file", r, false, &[ENOENT]).ok();
            return;
        };
        let (ptx, prx) = m.prep.unwrap_or((m.unf, m.unf));
        let k = if prx == 0 { 0 } else { 1 + u32::from(n) % prx };
        let mut a = sys::neuron_udma_copy_start {
            engine,
            queue,
            m2s_count: if tx { k.min(ptx) } else { 0 },
            s2m_count: k,
            reserved: 0,
        };
        match how % 4 {
            1 => a.s2m_count = 0,
            2 => a.s2m_count = prx + 1,
            3 => {
                a.s2m_count = a.s2m_count.max(1);
                a.m2s_count = ptx + 1;
            }
            _ => {}
        }
        let valid = a.s2m_count != 0 && a.s2m_count <= prx && a.m2s_count <= ptx;
        // Without the exact counts (a reset may have dropped them) EINVAL is allowed too; so in
        // a fault storm on this queue's engine, where the completion engine may reset a watched
        // queue at any time (a fault_storm run saw EINVAL for 2 of 6 prepared Rx; the replay
        // passed).
        let known = m.prep.is_some() && !self.lenient(q);
        let ok = if known { valid } else { a.s2m_count != 0 };
        let errs: &[Errno] = if !known || !valid { &[EINVAL] } else { &[] };
        let r = self.devs[f].ioctl(sys::NEURON_UDMA_COPY_START, &mut a);
        if expect(&format!("COPY_START m2s {} s2m {} (prepared {ptx}/{prx})", a.m2s_count, a.s2m_count), r, ok, errs)
            .is_ok()
        {
            let m = self.queues[q].as_mut().expect("owned");
            m.prep = m.prep.map(|(t, r)| (t.saturating_sub(a.m2s_count), r.saturating_sub(a.s2m_count)));
        }
    }

    pub(crate) fn wait(&mut self, other: u8, q: usize, how: u8, us: u16) {
        let q = self.qslot(q);
        self.refresh(q);
        let f = self.qfile(q, other);
        let (engine, queue, e) = slot_queue(q);
        let mut a = sys::neuron_udma_copy_wait { engine, queue, ..Default::default() };
        let owned = self.queues[q].as_ref().is_some_and(|m| m.owner == f);
        let lenient = self.lenient(q);
        let mut errs = vec![];
        match how % 4 {
            1 => {
                a.timeout_ms = 10 + u32::from(us) % 40;
                errs.push(ETIMEDOUT);
            }
            2 => errs.push(EINTR),
            3 => a.reserved = 1,
            _ => {}
        }
        if lenient {
            errs.extend([EIO, ETIMEDOUT]);
        }
        // io_uring task work (a normal ring's CQE) interrupts the wait as a signal does.
        let task_work = self.task_work_eintr();
        if task_work && how % 4 != 2 {
            errs.push(EINTR);
        }
        let ok = owned && how % 4 != 3;
        if !ok {
            errs = vec![if how % 4 == 3 { EINVAL } else { ENOENT }];
        }
        let before = self.queues[q].as_ref().map(|m| (m.unf, m.hi(), m.groups.is_empty() && !m.maybe_reset));
        let r = with_alarm(how % 4 == 2, us, || self.devs[f].ioctl(sys::NEURON_UDMA_COPY_WAIT, &mut a));
        let r = expect(&format!("COPY_WAIT on queue slot {q}"), r, ok, &errs);
        if r == Err(EINTR) && how % 4 != 2 {
            fact("EINTR without a signal (io_uring task work): COPY_WAIT", 1);
        }
        if !ok {
            return;
        }
        let (unf, hi, certain) = before.expect("owned");
        let m = self.queues[q].as_mut().expect("owned");
        match r {
            // The marker was appended (when there was work no fence covered) and the copies go
            // on; since ABI 3 a timeout resets only a queue without progress for 10 s (a
            // faulted one).
            Err(err @ (EINTR | ETIMEDOUT)) => {
                m.fence_now();
                if lenient {
                    m.pending.iter_mut().for_each(|p| p.fuzzy = true);
                    if err == ETIMEDOUT {
                        m.maybe_reset_now();
                    }
                }
            }
            // The engine failed: the queue was reset; what had not completed is lost.
            Err(_) => {
                m.fence_now();
                let had_work = hi > 0;
                if m.maybe_reset {
                    m.maybe_reset_now();
                } else {
                    let k = m.newest.1;
                    let dropped = m.reset(k);
                    drop_pending(&mut self.mem, dropped);
                }
                self.healed(q, e, had_work);
            }
            Ok(()) => {
                // Only copies that ran after the newest fault show the engine out of abort.
                let proof = m.since_fault;
                let got = a.completed;
                let expected = if unf > 0 { u64::from(unf) + 1 } else { 0 };
                if (certain && !lenient && got != expected) || got > u64::from(hi) + 1 {
                    fail!("COPY_WAIT on queue slot {q}: completed {got} pairs, the model says {expected} (at most {} with fences in flight)", hi + 1);
                }
                m.fence_now();
                let landed = m.all_done();
                self.land_all(landed);
                self.resync(q);
                self.healed(q, e, hi > 0 && proof);
            }
        }
    }

    /// A wait returned on queue slot `q` (engine index `e`) with proof that the engine is
    /// healthy (`had_work`: it failed, so its wait reset the queue and with it the engine, or
    /// it succeeded with pairs prepared after the newest fault, `QueueM::since_fault`): once no
    /// fault is armed, the engine is out of abort state and the queue is strict again.
    pub(crate) fn healed(&mut self, q: usize, e: usize, had_work: bool) {
        let mut eng = engines();
        if had_work && !eng[e].armed {
            eng[e].maybe_aborted = false;
            if let Some(m) = self.queues[q].as_mut() {
                m.tainted = false;
                if m.maybe_reset && m.newest.0 == m.newest.1 && m.prep.is_some() {
                    m.maybe_reset = false;
                }
            }
        }
    }

    fn state(&mut self, other: u8, q: usize, ro: bool) {
        let q = self.qslot(q);
        self.refresh(q);
        let (engine, queue, _) = slot_queue(q);
        let mut a = sys::neuron_udma_queue_state { engine, queue, ..Default::default() };
        if ro {
            let r = self.ro.ioctl(sys::NEURON_UDMA_QUEUE_STATE, &mut a);
            expect("QUEUE_STATE from a read-only file", r, false, &[ENOENT]).ok();
            return;
        }
        let f = self.qfile(q, other);
        if self.queues[q].as_ref().is_none_or(|m| m.owner != f) {
            let r = self.devs[f].ioctl(sys::NEURON_UDMA_QUEUE_STATE, &mut a);
            expect("QUEUE_STATE of a queue not of this file", r, false, &[ENOENT]).ok();
            return;
        }
        let r = self.devs[f].ioctl(sys::NEURON_UDMA_QUEUE_STATE, &mut a);
        expect("QUEUE_STATE", r, true, &[]).ok();
        self.check_state(q, &a, "QUEUE_STATE");
    }

    /// Checks a `QUEUE_STATE` answer of queue slot `q` against the model.
    pub(crate) fn check_state(&self, q: usize, a: &sys::neuron_udma_queue_state, what: &str) {
        let m = self.queues[q].as_ref().expect("queue");
        let (ptx, prx) = m.prep.map_or((None, None), |(t, r)| (Some(t), Some(r)));
        for (ring, s, size, pending) in [("tx", &a.tx, m.tx, ptx), ("rx", &a.rx, m.rx, prx)] {
            let lo = (size - RESERVE).saturating_sub(m.hi());
            let hi = (size - RESERVE).saturating_sub(m.lo());
            if s.size != size
                || pending.is_some_and(|p| s.sw_pending != p)
                || s.sw_available < lo
                || s.sw_available > hi
            {
                fail!("{what} of slot {q} {ring}: size {} pending {} available {}; the model says size {size} pending {} available {lo}..={hi}", s.size, s.sw_pending, s.sw_available, pending.map_or("any".into(), |p| p.to_string()));
            }
        }
    }

    /// What a `MEMCPY` between slots `src` and `dst` of file `f` must answer.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn memcpy_plan(&self, f: usize, src: u8, dst: u8, soff: u16, doff: u16, size: u8, how: u8) -> McPlan {
        const SIZES: [u64; 8] = [4096, 1, 65536, 100, 65537, 8192, 3, 12288];
        // `how` 4 and 5: another file's source, a stale destination (ENOENT).
        let src = if how % 6 == 4 { 4 } else { src };
        let dst = if how % 6 == 5 { 5 } else { dst };
        let (sh, dh) = (self.handle(f, src), self.handle(f, dst));
        let sb = sh.and_then(|h| self.files[f].by_handle(h));
        let db = dh.and_then(|h| self.files[f].by_handle(h));
        let ssz = sb.map_or(4096, |b| b.size);
        let dsz = db.map_or(4096, |b| b.size);
        let so = (soff as usize * ssz) >> 16;
        let dof = (doff as usize * dsz) >> 16;
        let n = (SIZES[size as usize % 8] as usize).min(ssz - so).min(dsz - dof);
        let mut a = sys::neuron_udma_memcpy {
            src_handle: sh.unwrap_or(self.stale_handle()),
            src_offset: so as u64,
            dst_handle: dh.unwrap_or(self.stale_handle()),
            dst_offset: dof as u64,
            size: n as u64,
            ..Default::default()
        };
        let mut errs = vec![];
        match how % 6 {
            1 => {
                a.size = 0;
                errs.push(EINVAL);
            }
            2 => {
                a.reserved = 1;
                errs.push(EINVAL);
            }
            3 => {
                a.size = ssz.max(dsz) as u64 + 1;
                errs.push(ERANGE);
            }
            _ => {}
        }
        if sb.is_none() || db.is_none() {
            errs.push(ENOENT);
        }
        if errs.is_empty() && db.is_some_and(|b| !b.writable()) {
            errs.push(EPERM);
        }
        McPlan {
            arg: a,
            ok: errs.is_empty(),
            errs,
            src: sb.map_or((0, 0), |b| b.loc(so)),
            dst: db.map_or((0, 0), |b| b.loc(dof)),
            n,
        }
    }

    /// The model after a successful `MEMCPY` of `p`.
    pub(crate) fn memcpy_apply(&mut self, p: &McPlan) {
        let unknown = racy_read(&self.queues, p.src, p.n) || overlaps(p.src, p.n, p.dst, p.n);
        let data = if unknown { vec![None; p.n] } else { self.mem.get(p.src, p.n) };
        self.mem.set(p.dst, &data);
        touch_write(&mut self.queues, p.dst, p.n);
    }

    fn fork(&mut self, f: usize, how: u8) {
        let fd = self.devs[f].raw();
        let child = part("fork: spawn", || {
            Child::spawn(Some(fd), move || {
                match how {
                    0 => {
                        let mut info = sys::neuron_udma_info::default();
                        ioctl_raw(fd, sys::NEURON_UDMA_INFO, (&mut info as *mut sys::neuron_udma_info).cast())
                            .map_err(|e| format!("INFO: {}", name(e)))?;
                        let mut a = sys::neuron_udma_mem_alloc {
                            size: 4096,
                            type_: sys::NEURON_UDMA_MEM_HOST,
                            ..Default::default()
                        };
                        ioctl_raw(fd, sys::NEURON_UDMA_MEM_ALLOC, (&mut a as *mut sys::neuron_udma_mem_alloc).cast())
                            .map_err(|e| format!("MEM_ALLOC: {}", name(e)))?;
                        let mut fr = sys::neuron_udma_mem_free { handle: a.handle, reserved: 0 };
                        ioctl_raw(fd, sys::NEURON_UDMA_MEM_FREE, (&mut fr as *mut sys::neuron_udma_mem_free).cast())
                            .map_err(|e| format!("MEM_FREE: {}", name(e)))?;
                        // Mappings are not inherited.
                        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
                        if maps.contains("neuron_udma") {
                            return Err("the child inherited a buffer mapping".into());
                        }
                        Ok(())
                    }
                    1 => Ok(()),
                    _ => {
                        // SAFETY: the child's own copy of the descriptor.
                        unsafe { libc::close(fd) };
                        Ok(())
                    }
                }
            })
        });
        match part("fork: join", || child.join(Duration::from_secs(20))) {
            Ok(0) => succeeded(),
            r => fail!("fork (child {}): {r:?}", ["uses the file", "exits", "closes the file"][how as usize % 3]),
        }
    }

    /// Forgets everything file `f` owned (closed, or its device unbound).
    pub(crate) fn forget_file(&mut self, f: usize, gone: Gone) {
        // io_uring commands in flight hold the closed file, and so all its queues (S5).
        let held = gone == Gone::Closed && self.file_has_commands(f);
        let close = self.next_close();
        if held {
            self.closing(f, close);
        }
        for q in 0..QUEUE_SLOTS {
            if self.queues[q].as_ref().is_some_and(|m| m.owner == f) {
                self.end_instance(q, gone, held.then_some(close));
            }
        }
        let old = std::mem::take(&mut self.files[f]);
        for b in old.bufs.iter().flatten().chain(old.extra.iter()) {
            self.stale.push(b.handle);
            if b.own_space() {
                self.mem.remove(b.at.0);
            }
        }
    }

    fn reopen(&mut self, f: usize) {
        for q in 0..QUEUE_SLOTS {
            self.ghost_room(q);
        }
        self.forget_file(f, Gone::Closed);
        let (dev, scratch) = open_file();
        self.devs[f] = dev;
        self.scratch[f] = scratch;
        succeeded();
    }

    pub(crate) fn second(&mut self, join: bool) {
        if join {
            if let Some(c) = self.second.take() {
                match c.join(Duration::from_secs(120)) {
                    Ok(0) => succeeded(),
                    r => fail!("the second process (its own file and queue) failed: {r:?}"),
                }
            }
        } else if self.second.is_none() {
            let path = ctx().path.clone();
            let engine = ctx().engines[3];
            let seed = PATTERN_SEQ.fetch_add(1000, Relaxed) as u32;
            self.second = Some(Child::spawn(None, move || workers::second_process(&path, engine, 2, 8, seed)));
        }
    }

    fn thread(&mut self, q: usize) {
        let path = ctx().path.clone();
        let seed = PATTERN_SEQ.fetch_add(100, Relaxed) as u32;
        let t = std::thread::spawn(move || workers::memcpy_thread(&path, 4, seed));
        CUR_OP.store(OP_WAIT, Relaxed); // the wait's answer counts as a wait's
        self.wait(0, q, 0, 0);
        CUR_OP.store(16, Relaxed);
        match t.join() {
            Ok(Ok(())) => succeeded(),
            r => fail!("a MEMCPY thread with its own file failed: {r:?}"),
        }
    }

    fn fault(&mut self, kind: u8, q: usize, arg: u8) {
        let Some(w) = ctx().window.as_ref() else { return };
        let (engine, queue, e) = slot_queue(q);
        FAULT_COUNTS[kind as usize % 6].fetch_add(1, Relaxed);
        // A new stall or a clear may end an io_uring submission's stall early.
        match kind % 6 {
            2 => self.unstall(q),
            5 => self.unstall(QUEUE_SLOTS),
            _ => {}
        }
        let ok = match kind % 6 {
            0 | 1 => {
                let ok = if kind.is_multiple_of(6) {
                    w.inject(FaultKind::FailNth, engine, queue, 1 + u32::from(arg) % 3)
                } else {
                    w.inject(FaultKind::Abort, engine, queue, 0)
                };
                engines()[e] = EngineM { armed: true, maybe_aborted: true };
                for (i, m) in self.queues.iter_mut().enumerate() {
                    if let Some(m) = m.as_mut().filter(|_| slot_queue(i).2 == e) {
                        m.taint();
                        m.since_fault = false;
                    }
                }
                ok
            }
            2 => w.inject(FaultKind::Stall, engine, queue, 1 + u32::from(arg) % 100),
            3 => w.inject(FaultKind::Slow, 0, 0, 2 + u32::from(arg) % 3),
            4 => w.inject(FaultKind::Slow, 0, 0, 1),
            _ => {
                w.clear();
                engines().iter_mut().for_each(|m| m.armed = false);
                true
            }
        };
        succeeded();
        if !ok {
            fail!("the model rejected fault {kind} on engine {engine} queue {queue}");
        }
    }

    fn bad_ioctl(&mut self, how: u8) {
        let fd = self.devs[0].raw();
        let mut buf = [0u8; 256];
        let p = buf.as_mut_ptr().cast();
        let ioc = |dir: u64, nr: u64, size: u64| ((dir << 30) | (size << 16) | (0xB9 << 8) | nr) as sys::IoctlRequest;
        match how % 8 {
            0 => {
                expect("ioctl 0x0B of 16 bytes", ioctl_raw(fd, ioc(3, 0x0B, 16), p), false, &[ENOTTY]).ok();
            }
            1 => {
                expect("ioctl 0x7F", ioctl_raw(fd, ioc(0, 0x7F, 0), p), false, &[ENOTTY]).ok();
            }
            2 => {
                expect(
                    "INFO to a NULL pointer",
                    ioctl_raw(fd, sys::NEURON_UDMA_INFO, std::ptr::null_mut()),
                    false,
                    &[EFAULT],
                )
                .ok();
            }
            3 => {
                let mut a = sys::neuron_udma_mem_alloc { size: 4096, ..Default::default() };
                expect(
                    "MEM_ALLOC on a read-only file",
                    self.ro.ioctl(sys::NEURON_UDMA_MEM_ALLOC, &mut a),
                    false,
                    &[EBADF],
                )
                .ok();
            }
            4 => {
                let (engine, queue, _) = slot_queue(3);
                let mut a =
                    sys::neuron_udma_queue_init { engine, queue, tx_descs: 32, rx_descs: 32, ..Default::default() };
                expect(
                    "QUEUE_INIT on a read-only file",
                    self.ro.ioctl(sys::NEURON_UDMA_QUEUE_INIT, &mut a),
                    false,
                    &[EBADF],
                )
                .ok();
            }
            5 => {
                let r = self.regions.first().map_or(0, |r| r.addr(0));
                let mut a = sys::neuron_udma_mem_import { addr: r, size: 4096, ..Default::default() };
                expect(
                    "MEM_IMPORT on a read-only file",
                    self.ro.ioctl(sys::NEURON_UDMA_MEM_IMPORT, &mut a),
                    false,
                    &[EBADF],
                )
                .ok();
            }
            6 => {
                let (engine, queue, _) = slot_queue(0);
                let mut a = sys::neuron_udma_copy_submit { engine, queue, ..Default::default() };
                expect(
                    "COPY_SUBMIT on a read-only file",
                    ioctl_ret(self.ro.raw(), crate::dev::abi3::COPY_SUBMIT, &mut a),
                    false,
                    &[EBADF],
                )
                .ok();
            }
            _ => {
                let mut i = sys::neuron_udma_info::default();
                expect("INFO on a read-only file", self.ro.ioctl(sys::NEURON_UDMA_INFO, &mut i), true, &[]).ok();
                if i.abi_version != sys::NEURON_UDMA_ABI_VERSION
                    || i.ring_reserve_descs != RESERVE
                    || u64::from(i.max_queue_fences) != MAX_FENCES
                {
                    fail!("INFO: abi {} reserve {} fences {}", i.abi_version, i.ring_reserve_descs, i.max_queue_fences);
                }
            }
        }
    }

    /// End of a test case: the second process must have succeeded; engines that a fault may
    /// have left aborted must recover with one failing wait at most.
    fn teardown(mut self) {
        CUR_OP.store(OPS as u64, Relaxed); // not an operation of the sequence
        part("close: io_uring", || {
            self.uring_drain();
            self.uring_keep();
        });
        part("close: second process", || self.second(true));
        part("close: files", || drop(self));
        if let Some(w) = ctx().window.as_ref() {
            let dirty = engines().iter().any(|e| e.armed || e.maybe_aborted);
            if dirty {
                w.clear();
                engines().iter_mut().for_each(|m| m.armed = false);
                for q in [0, 2, 3] {
                    if engines()[slot_queue(q).2].maybe_aborted {
                        part("close: heal", || heal(q));
                    }
                }
            }
        }
    }
}

impl Drop for Sut {
    fn drop(&mut self) {
        // A failed case's regions are unmapped with it: the next case maps new ones.
        if !std::thread::panicking() {
            self.keep_regions();
        } else {
            // Its io_uring commands complete before its files go (bounded, nothing checked),
            // so that the queues are free for the next sequence proptest runs while shrinking.
            self.uring_quiesce();
            crate::uring::FAILED_CASE.store(true, Relaxed);
        }
    }
}

/// The entries of one prepare call (`Sut::entries`).
#[derive(Default)]
pub(crate) struct Entries {
    pub(crate) raw: Vec<sys::neuron_udma_copy>,
    pub(crate) pend: Vec<PendingCopy>,
    /// The errors of the first bad entry.
    pub(crate) errs: Option<Vec<Errno>>,
    /// Pairs of all entries.
    pub(crate) total: u32,
    /// Pairs of the largest entry.
    pub(crate) largest: u32,
    /// Pairs of each entry (for messages).
    pub(crate) per: Vec<u32>,
    /// An entry asks for `COPY_SPLIT`.
    pub(crate) split: bool,
}

/// Runs `f`, with a `SIGALRM` arriving after 1..500 us if `signal`.
pub(crate) fn with_alarm<R>(signal: bool, us: u16, f: impl FnOnce() -> R) -> R {
    if !signal {
        return f();
    }
    let t = libc::itimerval {
        it_interval: libc::timeval { tv_sec: 0, tv_usec: 0 },
        it_value: libc::timeval { tv_sec: 0, tv_usec: 1 + libc::suseconds_t::from(us % 500) },
    };
    // SAFETY: arms a one-shot SIGALRM (empty handler, see `init`).
    unsafe { libc::setitimer(libc::ITIMER_REAL, &t, std::ptr::null_mut()) };
    let r = f();
    // SAFETY: disarms the timer.
    let zero: libc::itimerval = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::setitimer(libc::ITIMER_REAL, &zero, std::ptr::null_mut()) };
    r
}

/// Runs copies on queue slot `q` of a new file until one succeeds (at most one may fail:
/// the first wait recovers an aborted engine) and checks its bytes.
fn heal(q: usize) {
    let (engine, queue, e) = slot_queue(q);
    let (dev, (scratch, smap)) = open_file();
    let mut a = sys::neuron_udma_queue_init { engine, queue, tx_descs: 32, rx_descs: 32, ..Default::default() };
    expect("QUEUE_INIT (recovery)", dev.ioctl(sys::NEURON_UDMA_QUEUE_INIT, &mut a), true, &[]).ok();
    let mut b = sys::neuron_udma_mem_alloc { size: 4096, type_: sys::NEURON_UDMA_MEM_HOST, ..Default::default() };
    expect("MEM_ALLOC (recovery)", dev.ioctl(sys::NEURON_UDMA_MEM_ALLOC, &mut b), true, &[]).ok();
    note_handle(b.handle);
    for attempt in 0..2 {
        let data: Vec<u8> = (0..4096).map(|i| pattern(attempt + 77, i)).collect();
        smap.write(0, &data);
        let mut p = sys::neuron_udma_copy_prepare_one {
            engine,
            queue,
            copy: sys::neuron_udma_copy {
                src_handle: scratch,
                dst_handle: b.handle,
                size: 4096,
                barrier: sys::NEURON_UDMA_BARRIER_WRITE,
                ..Default::default()
            },
        };
        expect("COPY_PREPARE_ONE (recovery)", dev.ioctl(sys::NEURON_UDMA_COPY_PREPARE_ONE, &mut p), true, &[]).ok();
        let mut w = sys::neuron_udma_copy_wait { engine, queue, ..Default::default() };
        let r = dev.ioctl(sys::NEURON_UDMA_COPY_WAIT, &mut w);
        let errs: &[Errno] = if attempt == 0 { &[EIO, ETIMEDOUT] } else { &[] };
        if expect(&format!("COPY_WAIT after a fault on engine {engine} (attempt {attempt})"), r, true, errs).is_ok() {
            // Read back through the scratch buffer: copy the destination over it.
            smap.write(0, &[0; 4096]);
            let mut m =
                sys::neuron_udma_memcpy { src_handle: b.handle, dst_handle: scratch, size: 4096, ..Default::default() };
            expect("MEMCPY (recovery)", dev.ioctl(sys::NEURON_UDMA_MEMCPY, &mut m), true, &[]).ok();
            if smap.read()[..4096] != data[..] {
                fail!("engine {engine}: the copy after recovery has wrong bytes");
            }
            engines()[e].maybe_aborted = false;
            return;
        }
    }
}

/// The state machine test: the device and the model side by side.
pub struct FuzzTest;

impl StateMachineTest for FuzzTest {
    type SystemUnderTest = Sut;
    type Reference = FuzzRef;

    fn init_test(_: &()) -> Sut {
        let t = std::time::Instant::now();
        let s = Sut::new();
        spent(OPS, t);
        s
    }

    fn apply(mut state: Sut, _: &(), op: Op) -> Sut {
        let (t, kind) = (std::time::Instant::now(), op.kind());
        let trace = TRACE.load(Relaxed);
        if trace {
            println!("#     {op:?}");
        }
        let before = if trace { state.fence_views() } else { vec![] };
        state.apply(op);
        if trace {
            for v in state.fence_views().into_iter().filter(|v| !before.contains(v)) {
                println!("#       model: {v}");
            }
        }
        spent(kind, t);
        state
    }

    fn teardown(state: Sut, _: ()) {
        let t = std::time::Instant::now();
        state.teardown();
        spent(OPS, t);
    }
}

/// Whether the model's fault window is mapped (fault storms are possible).
pub fn has_window() -> bool {
    ctx().window.is_some()
}
