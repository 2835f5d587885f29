// SPDX-License-Identifier: GPL-2.0

//! debugfs view of a bound device: `neuron_udma/<pci name>/queues` and `.../rings`.
//!
//! - `queues`: per queue in use, the queue-state registers of both directions (hardware.rst §3.8
//!   "queue state get": cfg, status, ring base, length, head, tail, completion head), the software
//!   indices of both rings, the prepared-but-not-doorbelled counts and the engine's state and
//!   error causes.
//! - `rings`: per queue in use, both rings: the last [`HISTORY`] completed slots before the ack
//!   index and every outstanding slot from the ack index to the next index (at most
//!   [`MAX_OUTSTANDING`] per ring), each as its 16 raw bytes and the decoded fields
//!   (hardware.rst §4.1-4.3).
//!
//! Both files are generated at read time. Register values and ring slots are copied under the
//! queue lock inside the BAR guard (an RCU read-side section) into memory allocated before, and
//! formatted afterwards, so nothing allocates or sleeps inside the guard.
//!
//! Lifetime: the files hold a reference to the [`UdmaDevice`], not to its queues. After
//! [`UdmaDevice::shutdown`] the queue list is empty and the files say so; the files themselves
//! go away when the device's [`DeviceDir`] (a `debugfs::Scope`, kept in the driver data) is
//! dropped, and debugfs waits for readers in progress at that point.

use crate::{
    channel::{Channel, Owner, RingSlot as Slot},
    desc,
    device::UdmaDevice,
};
use kernel::{
    debugfs::{Dir, Scope},
    fmt,
    prelude::*,
    sync::Arc, //
};

/// Completed slots shown before the ack index of each ring.
pub(crate) const HISTORY: u32 = 8;
/// Most outstanding slots shown per ring (the rest is summarised in one line).
pub(crate) const MAX_OUTSTANDING: u32 = 256;

/// The module's `neuron_udma` directory: set in the module init before the PCI driver is
/// registered, cleared by [`RootGuard`] after it is unregistered (as nova-core does).
static mut ROOT: Option<Dir> = None;

/// Creates the `neuron_udma` directory, and removes it when dropped.
pub(crate) struct RootGuard;

impl RootGuard {
    /// Creates the `neuron_udma` directory (a directory that cannot be created, with debugfs
    /// disabled or not mounted, is not an error: the files then simply do not exist).
    ///
    /// # Safety
    ///
    /// Called once, in the module init, before the PCI driver is registered; the guard is
    /// dropped after the driver is unregistered.
    pub(crate) unsafe fn create() -> Self {
        // SAFETY: per the function's contract, no probe runs yet, so nothing reads `ROOT`.
        unsafe { ROOT = Some(Dir::new(c"neuron_udma")) };
        Self
    }
}

impl Drop for RootGuard {
    fn drop(&mut self) {
        // SAFETY: per `create`'s contract, the driver is unregistered: no probe can run and
        // every device's scope (which holds a reference to the directory entry) is gone.
        unsafe { ROOT = None };
    }
}

/// The debugfs directory of one device, `neuron_udma/<pci name>/{queues,rings}`, rendered
/// from the device at read time. Dropping it removes the files, waiting for readers in
/// progress.
pub(crate) type DeviceDir = Scope<Arc<UdmaDevice>>;

/// Creates the debugfs directory `name` of `dev`.
pub(crate) fn device_dir<'a>(dev: Arc<UdmaDevice>, name: &'a CStr) -> impl PinInit<DeviceDir> + 'a {
    #[allow(static_mut_refs)]
    // SAFETY: `ROOT` is set before the driver is registered and cleared after it is
    // unregistered, so no probe (the only caller) races with its changes.
    let root: &'static Option<Dir> = unsafe { &ROOT };
    // PANIC: `ROOT` is `Some` whenever a probe can run (see `RootGuard`).
    let root = root
        .as_ref()
        .expect("neuron_udma debugfs root is set before probe");
    root.scope(dev, name, |dev, dir| {
        dir.read_callback_file(c"queues", dev, &queues_show);
        dir.read_callback_file(c"rings", dev, &rings_show);
    })
}

fn queues_show(dev: &Arc<UdmaDevice>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    render_queues(dev, f)
}

fn rings_show(dev: &Arc<UdmaDevice>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    render_rings(dev, f)
}

