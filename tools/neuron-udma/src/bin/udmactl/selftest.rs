// SPDX-License-Identifier: MIT OR Apache-2.0
//! `udmactl selftest`: every wrapper of the neuron_udma client crate against a real device, with
//! the results as TAP (one test point per group), for the guest test plan of `make check`.
//!
//! The checks use queues 1..=3 of the first engine that reaches host memory and has them free
//! (`Info::user_engine`: 0 on V2, 4 on V3) and the driver's MEMCPY queue; they need nothing
//! else (no fault injection: tests/kselftest covers ETIMEDOUT/EIO).

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use neuron_udma::{ring_id, ring_index, timeout_ms, Barrier, Buffer, Copy, Device, Error, Generation, Info};

/// Engine of the test queues, chosen from `INFO` by [`run`].
static ENG: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

fn eng() -> u32 {
    *ENG.get().unwrap_or(&0)
}

/// Fails unless `r` is an error whose errno is `errno`.
fn expect_errno<T: std::fmt::Debug>(r: neuron_udma::Result<T>, errno: i32, what: &str) -> Result<()> {
    match r {
        Err(e) if e.errno() == errno => Ok(()),
        Err(e) => bail!("{what}: got {e} (errno {}), want errno {errno}", e.errno()),
        Ok(v) => bail!("{what}: succeeded ({v:?}), want errno {errno}"),
    }
}

/// Deterministic bytes, different per seed.
fn pattern(buf: &mut [u8], seed: u8) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37).wrapping_add(seed) ^ (i >> 9) as u8;
    }
}

fn info(dev: &Device, i: &Info) -> Result<()> {
    ensure!(i.abi_version == neuron_udma::sys::NEURON_UDMA_ABI_VERSION, "abi_version {}", i.abi_version);
    ensure!(i.vendor_id == 0x1d0f, "vendor {:#x}", i.vendor_id);
    let want = match i.device_id {
        0x7164 | 0x7264 => Generation::V2,
        0x7364 => Generation::V3,
        d => bail!("unknown device id {d:#x}"),
    };
    ensure!(i.gen() == want, "generation {:?} for device {:#x}", i.gen(), i.device_id);
    // What the rest of the selftest relies on: queues 1..=3 and a user engine.
    ensure!(i.max_copy_size > 0 && i.queues_per_engine > 3 && i.engines >= 4, "limits {i:?}");
    ensure!(i.min_ring_descs.is_power_of_two() && i.min_ring_descs <= i.max_ring_descs, "ring limits {i:?}");
    ensure!(i.ring_reserve_descs < i.min_ring_descs && i.max_batch > 0, "ring reserve, batch {i:?}");
    ensure!(dev.info()? == *i && dev.limits()? == i, "a second INFO, or the cached one, differs");
    ensure!(!i.h2t_queues().is_empty(), "no H2T queues for {:?}", i.gen());
    let (e, q) = i.h2t_queues()[0];
    ensure!(i.is_reserved_queue(e, q) && !i.is_reserved_queue(eng(), 1), "is_reserved_queue");
    ensure!(i.pairs_per_round(64) == 64 - i.ring_reserve_descs - 1, "pairs_per_round(64)");
    ensure!(ring_index(0xC000_0005) == 5 && ring_id(0xC000_0005) == 3, "ring_index/ring_id");
    ensure!(timeout_ms(None) == 0 && timeout_ms(Some(Duration::from_micros(1))) == 1, "timeout_ms");
    Ok(())
}

fn open_errors(dev: &Device, _: &Info) -> Result<()> {
    let other = Device::open(dev.path())?;
    ensure!(other.path() == dev.path(), "path");
    match Device::open("/dev/neuron_udma_does_not_exist") {
        Err(Error::Open { .. }) => {}
        r => bail!("open of a missing device: {r:?}"),
    }
    // Every documented errno maps to its variant and back.
    for errno in [
        libc::EINVAL,
        libc::ENOENT,
        libc::ERANGE,
        libc::ENOSPC,
        libc::EBUSY,
        libc::ETIMEDOUT,
        libc::EIO,
        libc::ENODEV,
        libc::EFAULT,
        libc::ENOTTY,
        libc::EINTR,
        libc::ENOMEM,
        libc::EPERM,
        libc::EXDEV,
        libc::EOPNOTSUPP,
        libc::ESTALE,
        libc::EMFILE,
        libc::EBADF,
        libc::E2BIG,
    ] {
        ensure!(Error::from_errno(errno).errno() == errno, "errno {errno} round trip");
    }
    Ok(())
}

fn buffers(dev: &Device, _: &Info) -> Result<()> {
    let mut h = dev.alloc_host(5000)?;
    ensure!(h.handle() != 0 && h.size() == 5000 && h.len() >= 5000, "host buffer {h:?}");
    h.as_mut_slice()[..5000].fill(0x5a);
    ensure!(h.as_slice()[..5000].iter().all(|&b| b == 0x5a), "host bytes");
    let d = dev.alloc_device(1 << 20)?;
    ensure!(d.handle() != 0 && d.handle() != h.handle() && d.size() == 1 << 20, "device buffer");
    let (hh, dh) = (h.handle(), d.handle());
    h.free()?;
    d.free()?;
    // A freed handle is unknown: MEM_FREE through the raw ioctl says ENOENT.
    for handle in [hh, dh] {
        let mut f = neuron_udma::sys::neuron_udma_mem_free { handle, ..Default::default() };
        // SAFETY: MEM_FREE takes a struct neuron_udma_mem_free, which `f` is.
        expect_errno(
            unsafe { dev.raw_ioctl(neuron_udma::sys::NEURON_UDMA_MEM_FREE, &mut f) },
            libc::ENOENT,
            "free twice",
        )?;
    }
    expect_errno(dev.alloc_host(0), libc::EINVAL, "alloc_host(0)")?;
    expect_errno(dev.alloc_device(0), libc::EINVAL, "alloc_device(0)")?;
    // Dropping frees: the next allocation works and gets a new handle.
    let again = dev.alloc_host(4096)?;
    ensure!(again.handle() != hh, "handle reused");
    Ok(())
}

