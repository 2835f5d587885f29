// SPDX-License-Identifier: GPL-2.0
//! Independent users of the device that run beside the state machine: a second process with
//! its own file and queue, and threads with their own files. They check their own bytes; the
//! state machine's faults and errors must never reach them.

use crate::dev::{Dev, Mapping};
use crate::model::pattern;
use neuron_udma::sys;
use std::path::Path;
use std::time::{Duration, Instant};

fn alloc_host(dev: &Dev, size: u64) -> Result<(u64, Mapping), String> {
    let mut a = sys::neuron_udma_mem_alloc { size, type_: sys::NEURON_UDMA_MEM_HOST, ..Default::default() };
    dev.ioctl(sys::NEURON_UDMA_MEM_ALLOC, &mut a).map_err(|e| format!("MEM_ALLOC: errno {e}"))?;
    let map =
        Mapping::new(dev.raw(), a.size as usize, a.mmap_offset, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED)
            .map_err(|e| format!("mmap: errno {e}"))?;
    Ok((a.handle, map))
}

fn alloc_device(dev: &Dev, size: u64) -> Result<u64, String> {
    let mut a = sys::neuron_udma_mem_alloc { size, type_: sys::NEURON_UDMA_MEM_DEVICE, ..Default::default() };
    dev.ioctl(sys::NEURON_UDMA_MEM_ALLOC, &mut a).map_err(|e| format!("MEM_ALLOC device: errno {e}"))?;
    Ok(a.handle)
}

fn memcpy(dev: &Dev, src: u64, dst: u64, size: u64) -> Result<(), String> {
    let mut m = sys::neuron_udma_memcpy { src_handle: src, dst_handle: dst, size, ..Default::default() };
    dev.ioctl(sys::NEURON_UDMA_MEMCPY, &mut m).map_err(|e| format!("MEMCPY: errno {e}"))
}

fn check(map: &Mapping, seed: u32, len: usize, what: &str) -> Result<(), String> {
    let got = map.read();
    match (0..len).find(|&i| got[i] != pattern(seed, i)) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: byte {i} is {:#04x}, expected {:#04x}", got[i], pattern(seed, i))),
    }
}

/// The second process's work: `rounds` times host -> device -> host through its own queue
/// (`engine`, `queue`) and once more with MEMCPY, each byte checked. Runs in a forked child.
///
/// # Errors
///
/// What went wrong, first failure only.
pub fn second_process(path: &Path, engine: u32, queue: u32, rounds: u32, seed: u32) -> Result<(), String> {
    const SIZE: usize = 16384;
    let dev = Dev::open(path, false).map_err(|e| format!("open: errno {e}"))?;
    let (src, smap) = alloc_host(&dev, SIZE as u64)?;
    let (dst, dmap) = alloc_host(&dev, SIZE as u64)?;
    let hbm = alloc_device(&dev, SIZE as u64)?;
    let mut qi = sys::neuron_udma_queue_init { engine, queue, tx_descs: 64, rx_descs: 64, ..Default::default() };
    dev.ioctl(sys::NEURON_UDMA_QUEUE_INIT, &mut qi).map_err(|e| format!("QUEUE_INIT {engine}/{queue}: errno {e}"))?;
    for r in 0..rounds {
        let s = seed.wrapping_add(r);
        let data: Vec<u8> = (0..SIZE).map(|i| pattern(s, i)).collect();
        smap.write(0, &data);
        let copies = [
            sys::neuron_udma_copy {
                src_handle: src,
                dst_handle: hbm,
                size: SIZE as u32,
                barrier: sys::NEURON_UDMA_BARRIER_WRITE,
                ..Default::default()
            },
            sys::neuron_udma_copy {
                src_handle: hbm,
                dst_handle: dst,
                size: SIZE as u32,
                barrier: sys::NEURON_UDMA_BARRIER_DMB,
                ..Default::default()
            },
        ];
        let mut p = sys::neuron_udma_copy_prepare {
            engine,
            queue,
            count: 2,
            copies: copies.as_ptr() as u64,
            ..Default::default()
        };
        dev.ioctl(sys::NEURON_UDMA_COPY_PREPARE, &mut p).map_err(|e| format!("round {r}: COPY_PREPARE: errno {e}"))?;
        let mut w = sys::neuron_udma_copy_wait { engine, queue, ..Default::default() };
        dev.ioctl(sys::NEURON_UDMA_COPY_WAIT, &mut w).map_err(|e| format!("round {r}: COPY_WAIT: errno {e}"))?;
        if w.completed != 3 {
            return Err(format!("round {r}: COPY_WAIT completed {} pairs, expected 3", w.completed));
        }
        check(&dmap, s, SIZE, &format!("round {r}: queue copy"))?;
        if r % 4 == 3 {
            memcpy(&dev, dst, hbm, SIZE as u64)?;
            smap.write(0, &vec![0; SIZE]);
            memcpy(&dev, hbm, src, SIZE as u64)?;
            check(&smap, s, SIZE, &format!("round {r}: MEMCPY"))?;
        }
    }
    Ok(())
}