/// The queues in use, or `None` after a message explaining why there are none.
fn queues_or_note(
    dev: &UdmaDevice,
    w: &mut impl fmt::Write,
) -> Result<Option<KVec<Arc<Channel>>>, fmt::Error> {
    match dev.queues() {
        // The driver's H2T queue exists from probe to unbind: no queue at all means the device
        // was shut down.
        Ok(q) if q.is_empty() => {
            writeln!(w, "unbound")?;
            Ok(None)
        }
        Ok(q) => Ok(Some(q)),
        Err(e) => {
            writeln!(w, "error {e:?}")?;
            Ok(None)
        }
    }
}

fn write_header(cell: &Channel, w: &mut impl fmt::Write) -> fmt::Result {
    write!(
        w,
        "engine {} queue {} owner ",
        cell.id.eng.get(),
        cell.id.q.number()
    )?;
    match cell.owner {
        Owner::Driver => write!(w, "driver"),
        Owner::File(id) => write!(w, "file {id}"),
    }?;
    writeln!(w, " instance {}", cell.instance)
}

/// Writes the reason a queue could not be read; `ECANCELED` (`ENODEV` at unbind): it was
/// released meanwhile.
fn write_unreadable(e: Error, w: &mut impl fmt::Write) -> fmt::Result {
    if e == ECANCELED || e == ENODEV {
        writeln!(w, "  released")
    } else {
        writeln!(w, "  error {e:?}")
    }
}

/// Splits a head/tail/completion-head register into index (23:0) and ring id (31:30).
fn ptr(v: u32) -> (u32, u32) {
    crate::regs::Q_DRHP::position(v)
}

/// Renders the `queues` file: per queue in use, the hardware.rst §3.8 queue state of both
/// directions, the software ring indices and the engine state and error causes.
pub(crate) fn render_queues(dev: &UdmaDevice, w: &mut impl fmt::Write) -> fmt::Result {
    render_each(dev, w, render_queue_state)?;
    let (running, members) = dev.completer_state();
    writeln!(
        w,
        "completion engine: {}, {members} members",
        if running { "running" } else { "idle" }
    )
}

/// Renders `one` for every queue in use, or says why there is none.
fn render_each<W: fmt::Write>(
    dev: &UdmaDevice,
    w: &mut W,
    one: fn(&Channel, &mut W) -> fmt::Result,
) -> fmt::Result {
    let Some(queues) = queues_or_note(dev, w)? else {
        return Ok(());
    };
    for cell in queues.iter() {
        one(cell, w)?;
    }
    Ok(())
}

/// Renders the `queues` block of one queue.
pub(crate) fn render_queue_state(cell: &Channel, w: &mut impl fmt::Write) -> fmt::Result {
    write_header(cell, w)?;
    let s = match cell.snapshot() {
        Ok(s) => s,
        Err(e) => return write_unreadable(e, w),
    };
    for (name, r) in [("m2s", &s.regs[0]), ("s2m", &s.regs[1])] {
        let (head, head_id) = ptr(r.head);
        let (tail, tail_id) = ptr(r.tail);
        let (comp, comp_id) = ptr(r.comp_head);
        writeln!(
            w,
            "  {name}: cfg {:#010x} status {:#010x} base {:#018x} len {} head {head} id {head_id} \
             tail {tail} id {tail_id} comp_head {comp} id {comp_id}",
            r.cfg, r.status, r.base, r.len
        )?;
    }
    for (name, r, pending) in [("tx", &s.sw[0], s.pending.0), ("rx", &s.sw[1], s.pending.1)] {
        writeln!(
            w,
            "  sw {name}: size {} next {} ack {} ring_id {} available {} outstanding {} pending {}",
            r.size().descs(),
            r.next_index(),
            r.ack_index(),
            r.ring_id().bits().get(),
            r.available(),
            r.outstanding(),
            pending
        )?;
    }
    let e = &s.errors;
    writeln!(
        w,
        "  engine: m2s state {:#010x} cause {:#010x} s2m state {:#010x} cause {:#010x}{} resets {}",
        e.m2s.state,
        e.m2s.cause,
        e.s2m.state,
        e.s2m.cause,
        if e.aborted() { " ABORTED" } else { "" },
        s.resets
    )?;
    let l = cell.listeners();
    writeln!(
        w,
        "  listeners: uring {} polled {} eventfd {} settled {} signalled {} woken {} watches {}",
        l.uring,
        u8::from(l.polled),
        u8::from(l.eventfd),
        cell.settled_fences(),
        l.signalled,
        l.woken,
        l.watches
    )
}