fn queues(dev: &Device, i: &Info) -> Result<()> {
    let q = dev.queue(eng(), 1, 64)?;
    ensure!(q.engine() == eng() && q.queue() == 1 && q.ring_descs() == (64, 64), "queue accessors");
    ensure!(std::ptr::eq(q.device(), dev), "queue device");
    let st = q.state()?;
    ensure!(st.engine == eng() && st.queue == 1 && st.tx.size == 64 && st.rx.size == 64, "state {st:?}");
    ensure!(st.tx.sw_available == 64 - i.ring_reserve_descs && st.tx.sw_pending == 0, "state {st:?}");
    expect_errno(dev.queue(eng(), 1, 64), libc::EBUSY, "the same queue twice")?;
    let (e, hq) = i.h2t_queues()[0];
    expect_errno(dev.queue(e, hq, 64), libc::EBUSY, "the driver's H2T queue")?;
    expect_errno(dev.queue(eng(), 2, 48), libc::EINVAL, "ring of 48")?;
    expect_errno(dev.queue(eng(), i.queues_per_engine, 64), libc::EINVAL, "queue queues_per_engine")?;
    expect_errno(dev.queue(i.engines, 1, 64), libc::EINVAL, "engine out of range")?;
    let q2 = dev.queue_with_rings(eng(), 2, 32, 128)?;
    ensure!(q2.ring_descs() == (32, 128) && q2.state()?.rx.size == 128, "queue_with_rings");
    q.release()?;
    drop(q2); // released on drop
    let q = dev.queue(eng(), 1, 32)?;
    let q2 = dev.queue(eng(), 2, 32)?;
    q.release()?;
    q2.release()?;
    Ok(())
}

fn copies(dev: &Device, i: &Info) -> Result<()> {
    let q = dev.queue(eng(), 1, 256)?;
    // 16 copies of the largest size fill the buffers.
    let max = i.max_copy_size;
    let (m, size) = (u64::from(max), 16 * u64::from(max));
    let mut a = dev.alloc_host(size)?;
    let mut b = dev.alloc_host(size)?;
    let d = dev.alloc_device(size)?;
    pattern(&mut a, 1);
    b.fill(0);
    // prepare_one + wait: one pair and the marker.
    q.prepare_one(&Copy::new(&a, 3, &b, 5, 4000)?)?;
    let n = q.wait(Some(Duration::from_secs(10)))?;
    ensure!(n == 2, "wait freed {n} pairs, want 2");
    ensure!(b[5..4005] == a[3..4003] && b[4] == 0 && b[4005] == 0, "prepare_one bytes");
    // A batch host -> HBM, then HBM -> host, with barriers (and before ABI 3 the interrupt flag,
    // which ABI 3 reserves: fences_and_events checks its EINVAL).
    let up: Vec<Copy> = (0..16u64).map(|k| Copy::new(&a, k * m, &d, k * m, max)).collect::<neuron_udma::Result<_>>()?;
    q.prepare(&up)?;
    q.wait(None)?;
    let down: Vec<Copy> = (0..16u64)
        .map(|k| {
            Copy::new(&d, k * m, &b, k * m, max).map(|c| {
                c.barrier(if k == 15 { Barrier::Write } else { Barrier::Dmb }).dst_interrupt(k == 0 && !i.has_abi3())
            })
        })
        .collect::<neuron_udma::Result<_>>()?;
    ensure!(down[0].dst_interrupt(true).raw().flags == neuron_udma::sys::NEURON_UDMA_COPY_DST_INT, "dst_interrupt");
    ensure!(down[15].raw().barrier == neuron_udma::sys::NEURON_UDMA_BARRIER_WRITE, "barrier");
    ensure!(down[3].size() == max && down[3].dst_interrupt(false).raw().flags == 0, "copy accessors");
    q.prepare(&down)?;
    let n = q.wait(None)?;
    ensure!(n == 17, "batch wait freed {n} pairs, want 17");
    ensure!(b[..] == a[..], "16 x max_copy_size through HBM differs");
    // start: part of what is prepared, then wait for the rest.
    b.fill(0);
    for i in 0..4u64 {
        q.prepare_one(&Copy::new(&a, i * 100, &b, i * 100, 100)?)?;
    }
    q.start(2, 2)?;
    let st = q.state()?;
    ensure!(st.tx.sw_pending == 2 && st.rx.sw_pending == 2, "pending after start(2, 2): {st:?}");
    expect_errno(q.start(3, 3), libc::EINVAL, "start beyond the prepared")?;
    ensure!(q.wait(None)? == 5, "wait after start");
    ensure!(b[..400] == a[..400], "start bytes");
    Ok(())
}

/// A pipeline over queues 1 and 2: 3 MiB through HBM and back in small batches (so that each
/// queue has several batches and the two overlap), byte-exact; then its argument errors.
fn pipeline(dev: &Device, i: &Info) -> Result<()> {
    let (q1, q2) = (dev.queue(eng(), 1, 64)?, dev.queue(eng(), 2, 64)?);
    let max = i.max_copy_size;
    let size = 48 * u64::from(max);
    let mut a = dev.alloc_host(size)?;
    let mut b = dev.alloc_host(size)?;
    let d = dev.alloc_device(size)?;
    pattern(&mut a, 7);
    b.fill(0);
    let mut p = neuron_udma::Pipeline::new(&q1, &q2, None)?;
    let per = p.batch_len()?.min(8) as u64;
    ensure!(per > 0, "pipeline batch length 0");
    for (src, dst) in [(&a as &dyn neuron_udma::Buffer, &d as &dyn neuron_udma::Buffer), (&d, &b)] {
        let mut k = 0u64;
        while k < 48 {
            let n = per.min(48 - k);
            let batch: Vec<Copy> = (k..k + n)
                .map(|j| Copy::new(src, j * u64::from(max), dst, j * u64::from(max), max))
                .collect::<neuron_udma::Result<_>>()?;
            p.submit(&batch)?;
            k += n;
        }
        // The HBM -> host pass may only start once host -> HBM is complete.
        p.finish()?;
    }
    ensure!(b[..] == a[..], "pipelined 48 x max_copy_size through HBM differs");
    ensure!(neuron_udma::Pipeline::new(&q1, &q1, None).is_err(), "a pipeline over one queue");
    Ok(())
}