/// A thread's work beside the state machine: its own file, two host buffers, `rounds`
/// MEMCPYs (the driver's shared queue), each byte checked.
///
/// # Errors
///
/// What went wrong, first failure only.
pub fn memcpy_thread(path: &Path, rounds: u32, seed: u32) -> Result<(), String> {
    const SIZE: usize = 8192;
    let dev = Dev::open(path, false).map_err(|e| format!("open: errno {e}"))?;
    let (a, amap) = alloc_host(&dev, SIZE as u64)?;
    let (b, bmap) = alloc_host(&dev, SIZE as u64)?;
    for r in 0..rounds {
        let s = seed.wrapping_add(r);
        let data: Vec<u8> = (0..SIZE).map(|i| pattern(s, i)).collect();
        amap.write(0, &data);
        memcpy(&dev, a, b, SIZE as u64)?;
        check(&bmap, s, SIZE, &format!("thread round {r}"))?;
    }
    Ok(())
}

/// A forked child process.
#[derive(Debug)]
pub struct Child {
    pid: libc::pid_t,
}

impl Child {
    /// Forks; the child closes every inherited descriptor but the standard ones and `keep`,
    /// then runs `f` and exits with 0 if it returned `Ok`, 1 otherwise (printing the error).
    /// Returns once the child has closed the descriptors, so that closing a file in the parent
    /// really releases it. The caller must have no other thread running.
    pub fn spawn(keep: Option<i32>, f: impl FnOnce() -> Result<(), String>) -> Self {
        let mut p = [0; 2];
        // SAFETY: `p` has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2 failed");
        // SAFETY: the fuzzer forks only while single-threaded; the child only runs `f` and
        // leaves with `_exit` (no unwinding into the parent's test runner).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            close_fds_except(&[Some(p[1]), keep]);
            // SAFETY: our own pipe end; one byte says the descriptors are closed.
            unsafe {
                libc::write(p[1], [1u8].as_ptr().cast(), 1);
                libc::close(p[1]);
            }
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let code = match r {
                Ok(Ok(())) => 0,
                Ok(Err(e)) => {
                    eprintln!("# child {}: {e}", std::process::id());
                    1
                }
                Err(_) => 2,
            };
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        // SAFETY: the write end belongs to the child now; the read end waits (at most 20 s)
        // for its byte, or for its exit (end of file).
        unsafe {
            libc::close(p[1]);
            let mut fds = libc::pollfd { fd: p[0], events: libc::POLLIN, revents: 0 };
            libc::poll(&mut fds, 1, 20_000);
            libc::close(p[0]);
        }
        Self { pid }
    }

    /// Forks like [`Self::spawn`]; the child exits with the code `f` returns.
    pub fn spawn_code(keep: Option<i32>, f: impl FnOnce() -> i32) -> Self {
        let mut p = [0; 2];
        // SAFETY: `p` has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2 failed");
        // SAFETY: as in `spawn`: the fuzzer forks only while single-threaded; the child runs
        // `f` and leaves with `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            close_fds_except(&[Some(p[1]), keep]);
            // SAFETY: our own pipe end; one byte says the descriptors are closed.
            unsafe {
                libc::write(p[1], [1u8].as_ptr().cast(), 1);
                libc::close(p[1]);
            }
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(2);
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        // SAFETY: as in `spawn`.
        unsafe {
            libc::close(p[1]);
            let mut fds = libc::pollfd { fd: p[0], events: libc::POLLIN, revents: 0 };
            libc::poll(&mut fds, 1, 20_000);
            libc::close(p[0]);
        }
        Self { pid }
    }

    /// Waits at most `limit` for the child; kills it past that. Returns its exit status, or
    /// `Err` when it did not exit in time or died of a signal.
    pub fn join(self, limit: Duration) -> Result<i32, String> {
        let pid = self.pid;
        std::mem::forget(self);
        let start = Instant::now();
        loop {
            let mut status = 0;
            // SAFETY: waits for our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                if libc::WIFEXITED(status) {
                    return Ok(libc::WEXITSTATUS(status));
                }
                return Err(format!("child {pid} died: status {status:#x}"));
            }
            if start.elapsed() > limit {
                kill(pid);
                return Err(format!("child {pid} did not exit within {limit:?}"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Closes every descriptor of the process but the standard ones and those in `keep`.
fn close_fds_except(keep: &[Option<i32>]) {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    for fd in fds.into_iter().filter(|&fd| fd > 2 && !keep.contains(&Some(fd))) {
        // SAFETY: a forked child closing the descriptors it inherited and does not use (the
        // directory's own descriptor is closed already or fails harmlessly).
        unsafe { libc::close(fd) };
    }
}

fn kill(pid: libc::pid_t) {
    // SAFETY: our own child; reaping it after SIGKILL cannot block for long.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        kill(self.pid);
    }
}