/// Slots one ring contributes at most.
const SLOTS_PER_RING: usize = (HISTORY + MAX_OUTSTANDING) as usize;

/// Name of ring `dir` in the files.
fn ring_name(dir: desc::Dir) -> &'static str {
    match dir {
        desc::Dir::Tx => "tx",
        desc::Dir::Rx => "rx",
    }
}

/// Writes one slot: `tx[idx]` / `rx[idx]`, the 16 bytes as they lie in memory, then the
/// decoded fields ([`desc::Decoded`]).
fn write_slot(s: &Slot, w: &mut impl fmt::Write) -> fmt::Result {
    write!(w, "  {}[{}]", ring_name(s.dir), s.idx)?;
    for x in s.desc.to_bytes() {
        write!(w, " {x:02x}")?;
    }
    writeln!(
        w,
        "  {} {}",
        s.desc.decode(s.dir),
        if s.done { "done" } else { "outstanding" }
    )
}

/// Renders the `rings` file: both rings of every queue in use.
pub(crate) fn render_rings(dev: &UdmaDevice, w: &mut impl fmt::Write) -> fmt::Result {
    render_each(dev, w, render_queue_rings)
}

/// Renders the `rings` block of one queue: per ring a summary line, then the last [`HISTORY`]
/// completed slots (never-written, all-zero slots skipped) and the outstanding ones.
pub(crate) fn render_queue_rings(cell: &Channel, w: &mut impl fmt::Write) -> fmt::Result {
    write_header(cell, w)?;
    let mut slots = match KVec::with_capacity(2 * SLOTS_PER_RING, GFP_KERNEL) {
        Ok(v) => v,
        Err(_) => return writeln!(w, "  error {:?}", ENOMEM),
    };
    // Copied under the queue lock into `slots`, which never grows.
    let states = (|| {
        Ok::<_, Error>([
            cell.ring_slots(desc::Dir::Tx, HISTORY, MAX_OUTSTANDING, &mut slots)?,
            cell.ring_slots(desc::Dir::Rx, HISTORY, MAX_OUTSTANDING, &mut slots)?,
        ])
    })();
    let states = match states {
        Ok(s) => s,
        Err(e) => return write_unreadable(e, w),
    };
    for (dir, st) in [(desc::Dir::Tx, &states[0]), (desc::Dir::Rx, &states[1])] {
        let outstanding = st.outstanding();
        writeln!(
            w,
            " {}: size {} next {} ack {} ring_id {} outstanding {}",
            ring_name(dir),
            st.size().descs(),
            st.next_index(),
            st.ack_index(),
            st.ring_id().bits().get(),
            outstanding
        )?;
        for s in slots.iter().filter(|s| s.dir == dir) {
            if s.done && s.desc == desc::Desc::default() {
                continue;
            }
            write_slot(s, w)?;
        }
        if outstanding > MAX_OUTSTANDING {
            writeln!(
                w,
                "  ... {} more outstanding",
                outstanding - MAX_OUTSTANDING
            )?;
        }
    }
    Ok(())
}

#[cfg(neuron_udma_kunit)]
#[kunit_tests(neuron_udma_debugfs)]
mod tests {
    use super::*;
    use crate::{
        channel::DEFAULT_TIMEOUT,
        desc::DescLen,
        queue::Copy,
        Registry, //
    };
    use core::fmt::Write;

    /// Text sink for the renderers (process context: it allocates).
    struct Text(KVec<u8>);