/// MEM_IMPORT through the library: an unaligned read-only import to HBM with a split queue copy
/// (started with the pair count `prepare_one` returned), back into a writable import with
/// MEMCPY, a pipelined pass from a bigger import, and EPERM for a read-only destination.
fn imports(dev: &Device, i: &Info) -> Result<()> {
    ensure!(i.max_import_size == 1 << 30, "max_import_size {} (want 1 GiB)", i.max_import_size);
    let split = neuron_udma::sys::NEURON_UDMA_COPY_SPLIT;
    let len = 3 * 4096 + 5;
    let mut data = vec![0u8; len + 1];
    pattern(&mut data, 11);
    let mut out = vec![0xEEu8; len + 2];
    let d = dev.alloc_device(1 << 20)?;
    let h = dev.alloc_host(1 << 20)?;
    let q = dev.queue(eng(), 1, 64)?;
    let src = dev.import(&data[1..])?;
    ensure!(src.size() == len as u64 && src.segments() >= 1, "import {src:?}");
    ensure!(src.import_layout().is_some_and(|l| l.addr == data[1..].as_ptr() as u64), "import layout");
    expect_errno(dev.memcpy(&h, 0, &src, 0, 16, None), libc::EPERM, "MEMCPY into a read-only import")?;
    expect_errno(q.prepare_one(&Copy::new(&h, 0, &src, 0, 16)?), libc::EPERM, "copy into a read-only import")?;
    let c = Copy::new(&src, 0, &d, 0, len as u32)?;
    ensure!(c.raw().flags & split != 0, "a copy from an import has COPY_SPLIT");
    let pairs = q.prepare_one(&c)?;
    let most = Copy::max_pairs(&src, 0, &d, 0, len as u32);
    ensure!((1..=most).contains(&pairs), "{pairs} pairs for a copy of at most {most}");
    q.start(pairs, pairs)?;
    let completed = q.wait(None)?;
    ensure!(completed == u64::from(pairs) + 1, "COPY_WAIT freed {completed} pairs, want {pairs} + marker");
    let dst = dev.import_mut(&mut out[1..=len])?;
    dev.memcpy(&d, 0, &dst, 0, len as u64, None)?;
    dst.try_free().map_err(|(_, e)| e).context("MEM_FREE of the writable import")?;
    src.free()?;
    ensure!(out[1..=len] == data[1..], "import -> HBM -> import differs");
    ensure!(out[0] == 0xEE && out[len + 1] == 0xEE, "a copy into the import wrote outside it");
    drop(q);

    // 1 MiB from an import through two queues (Pipeline starts the pairs prepare returned).
    let (q1, q2) = (dev.queue(eng(), 1, 256)?, dev.queue(eng(), 2, 256)?);
    let max = u64::from(i.max_copy_size);
    let mut big = vec![0u8; 1 << 20];
    pattern(&mut big, 12);
    let src = dev.import(&big)?;
    let mut p = neuron_udma::Pipeline::new(&q1, &q2, None)?;
    let budget = p.batch_len()?;
    let mut batch = Vec::new();
    let (mut off, mut pairs) = (0u64, 0usize);
    while off < 1 << 20 {
        let need = Copy::max_pairs(&src, off, &d, off, max as u32) as usize;
        if pairs + need > budget {
            p.submit(&batch)?;
            batch.clear();
            pairs = 0;
        }
        batch.push(Copy::new(&src, off, &d, off, max as u32)?);
        pairs += need;
        off += max;
    }
    p.submit(&batch)?;
    p.finish()?;
    src.free()?;
    let mut back = dev.alloc_host(1 << 20)?;
    back.fill(0);
    dev.memcpy(&d, 0, &back, 0, 1 << 20, None)?;
    ensure!(back[..] == big[..], "pipelined copies from an import differ");
    Ok(())
}

fn copy_errors(dev: &Device, i: &Info) -> Result<()> {
    let ring = i.min_ring_descs;
    let q = dev.queue(eng(), 3, ring)?;
    let a = dev.alloc_host(8192)?;
    let b = dev.alloc_host(8192)?;
    expect_errno(Copy::new(&a, 0, &b, 0, 0), libc::EINVAL, "size 0")?;
    let big = dev.alloc_host(u64::from(i.max_copy_size) + 1)?;
    let over = Copy::new(&big, 0, &big, 0, i.max_copy_size + 1)?;
    expect_errno(q.prepare_one(&over), libc::EINVAL, "size max_copy_size + 1 (library)")?;
    expect_errno(q.prepare(&[over]), libc::EINVAL, "size max_copy_size + 1 in a batch (library)")?;
    let mut one = neuron_udma::sys::neuron_udma_copy_prepare_one { engine: eng(), queue: 3, copy: *over.raw() };
    // SAFETY: COPY_PREPARE_ONE takes a struct neuron_udma_copy_prepare_one, which `one` is.
    expect_errno(
        unsafe { dev.raw_ioctl(neuron_udma::sys::NEURON_UDMA_COPY_PREPARE_ONE, &mut one) },
        libc::EINVAL,
        "size max_copy_size + 1 (kernel)",
    )?;
    drop(big);
    expect_errno(Copy::new(&a, 8000, &b, 0, 200), libc::EINVAL, "source range (library)")?;
    // The kernel's own checks, past the library's: ERANGE, ENOENT, EINVAL.
    let mut raw = *Copy::new(&a, 0, &b, 0, 100)?.raw();
    raw.src_offset = 8100;
    expect_errno(q.prepare_one(&Copy::from_raw(raw)), libc::ERANGE, "source range (kernel)")?;
    raw.src_offset = 0;
    raw.dst_handle = 0xdead_0000_beef;
    expect_errno(q.prepare_one(&Copy::from_raw(raw)), libc::ENOENT, "unknown handle")?;
    raw.dst_handle = b.handle();
    raw.barrier = 7;
    expect_errno(q.prepare_one(&Copy::from_raw(raw)), libc::EINVAL, "bad barrier")?;
    expect_errno(q.prepare(&[]), libc::EINVAL, "empty batch")?;
    let st = q.state()?;
    ensure!(st.tx.sw_next == st.tx.sw_ack && st.tx.sw_pending == 0, "a refused copy changed the ring: {st:?}");
    // The ring fills up to its reserve: ENOSPC, then a wait frees it.
    let c = Copy::new(&a, 0, &b, 0, 64)?;
    let room = ring - i.ring_reserve_descs;
    for _ in 0..room {
        q.prepare_one(&c)?;
    }
    expect_errno(q.prepare_one(&c), libc::ENOSPC, "full ring")?;
    expect_errno(q.prepare(&[c, c]), libc::ENOSPC, "full ring, batch")?;
    ensure!(q.wait(None)? == u64::from(room) + 1, "wait on a full ring");
    q.prepare_one(&c)?;
    q.wait(None)?;
    // Another file's queue and buffers are not ours.
    let other = Device::open(dev.path())?;
    expect_errno(other.queue(eng(), 3, ring), libc::EBUSY, "another file takes our queue")?;
    let mut s = neuron_udma::sys::neuron_udma_queue_state { engine: eng(), queue: 3, ..Default::default() };
    // SAFETY: QUEUE_STATE takes a struct neuron_udma_queue_state, which `s` is.
    expect_errno(
        unsafe { other.raw_ioctl(neuron_udma::sys::NEURON_UDMA_QUEUE_STATE, &mut s) },
        libc::ENOENT,
        "state of another file's queue",
    )?;
    Ok(())
}

fn memcpy(dev: &Device, _: &Info) -> Result<()> {
    let mut a = dev.alloc_host(1 << 20)?;
    let mut b = dev.alloc_host(1 << 20)?;
    let d = dev.alloc_device(1 << 20)?;
    pattern(&mut a, 9);
    b.fill(0);
    let n = (1 << 20) - 100;
    dev.memcpy(&a, 7, &d, 3, n, None)?;
    dev.memcpy(&d, 3, &b, 11, n, Some(Duration::from_secs(10)))?;
    ensure!(b[11..11 + n as usize] == a[7..7 + n as usize], "memcpy via HBM differs");
    ensure!(b[..11].iter().all(|&x| x == 0), "memcpy wrote before its range");
    expect_errno(dev.memcpy(&a, 0, &b, 0, 0, None), libc::EINVAL, "memcpy of 0 bytes")?;
    expect_errno(dev.memcpy(&a, 1, &b, 0, 1 << 20, None), libc::EINVAL, "memcpy range (library)")?;
    let mut m = neuron_udma::sys::neuron_udma_memcpy {
        src_handle: a.handle(),
        src_offset: 1,
        dst_handle: b.handle(),
        size: 1 << 20,
        ..Default::default()
    };
    // SAFETY: MEMCPY takes a struct neuron_udma_memcpy, which `m` is.
    expect_errno(
        unsafe { dev.raw_ioctl(neuron_udma::sys::NEURON_UDMA_MEMCPY, &mut m) },
        libc::ERANGE,
        "memcpy range (kernel)",
    )?;
    Ok(())
}