    impl fmt::Write for Text {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0
                .extend_from_slice(s.as_bytes(), GFP_KERNEL)
                .map_err(|_| fmt::Error)
        }
    }

    impl Text {
        fn new() -> Self {
            Self(KVec::new())
        }

        fn as_str(&self) -> &str {
            core::str::from_utf8(&self.0).unwrap_or("")
        }

        /// The line that starts (after indentation) with `prefix`, or "".
        fn line(&self, prefix: &str) -> &str {
            self.as_str()
                .lines()
                .map(str::trim_start)
                .find(|l| l.starts_with(prefix))
                .unwrap_or("")
        }
    }

    /// The 8 bytes of `v` in ring-memory (little-endian) order, as the dump prints them.
    fn le_hex(v: u64) -> Result<Text> {
        let mut t = Text::new();
        for (i, x) in v.to_le_bytes().iter().enumerate() {
            write!(t, "{}{x:02x}", if i == 0 { "" } else { " " }).map_err(|_| ENOMEM)?;
        }
        Ok(t)
    }

    #[test]
    fn ring_dump_after_one_4k_host_to_hbm_copy() -> Result {
        let dev = Registry::first().ok_or(ENODEV)?;
        assert!(dev.dram_size >= 4 << 20);
        let q = dev.queue_init_at(dev.arch.h2t[0].0, 4, 64, 64, Owner::Driver)?;
        let src_buf = dev.alloc_coherent(4096)?;
        let src = dev.arch.host_addr(src_buf.dma_address());
        let dst = 0x30_0000u64;
        let copy = Copy {
            src,
            dst,
            len: DescLen::new(4096)?,
            barrier: dev.arch.final_barrier,
        };
        let r = (|| -> Result<(Text, Text)> {
            let seq = q.with(|queue, io| {
                queue.prepare_one(&copy)?;
                queue.fence(io)
            })?;
            q.wait_fence(seq, DEFAULT_TIMEOUT)?;
            let (mut rings, mut state) = (Text::new(), Text::new());
            render_queue_rings(&q, &mut rings).map_err(|_| ENOMEM)?;
            render_queue_state(&q, &mut state).map_err(|_| ENOMEM)?;
            Ok((rings, state))
        })();
        dev.queue_release(q.owner, q.id)?;
        let (rings, state) = r?;

        // Appendix A: TX slot 0 = 00 10 00 0D 03 00 08 05 <src LE>: len 0x1000, ring id 1,
        // FIRST | LAST, meta_ctrl 0x0508_0003 (write barrier on the last data pair, v2/v3).
        let tx0 = rings.line("tx[0] ");
        assert!(tx0.starts_with("tx[0] 00 10 00 0d 03 00 08 05 "));
        assert!(tx0.contains(le_hex(src)?.as_str()));
        assert!(tx0.contains("len=4096 ring_id=1 first last wb meta_ctrl=0x05080003"));
        assert!(tx0.ends_with(" done"));
        // RX slot 0: len_ctrl 0x0100_1000, word 1 zero, the HBM destination.
        let rx0 = rings.line("rx[0] ");
        assert!(rx0.starts_with("rx[0] 00 10 00 01 00 00 00 00 "));
        assert!(rx0.contains(le_hex(dst)?.as_str()));
        assert!(rx0.contains("len=4096 ring_id=1 addr=0x0000000000300000 done"));
        // Slot 1: the completion marker pair, 4 bytes, DMB (len_ctrl bit 30, queue.rs
        // `MARKER_BARRIER`).
        assert!(rings
            .line("tx[1] ")
            .starts_with("tx[1] 04 00 00 4d 03 00 08 01 "));
        assert!(rings
            .line("rx[1] ")
            .starts_with("rx[1] 04 00 00 01 00 00 00 00 "));
        // Both pairs acked: nothing outstanding; slots never written are not shown.
        assert!(rings
            .line("tx: ")
            .starts_with("tx: size 64 next 2 ack 2 ring_id 1 outstanding 0"));
        assert!(rings.line("tx[2] ").is_empty());

        // Queue state: the engine consumed both pairs on both directions.
        assert!(state
            .line("sw tx: ")
            .starts_with("sw tx: size 64 next 2 ack 2 ring_id 1"));
        assert!(state.line("m2s: ").contains(" len 64 "));
        assert!(state.line("m2s: ").contains(" tail 2 id 1 "));
        assert!(state.line("s2m: ").contains(" tail 2 id 1 "));

        // A released queue renders as such.
        let mut gone = Text::new();
        render_queue_rings(&q, &mut gone).map_err(|_| ENOMEM)?;
        assert!(gone.line("released") == "released");
        Ok(())
    }

    /// The contents of `neuron_udma/<pci name>/<name>` as user space reads them: the debugfs
    /// file opened through the VFS (from a private kernel mount of debugfs: the test thread's
    /// root need not see user space's `/sys/kernel/debug`) and read through its seq_file.
    fn read_debugfs_file(dev: &UdmaDevice, name: &str) -> Result<Text> {
        use kernel::bindings;
        let mut path = Text::new();
        write!(
            path,
            "neuron_udma/{}/{name}\0",
            dev.pdev.as_ref().name().to_str().map_err(|_| EINVAL)?
        )
        .map_err(|_| ENOMEM)?;
        // SAFETY: the argument is a NUL-terminated string.
        let fs = unsafe { bindings::get_fs_type(c"debugfs".as_char_ptr()) };
        if fs.is_null() {
            return Err(ENODEV);
        }
        // SAFETY: `fs` is a registered file system type (debugfs is built in, so the reference
        // `get_fs_type()` took is on no module and needs no put); the name is NUL-terminated.
        let mnt = kernel::error::from_err_ptr(unsafe {
            bindings::vfs_kern_mount(fs, 0, c"debugfs".as_char_ptr(), core::ptr::null_mut())
        })?;
        // SAFETY: `mnt` is a live mount (returned above, put only at the end).
        let dentry = unsafe { (*mnt).mnt_root };
        let root = bindings::path { mnt, dentry };
        // SAFETY: `root` is a valid path of a live mount; `path` is NUL-terminated.
        let file = kernel::error::from_err_ptr(unsafe {
            bindings::file_open_root(&root, path.0.as_ptr().cast(), bindings::O_RDONLY as i32, 0)
        });
        let r = file.and_then(|file| {
            // `kernel_read()` needs `read_iter`, which the debugfs proxy does not offer: read
            // the way its `seq_read()` does, with `seq_read_iter()` into a kernel buffer (the
            // device stays bound for the whole test, so the proxy's removal guard is not needed).
            let mut out = Text::new();
            let mut iocb = bindings::kiocb {
                ki_filp: file,
                ..Default::default()
            };
            let mut chunk = [0u8; 512];
            let r = loop {
                let kv = bindings::kvec {
                    iov_base: chunk.as_mut_ptr().cast(),
                    iov_len: chunk.len(),
                };
                let mut iter = core::mem::MaybeUninit::<bindings::iov_iter>::uninit();
                // SAFETY: `iov_iter_kvec()` initialises the whole iterator over `kv`, which
                // describes `chunk` (writable for its length) and outlives the read below.
                unsafe {
                    bindings::iov_iter_kvec(
                        iter.as_mut_ptr(),
                        bindings::ITER_DEST,
                        &kv,
                        1,
                        chunk.len(),
                    )
                };
                // SAFETY: `iocb` refers to the open seq_file `file` (closed only below) and
                // `iter` was initialised above.
                let n = unsafe { bindings::seq_read_iter(&mut iocb, iter.as_mut_ptr()) };
                match usize::try_from(n) {
                    Ok(0) => break Ok(()),
                    Ok(n) => {
                        if let Err(e) = out.0.extend_from_slice(&chunk[..n], GFP_KERNEL) {
                            break Err(e.into());
                        }
                    }
                    // CAST: a negative return is a negative errno.
                    Err(_) => break Err(Error::from_errno(n as i32)),
                }
            };
            // SAFETY: `file` was opened above and is not used after this call.
            unsafe { bindings::filp_close(file, core::ptr::null_mut()) };
            r.map(|()| out)
        });
        // SAFETY: the reference `vfs_kern_mount()` returned; nothing uses `mnt` afterwards.
        unsafe { bindings::mntput(mnt) };
        r
    }

    #[test]
    fn files_list_the_driver_queue() -> Result {
        let dev = Registry::first().ok_or(ENODEV)?;
        let (eng, qid) = dev.arch.h2t[0];
        let read = |name| {
            read_debugfs_file(&dev, name).inspect_err(|e| {
                pr_err!("reading neuron_udma/<device>/{name} through the VFS: {e:?}\n")
            })
        };
        let queues = read("queues")?;
        let rings = read("rings")?;
        let mut header = Text::new();
        let instance = dev.h2t()?.channel().instance;
        write!(
            header,
            "engine {eng} queue {qid} owner driver instance {instance}"
        )
        .map_err(|_| ENOMEM)?;
        assert!(queues.line(header.as_str()) == header.as_str());
        assert!(rings.line(header.as_str()) == header.as_str());
        assert!(queues.line("sw tx: ").starts_with("sw tx: size 8192 "));
        assert!(queues.line("m2s: ").contains(" len 8192 "));
        assert!(rings.line("tx: ").starts_with("tx: size 8192 "));
        assert!(rings.line("rx: ").starts_with("rx: size 8192 "));
        Ok(())
    }
}