/// `udmactl ARGS` (this program) as uid `uid` if given: its stdout, and its pid. Fails unless
/// it exits with status 0.
///
/// Not `std::process::Command`: in the test guest it cannot spawn. Its posix_spawn path needs
/// glibc's version, which a static binary cannot look up, and its fork path reports exec errors
/// through an AF_UNIX socket pair, which a kernel without CONFIG_NET (the test kernel) refuses
/// with ENOSYS. So: fork, dup2 the pipes, setgid/setuid, execv, by hand.
fn udmactl(args: &[&str], uid: Option<u32>) -> Result<(Vec<u8>, u32)> {
    use std::ffi::CString;
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;

    let exe = std::env::current_exe().context("current_exe")?;
    let path = CString::new(exe.as_os_str().as_bytes())?;
    let argv: Vec<CString> =
        std::iter::once("udmactl").chain(args.iter().copied()).map(CString::new).collect::<Result<_, _>>()?;
    let mut argp: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argp.push(std::ptr::null());
    let pipe = || -> Result<(OwnedFd, OwnedFd)> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`, which we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error()).context("pipe2");
        }
        // SAFETY: both are new descriptors of this process, owned by nobody else.
        Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (ow, ew) = (out_w.as_raw_fd(), err_w.as_raw_fd());
    // SAFETY: the child calls only async-signal-safe functions (dup2, setgroups, setgid,
    // setuid, execv, _exit) on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("fork");
    }
    if pid == 0 {
        // SAFETY: see above; the child never returns into Rust.
        unsafe {
            if libc::dup2(ow, 1) < 0 || libc::dup2(ew, 2) < 0 {
                libc::_exit(126);
            }
            if let Some(uid) = uid {
                if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
                    libc::_exit(126);
                }
            }
            libc::execv(path.as_ptr(), argp.as_ptr());
            libc::_exit(127);
        }
    }
    drop((out_w, err_w));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let read = std::fs::File::from(out_r).read_to_end(&mut out);
    std::fs::File::from(err_r).read_to_end(&mut err).context("reading its stderr")?;
    let mut status = 0;
    // SAFETY: waitpid writes the status of our own child into `status`.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        let e = std::io::Error::last_os_error();
        ensure!(e.kind() == std::io::ErrorKind::Interrupted, "waitpid: {e}");
    }
    read.context("reading its stdout")?;
    let who = uid.map(|u| format!(" as uid {u}")).unwrap_or_default();
    ensure!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "udmactl {}{who}: wait status {status:#x}: {}",
        args.join(" "),
        String::from_utf8_lossy(&err).trim()
    );
    Ok((out, pid as u32))
}

/// The usage counters (fdinfo and sysfs) through the library, exactly what a second file of
/// this process holds; then `udmactl top --once --json` shows this process with those bytes
/// (and not itself), `info --json` the device's counters, and as another user `top` counts
/// this process as not readable. Closing the file gives the device's bytes back.
fn usage_counters(dev: &Device, i: &Info) -> Result<()> {
    use neuron_udma::{DeviceUsage, FileUsage};
    let mine = dev.usage().context("fdinfo of the selftest's file")?;
    ensure!(
        (mine.buffers, mine.host_bytes, mine.device_bytes, mine.imported_bytes, mine.queues) == (0, 0, 0, 0, 0),
        "the selftest's file still holds buffers or queues after the other groups: {mine:?}"
    );
    let before = DeviceUsage::read(&mine.device)?;
    ensure!(before.device_total_bytes == i.device_mem_size, "mem_device_total_bytes {before:?}, INFO {i:?}");
    let ps = neuron_udma::page_size();
    let holder = Device::open(dev.path())?;
    let fresh = holder.usage()?;
    ensure!(fresh == FileUsage { device: mine.device.clone(), ..Default::default() }, "a new file: {fresh:?}");

    let (host, hbm, imported) = (12u64 << 10, 64u64 << 10, 2 * ps);
    let mut h = holder.alloc_host(host)?;
    h.fill(0x3c);
    let d = holder.alloc_device(hbm)?;
    let mut pages = memmap2::MmapMut::map_anon(4 * ps as usize)?;
    pages.fill(1);
    // 100 bytes in: the import touches three pages, all charged.
    let imp = holder.import(&pages[100..100 + imported as usize])?;
    let q = holder.queue(eng(), 1, 64)?;
    q.prepare_one(&Copy::new(&h, 0, &d, 0, 4096)?)?;
    q.submit()?.wait(None)?;
    let u = holder.usage()?;
    ensure!(u.device == mine.device, "device {} vs {}", u.device, mine.device);
    ensure!(
        (u.buffers, u.host_bytes, u.device_bytes, u.imported_bytes) == (3, host, hbm, imported),
        "buffers and bytes of the second file: {u:?}"
    );
    ensure!(
        (u.queues, u.copy_bytes, u.fences_completed, u.fences_failed) == (1, 4096, 1, 0),
        "queues, copies and fences of the second file: {u:?}"
    );
    // Host buffers are charged a power of two of pages; the queue's memory is on top.
    let charged = host.next_multiple_of(ps).next_power_of_two() + 3 * ps;
    ensure!(u.memlock_bytes > charged, "memlock {} (buffers alone {charged})", u.memlock_bytes);
    let now = holder.device_usage()?;
    let held = (now.host_bytes - before.host_bytes, now.device_bytes - before.device_bytes);
    ensure!(held == (host, hbm), "sysfs host/device bytes: before {before:?}, now {now:?}");
    ensure!(now.imported_bytes == before.imported_bytes + imported, "sysfs imported bytes: {before:?} {now:?}");
    ensure!(
        now.host_peak_bytes >= now.host_bytes
            && now.device_peak_bytes >= now.device_bytes
            && now.imported_peak_bytes >= now.imported_bytes,
        "peaks below the counters: {now:?}"
    );

    // udmactl top --once --json: this process, both files, with exactly their counters.
    let (out, top_pid) = udmactl(&["top", "--once", "--json"], None)?;
    let v: serde_json::Value = serde_json::from_slice(&out).context("top --json output")?;
    let me = std::process::id();
    let devs = v["devices"].as_array().context("no devices array")?;
    let ours = devs.iter().find(|d| d["pci_device"] == mine.device.as_str()).context("our device not in top")?;
    ensure!(ours["device"] == dev.path().display().to_string().as_str(), "top's node: {}", ours["device"]);
    let want_usage = serde_json::to_value(crate::json::DeviceUsageJson::from(&now))?;
    ensure!(ours["usage"] == want_usage, "top's device counters {} vs sysfs {want_usage}", ours["usage"]);
    let rows = ours["processes"].as_array().context("no processes array")?;
    ensure!(!rows.iter().any(|r| r["pid"] == top_pid), "top lists itself");
    let row = rows.iter().find(|r| r["pid"] == me).with_context(|| format!("pid {me} not in top: {ours}"))?;
    let n = |k: &str| row[k].as_u64().unwrap_or(u64::MAX);
    ensure!(n("files") == 2 && row["fds"].as_array().map(Vec::len) == Some(2), "files of this process: {row}");
    ensure!(
        (n("buffers"), n("host_bytes"), n("device_bytes"), n("imported_bytes")) == (3, host, hbm, imported),
        "top's bytes: {row}"
    );
    ensure!(n("memlock_bytes") == u.memlock_bytes + mine.memlock_bytes && n("queues") == 1, "top's memlock: {row}");
    ensure!(
        (n("copy_bytes"), n("fences_completed"), n("fences_failed"))
            == (mine.copy_bytes + 4096, mine.fences_completed + 1, mine.fences_failed),
        "top's copies and fences: {row} (selftest file {mine:?})"
    );
    ensure!(row["copy_bytes_per_second"].is_null() && v["interval_seconds"].is_null(), "rates with --once: {row}");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        ensure!(v["unreadable_processes"] == 0, "root could not read every process: {}", v["unreadable_processes"]);
    }

    // info --json: the PCI device and the same counters.
    let path = dev.path().display().to_string();
    let (out, _) = udmactl(&["-d", &path, "info", "--json"], None)?;
    let v: serde_json::Value = serde_json::from_slice(&out).context("info --json output")?;
    ensure!(v["pci_device"] == mine.device.as_str() && v["usage"] == want_usage, "info --json: {v}");

    // As another user (root only): this process cannot be read, and is counted so.
    if root {
        let (out, _) = udmactl(&["top", "--once", "--json"], Some(1001))?;
        let v: serde_json::Value = serde_json::from_slice(&out).context("top --json output as uid 1001")?;
        ensure!(v["unreadable_processes"].as_u64() > Some(0), "uid 1001 read every process: {v}");
        let ours = v["devices"].as_array().and_then(|a| a.iter().find(|d| d["pci_device"] == mine.device.as_str()));
        let ours = ours.context("our device not in top as uid 1001")?;
        ensure!(ours["usage"] == want_usage, "top's device counters as uid 1001: {ours}");
        ensure!(!ours["processes"].as_array().is_some_and(|r| r.iter().any(|r| r["pid"] == me)), "uid 1001 saw us");
    } else {
        note("not root: top as another user not tried");
    }

    drop((q, imp, d, h));
    drop(holder);
    let after = DeviceUsage::read(&mine.device)?;
    ensure!(
        (after.host_bytes, after.device_bytes, after.imported_bytes)
            == (before.host_bytes, before.device_bytes, before.imported_bytes),
        "closing the file did not give the bytes back: before {before:?}, after {after:?}"
    );
    ensure!(after.device_peak_bytes >= now.device_bytes, "the peak went down: {after:?}");
    Ok(())
}

/// The device's activity counters (sysfs) follow two copies and a fence, `udmactl metrics`
/// reports them (stdout and --output alike) with this device's labels, and `udmactl cdi`
/// describes this node with its device numbers.
fn metrics(dev: &Device, _: &Info) -> Result<()> {
    use neuron_udma::DeviceActivity;
    let pci = dev.usage().context("fdinfo of the selftest's file")?.device;
    let before = DeviceActivity::read(&pci)?;
    let mut h = dev.alloc_host(16 << 10)?;
    h.fill(0x5a);
    let q = dev.queue(eng(), 1, 64)?;
    q.prepare_one(&Copy::new(&h, 0, &h, 8192, 4096)?)?;
    q.prepare_one(&Copy::new(&h, 4096, &h, 12288, 1000)?)?;
    q.submit()?.wait(None)?;
    let after = DeviceActivity::read(&pci)?;
    ensure!(
        (after.copies - before.copies, after.copy_bytes - before.copy_bytes) == (2, 5096),
        "copies and bytes: before {before:?}, after {after:?}"
    );
    ensure!(after.fences_completed > before.fences_completed, "no fence counted: {before:?} {after:?}");
    ensure!(after.ring_host_bytes > 0, "no ring memory while a queue is held: {after:?}");
    drop(q);
    let node = dev.path().display().to_string();
    let index =
        crate::metrics::node_index(dev.path()).context("the selftest's node is not neuron_udma<N>")?.to_string();
    let (out, _) = udmactl(&["metrics"], None)?;
    let text = String::from_utf8(out).context("metrics output")?;
    let want = format!("neuron_udma_copies_total{{device=\"{index}\",pci=\"{pci}\"}} {}\n", after.copies);
    ensure!(text.contains(&want), "udmactl metrics has no {want:?}:\n{text}");
    ensure!(text.starts_with("# HELP ") && text.contains("# TYPE neuron_udma_copies_total counter\n"), "{text}");
    let file = std::env::temp_dir().join(format!("neuron_udma_selftest_{}.prom", std::process::id()));
    let (_, _) = udmactl(&["metrics", "--output", &file.display().to_string()], None)?;
    let written = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let _ = std::fs::remove_file(&file);
    // Nothing runs between the two calls: the same text.
    ensure!(written == text, "--output wrote other text than stdout:\n{written}");
    // Another user, who cannot open the node (0600 root), reads the same (sysfs is readable).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let (out, _) = udmactl(&["metrics"], Some(1001))?;
        ensure!(out == text.as_bytes(), "udmactl metrics as uid 1001:\n{}", String::from_utf8_lossy(&out));
    }

    // udmactl cdi: this node as CDI device "<N>" with its device numbers, and in "all".
    let (out, _) = udmactl(&["cdi"], None)?;
    let v: serde_json::Value = serde_json::from_slice(&out).context("cdi output")?;
    ensure!(v["kind"] == crate::cdi::KIND && v["cdiVersion"] == crate::cdi::CDI_VERSION, "cdi: {v}");
    let devices = v["devices"].as_array().context("cdi: no devices")?;
    let mine =
        devices.iter().find(|d| d["name"] == index.as_str()).with_context(|| format!("cdi: no device {index}: {v}"))?;
    let rdev = std::os::unix::fs::MetadataExt::rdev(&std::fs::metadata(dev.path())?);
    let dn = &mine["containerEdits"]["deviceNodes"][0];
    ensure!(
        dn["path"] == node.as_str()
            && dn["major"] == i64::from(libc::major(rdev))
            && dn["minor"] == i64::from(libc::minor(rdev))
            && dn["type"] == "c",
        "cdi device {index}: {mine}"
    );
    let all = devices.iter().find(|d| d["name"] == "all").context("cdi: no device all")?;
    ensure!(
        all["containerEdits"]["deviceNodes"].as_array().is_some_and(|a| a.iter().any(|n| n["path"] == node.as_str())),
        "cdi all: {all}"
    );
    Ok(())
}

/// The TAP comments of the running groups (`# ...` lines): printed, or with --json collected for
/// the object's "notes".
static NOTES: std::sync::Mutex<Option<Vec<String>>> = std::sync::Mutex::new(None);

/// A TAP comment: `# text` on stdout, or a note of the --json object.
fn note(text: impl Into<String>) {
    let text = text.into();
    if let Ok(mut collected) = NOTES.lock() {
        if let Some(notes) = collected.as_mut() {
            notes.push(text);
            return;
        }
    }
    println!("# {text}");
}

/// One group's result in `selftest --json`.
#[derive(serde::Serialize, Debug, PartialEq)]
pub struct TestJson {
    pub name: &'static str,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `selftest --json`: the device, every group's result, the notes and the counts.
#[derive(serde::Serialize, Debug)]
pub struct SelftestJson {
    pub device: String,
    pub tests: Vec<TestJson>,
    pub notes: Vec<String>,
    pub passed: usize,
    pub failed: usize,
}

impl SelftestJson {
    /// The object of `tests` run on `device`.
    pub fn new(device: String, tests: Vec<TestJson>, notes: Vec<String>) -> Self {
        let failed = tests.iter().filter(|t| !t.ok).count();
        SelftestJson { device, passed: tests.len() - failed, failed, tests, notes }
    }
}

/// Runs every group and prints TAP (with `json`, one [`SelftestJson`] object); the error lists
/// the failed groups.
pub fn run(dev: &Device, info: &Info, json: bool) -> Result<()> {
    let engine = info.user_engine().context("INFO reports no engine that reaches host memory")?;
    let _ = ENG.set(engine);
    type Check = fn(&Device, &Info) -> Result<()>;
    let checks: [(&str, Check); 13] = [
        ("info", info_check),
        ("open_and_errno_mapping", open_errors),
        ("host_and_device_buffers", buffers),
        ("queue_init_state_release", queues),
        ("prepare_start_wait_copies", copies),
        ("pipelined_copies_two_queues", pipeline),
        ("copy_errors_and_full_ring", copy_errors),
        ("memcpy", memcpy),
        ("imports", imports),
        ("fences_and_events", fences_and_events),
        ("memset_mmap_dmabuf_device_rings", abi3_memory),
        ("usage_counters_and_top", usage_counters),
        ("activity_counters_metrics_cdi", metrics),
    ];
    if json {
        if let Ok(mut n) = NOTES.lock() {
            *n = Some(Vec::new());
        }
    } else {
        println!("TAP version 13");
        println!("1..{}", checks.len());
    }
    let mut results = Vec::new();
    for (n, (name, f)) in checks.iter().enumerate() {
        let r = f(dev, info).with_context(|| name.to_string());
        if !json {
            match &r {
                Ok(()) => println!("ok {} {name}", n + 1),
                Err(e) => {
                    println!("# {e:#}");
                    println!("not ok {} {name}", n + 1);
                }
            }
        }
        results.push(TestJson { name, ok: r.is_ok(), error: r.err().map(|e| format!("{e:#}")) });
    }
    let failed: Vec<&str> = results.iter().filter(|t| !t.ok).map(|t| t.name).collect();
    if json {
        let notes = NOTES.lock().ok().and_then(|mut n| n.take()).unwrap_or_default();
        let out = SelftestJson::new(dev.path().display().to_string(), results, notes);
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!("# Totals: pass:{} fail:{}", checks.len() - failed.len(), failed.len());
    }
    if !failed.is_empty() {
        bail!("selftest failed: {}", failed.join(", "));
    }
    Ok(())
}

fn info_check(dev: &Device, i: &Info) -> Result<()> {
    info(dev, i)
}

/// Blocks on `f` (the library's futures are runtime-neutral): a thread-parking waker, and a
/// failure after 10 s without completion.
fn block_on<F: std::future::Future>(f: F) -> Result<F::Output> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    let t = std::time::Instant::now();
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return Ok(v);
        }
        ensure!(t.elapsed() < Duration::from_secs(10), "a future still pending after 10 s");
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

/// Whether the device file is readable (poll with `timeout_ms`): completions not reported yet.
fn readable(dev: &Device, timeout_ms: u16) -> Result<bool> {
    use nix::poll::{PollFd, PollFlags};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(dev.as_fd(), PollFlags::POLLIN | PollFlags::POLLPRI)];
    let n = nix::poll::poll(&mut fds, timeout_ms).context("poll on the device file")?;
    Ok(n > 0 && fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLIN)))
}

/// ABI 3 fences and their events: COPY_SUBMIT, FENCE_STATUS, FENCE_WAIT, poll() on the file and
/// QUEUE_EVENTS, QUEUE_EVENTFD, the async fence on the runtime-neutral listener, and the
/// reserved DST_INT flag.
fn fences_and_events(dev: &Device, i: &Info) -> Result<()> {
    ensure!(i.has_abi3(), "the driver has ABI {}: no fences", i.abi_version);
    ensure!(
        i.max_buffers > 0 && i.max_queue_fences > 0,
        "INFO max_buffers {} max_queue_fences {}",
        i.max_buffers,
        i.max_queue_fences
    );
    let q = dev.queue(eng(), 1, 64)?;
    let max = i.max_copy_size;
    let m = u64::from(max);
    let mut a = dev.alloc_host(8 * m)?;
    let mut b = dev.alloc_host(8 * m)?;
    pattern(&mut a, 21);
    b.fill(0);
    let batch = |k: u64| -> Result<Vec<Copy>> {
        Ok((0..2)
            .map(|j| Copy::new(&a, (k * 2 + j) * m, &b, (k * 2 + j) * m, max))
            .collect::<neuron_udma::Result<_>>()?)
    };
    // Nothing prepared, no fence yet: fence 0, done.
    let f0 = q.submit()?;
    ensure!(f0.number() == 0 && f0.is_done()?, "submit with nothing prepared: {f0:?}");
    // Leftover events of earlier groups' queues are not this group's.
    dev.queue_events()?;
    q.prepare(&batch(0)?)?;
    let f1 = q.submit()?;
    // Fence numbers go on after the instances of this queue id the file released before (an
    // earlier group used it): a fence of those is ECANCELED, never one of this instance.
    ensure!(f1.number() >= 1, "first fence {f1:?}");
    if f1.number() > 1 {
        expect_errno(
            q.fence(f1.number() - 1).is_done(),
            libc::ECANCELED,
            "FENCE_STATUS of a released instance's fence",
        )?;
    }
    f1.wait(Some(Duration::from_secs(10)))?;
    ensure!(f1.is_done()? && f1.status()? == neuron_udma::FenceStatus::Done, "fence 1 after FENCE_WAIT");
    let r = f1.report()?;
    ensure!(r.completed >= f1.number() && r.submitted == f1.number(), "FENCE_STATUS {r:?}");
    ensure!(b[..2 * max as usize] == a[..2 * max as usize], "bytes of fence 1");
    ensure!(q.submit()? == f1, "a submit with nothing new returns the newest fence");
    expect_errno(q.fence(f1.number() + 8).is_done(), libc::EINVAL, "FENCE_STATUS of a fence not submitted")?;
    // poll() shows the completion until QUEUE_EVENTS reports it.
    ensure!(readable(dev, 1000)?, "the file is not readable after fence 1 completed");
    let ev = dev.queue_events()?;
    ensure!(
        ev.iter()
            .any(|e| (e.engine(), e.queue()) == (eng(), 1) && e.completed() >= f1.number() && e.failure().is_none()),
        "QUEUE_EVENTS {ev:?}"
    );
    ensure!(!readable(dev, 0)?, "still readable after QUEUE_EVENTS");
    // A fence learnt through poll() alone.
    q.prepare(&batch(1)?)?;
    let f2 = q.submit()?;
    ensure!(readable(dev, 10_000)?, "no readiness in 10 s for fence 2");
    ensure!(dev.queue_events()?.iter().any(|e| e.completed() >= f2.number()), "QUEUE_EVENTS after fence 2");
    ensure!(f2.is_done()?, "fence 2 reported completed, FENCE_STATUS disagrees");
    // An eventfd counts the queue's fences.
    let efd = q.eventfd()?;
    expect_errno(q.eventfd(), libc::EINVAL, "a second eventfd registration (library)")?;
    q.prepare(&batch(2)?)?;
    q.submit()?.wait(None)?;
    // The driver signals the eventfd as it retires the fence: give it a moment to.
    let mut fds = [nix::poll::PollFd::new(std::os::fd::AsFd::as_fd(&efd), nix::poll::PollFlags::POLLIN)];
    nix::poll::poll(&mut fds, 1000u16).context("poll on the eventfd")?;
    ensure!(efd.read()? == 1, "eventfd count after one fence");
    drop(efd);
    // The async fence, runtime-neutral.
    dev.queue_events()?;
    let events = neuron_udma::DeviceEvents::with_thread(dev)?;
    q.prepare(&batch(3)?)?;
    let f4 = q.submit()?;
    block_on(f4.completion(&events))??;
    ensure!(b[..] == a[..], "bytes of fences 1..4");
    // DST_INT is reserved since ABI 3.
    let c = Copy::new(&a, 0, &b, 0, 64)?.dst_interrupt(true);
    expect_errno(q.prepare_one(&c), libc::EINVAL, "COPY_DST_INT (reserved since ABI 3)")?;
    Ok(())
}

/// ABI 3 memory: MEMSET, mmap of a device buffer, a dma-buf of a device buffer imported back
/// (if the device reaches its own exported memory), and a queue with its rings in device memory.
fn abi3_memory(dev: &Device, i: &Info) -> Result<()> {
    use std::os::fd::AsFd;
    ensure!(i.has_abi3(), "the driver has ABI {}: no MEMSET", i.abi_version);
    let mut h = dev.alloc_host(1 << 16)?;
    h.fill(0x11);
    dev.memset(&h, 100, 1000, 0xAB, None)?;
    ensure!(h[100..1100].iter().all(|&x| x == 0xAB) && h[99] == 0x11 && h[1100] == 0x11, "MEMSET of a host buffer");
    expect_errno(dev.memset(&h, 0, 0, 1, None), libc::EINVAL, "MEMSET of 0 bytes")?;
    let d = dev.alloc_device(1 << 16)?;
    dev.memset(&d, 0, 1 << 16, 0x5C, Some(Duration::from_secs(10)))?;
    dev.memcpy(&d, 0, &h, 0, 1 << 16, None)?;
    ensure!(h.iter().all(|&x| x == 0x5C), "MEMSET of a device buffer, read back");
    // mmap of the device buffer: CPU writes, read back by the engine, and the other way.
    {
        let mut map = d.map()?;
        ensure!(map.len() >= 1 << 16 && map[0] == 0x5C && map[(1 << 16) - 1] == 0x5C, "device mapping bytes");
        pattern(&mut map[..4096], 31);
    }
    dev.memcpy(&d, 0, &h, 0, 4096, None)?;
    let mut want = vec![0u8; 4096];
    pattern(&mut want, 31);
    ensure!(h[..4096] == want[..], "CPU writes through the device mapping, read by the engine");
    // A dma-buf of the device buffer: the buffer stays while exported.
    let fd = dev.dmabuf_export(&d)?;
    let mut f = neuron_udma::sys::neuron_udma_mem_free { handle: d.handle(), ..Default::default() };
    // SAFETY: MEM_FREE takes a struct neuron_udma_mem_free, which `f` is.
    expect_errno(
        unsafe { dev.raw_ioctl(neuron_udma::sys::NEURON_UDMA_MEM_FREE, &mut f) },
        libc::EBUSY,
        "MEM_FREE of an exported buffer",
    )?;
    let mut e = neuron_udma::sys::neuron_udma_dmabuf_export { handle: h.handle(), ..Default::default() };
    // SAFETY: DMABUF_EXPORT takes a struct neuron_udma_dmabuf_export, which `e` is.
    expect_errno(
        unsafe { dev.raw_ioctl(neuron_udma::sys::NEURON_UDMA_DMABUF_EXPORT, &mut e) },
        libc::EINVAL,
        "DMABUF_EXPORT of a host buffer",
    )?;
    let null = std::fs::File::open("/dev/null")?;
    expect_errno(dev.dmabuf_import(null.as_fd()), libc::EBADF, "DMABUF_IMPORT of a file that is no dma-buf")?;
    match dev.dmabuf_import(fd.as_fd()) {
        Ok(imp) => {
            ensure!(imp.size() >= 1 << 16 && imp.segments() >= 1 && !imp.writable(), "dma-buf import {imp:?}");
            h.fill(0);
            dev.memcpy(&imp, 0, &h, 0, 4096, None)?;
            ensure!(h[..4096] == want[..], "copy from the imported dma-buf");
            expect_errno(dev.memcpy(&h, 0, &imp, 0, 16, None), libc::EPERM, "copy into a read-only dma-buf import")?;
        }
        // The device may not reach its own memory through a dma-buf: the header allows it.
        Err(Error::NotSupported) => note("dma-buf import of our own device memory: EOPNOTSUPP"),
        Err(e) => return Err(e).context("DMABUF_IMPORT of our own export"),
    }
    drop(fd);
    // A queue with its rings in device memory: device -> device copies.
    if i.has_device_rings(eng()) {
        let q = dev.queue_with(eng(), 2, neuron_udma::QueueOptions::new(64).device_rings(true))?;
        ensure!(q.device_rings(), "device_rings()");
        let d2 = dev.alloc_device(1 << 16)?;
        q.prepare_one(&Copy::new(&d, 0, &d2, 0, 4096)?)?;
        q.submit()?.wait(None)?;
        h.fill(0);
        dev.memcpy(&d2, 0, &h, 0, 4096, None)?;
        ensure!(h[..4096] == want[..], "device -> device on a queue with device rings");
    } else {
        note(format!("engine {} has no device rings (device_ring_engines of INFO)", eng()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape() {
        let tests = vec![
            TestJson { name: "info", ok: true, error: None },
            TestJson { name: "memcpy", ok: false, error: Some("memcpy: timed out".into()) },
        ];
        let v =
            serde_json::to_value(SelftestJson::new("/dev/neuron_udma0".into(), tests, vec!["a note".into()])).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "device": "/dev/neuron_udma0",
                "tests": [{"name": "info", "ok": true}, {"name": "memcpy", "ok": false, "error": "memcpy: timed out"}],
                "notes": ["a note"],
                "passed": 1,
                "failed": 1,
            })
        );
    }

    /// The runner of `udmactl` subcommands, on this test binary (current_exe): `--list` lists
    /// the tests and exits 0; an unknown option fails with the harness's message.
    #[test]
    fn runs_this_program() {
        let (out, pid) = udmactl(&["--list", "--exact", "selftest::tests::runs_this_program"], None).unwrap();
        assert!(String::from_utf8_lossy(&out).contains("runs_this_program: test"), "{out:?}");
        assert!(pid > 0 && pid != std::process::id());
        let e = udmactl(&["--no-such-option"], None).unwrap_err().to_string();
        assert!(e.starts_with("udmactl --no-such-option: wait status"), "{e}");
        assert!(e.contains("no-such-option"), "{e}");
    }
}
