// SPDX-License-Identifier: MIT OR Apache-2.0
//! Errors that name the limit: engine and queue arguments checked against INFO, the smallest
//! `--window`, and ENOMEM explained by `RLIMIT_MEMLOCK`.

use std::fmt::Display;
use std::path::Path;

use anyhow::{anyhow, Result};
use neuron_udma::{Device, Error, Info};

/// The smallest `--window`: one full copy (`max_copy_size` of INFO is 64 KiB on every
/// generation). A smaller window would move the data in rounds of a few bytes.
pub const MIN_WINDOW: u64 = 64 << 10;

/// A `--window` value: a size (K, M, G suffixes) of at least [`MIN_WINDOW`].
pub fn parse_window(s: &str) -> Result<u64, String> {
    let n = crate::parse_size(s)?;
    if n < MIN_WINDOW {
        return Err(format!(
            "a window of {n} bytes is below the minimum of {} (one full copy, max_copy_size of INFO); \
             the data would move in rounds of {n} bytes",
            crate::human_size(MIN_WINDOW)
        ));
    }
    Ok(n)
}

/// "this trn1 device", or "this device (id 0x1234)" for an unknown model.
pub fn this_device(info: &Info) -> String {
    match info.model() {
        Some(m) => format!("this {m} device"),
        None => format!("this device (id {:#06x})", info.device_id),
    }
}

/// Checks that a user queue can exist at (`engine`, `queue`) on the device INFO describes: the
/// engine is in range and reaches host memory, the queue is in range. The error names the
/// valid range.
pub fn check_user_queue(info: &Info, engine: u32, queue: u32) -> Result<(), String> {
    let this = this_device(info);
    if engine >= info.engines {
        return Err(match info.engines {
            0 => format!("engine {engine} out of range: {this} reports no engines"),
            n => format!("engine {engine} out of range: {this} has engines 0..{}", n - 1),
        });
    }
    if !info.has_host_connectivity(engine) {
        let host = info.host_engine_list();
        return Err(if host.is_empty() {
            format!("engine {engine} does not reach host memory, and no engine of {this} does: it has no user queues")
        } else {
            format!(
                "engine {engine} does not reach host memory, so it has no user queues: on {this} the engines {} \
                 serve user queues",
                crate::engine_ranges(host.into_iter())
            )
        });
    }
    if queue >= info.queues_per_engine {
        return Err(match info.queues_per_engine {
            0 => format!("queue {queue} out of range: the engines of {this} have no queues"),
            n => format!("queue {queue} out of range: the engines of {this} have queues 0..{}", n - 1),
        });
    }
    Ok(())
}

/// The error of a `QUEUE_INIT` of (`engine`, `queue`) on `dev` that failed with `e`; for a
/// queue that is busy (`EBUSY`), who holds it: the driver (which queue it keeps, and for what),
/// its in-kernel dmaengine channels (counted in sysfs), or another open file.
pub fn queue_init_error(dev: &Device, info: &Info, engine: u32, queue: u32, ring: u32, e: Error) -> anyhow::Error {
    let dma = match e {
        Error::Busy => dmaengine_channels(dev).map(|n| info.dmaengine_queues(n)).unwrap_or_default(),
        _ => Vec::new(),
    };
    queue_init_error_with(info, &dma, engine, queue, ring, e)
}

/// How many channels the driver's dmaengine provider registered for the device of `dev`
/// ([`dmaengine_channels_of`] its PCI device; `None` if they cannot be read).
pub fn dmaengine_channels(dev: &Device) -> Option<u32> {
    dmaengine_channels_of(&dev.usage().ok()?.device)
}

/// How many dmaengine channels PCI device `pci` has: its `dma/dma<N>chan<M>` entries in sysfs
/// (0 without a `dma` directory: no channel registered; `None` if the device is not in sysfs).
pub fn dmaengine_channels_of(pci: &str) -> Option<u32> {
    let dev = Path::new("/sys/bus/pci/devices").join(pci);
    let Ok(dir) = std::fs::read_dir(dev.join("dma")) else {
        return dev.exists().then_some(0);
    };
    let n = dir.flatten().filter(|e| e.file_name().to_str().is_some_and(|n| n.contains("chan"))).count();
    u32::try_from(n).ok()
}

/// [`queue_init_error`] with the queues the dmaengine provider holds (`dma`, from
/// [`Info::dmaengine_queues`]).
pub fn queue_init_error_with(
    info: &Info,
    dma: &[(u32, u32)],
    engine: u32,
    queue: u32,
    ring: u32,
    e: Error,
) -> anyhow::Error {
    let what = format!("NEURON_UDMA_QUEUE_INIT engine {engine} queue {queue} ring {ring}");
    match e {
        Error::Busy => anyhow!("{what}: {}", busy_reason(info, dma, engine, queue)),
        Error::OutOfMemory => anyhow!("{what}: {}", memlock_message(&Remedy::Window)),
        e => anyhow::Error::new(e).context(what),
    }
}

/// Why `QUEUE_INIT` of (`engine`, `queue`) was `EBUSY`, and what to do.
pub fn busy_reason(info: &Info, dma: &[(u32, u32)], engine: u32, queue: u32) -> String {
    const PICK: &str = "pick another --queue (queues 1..3 of an engine other than the H2T engines are never reserved)";
    let h2t = info.h2t_queues();
    if h2t.first() == Some(&(engine, queue)) {
        return format!(
            "busy (EBUSY): engine {engine} queue {queue} is reserved: the driver's own H2T queue (the MEMCPY and \
             MEMSET ioctls, device-memory scrubs); {PICK}"
        );
    }
    if h2t.contains(&(engine, queue)) {
        return format!(
            "busy (EBUSY): engine {engine} queue {queue} is reserved: a host-DMA (H2T) queue the driver keeps for \
             itself (device-memory scrubs); {PICK}"
        );
    }
    if let Some(i) = dma.iter().position(|&q| q == (engine, queue)) {
        let held: Vec<String> = dma.iter().map(|&(e, q)| format!("{e}/{q}")).collect();
        return format!(
            "busy (EBUSY): engine {engine} queue {queue} is held by the driver's in-kernel dmaengine provider \
             (channel {i} of {}, for kernel users of DMA_MEMCPY/DMA_MEMSET such as dmatest; it holds the queues {} \
             while the device is bound, one per channel: module parameter dma_channels); {PICK}",
            dma.len(),
            held.join(" ")
        );
    }
    if info.is_reserved_queue(engine, queue) {
        return format!(
            "busy (EBUSY): engine {engine} queue {queue} is reserved: kept for the NeuronCores and collectives \
             (hardware.rst 2.4); {PICK}"
        );
    }
    format!(
        "busy (EBUSY): engine {engine} queue {queue} is in use: another open file of this device holds it \
         (`udmactl top` shows the processes that have the device open); {PICK}"
    )
}

/// The bytes of locked memory (`RLIMIT_MEMLOCK`) a user queue with rings of `ring_descs`
/// descriptors is charged, as the driver counts them (`Queue::memory_bytes` in `rust/queue.rs`):
/// both rings of 16-byte descriptors and the 256 completion slots of 8 bytes, each a
/// power-of-two block of pages, and the 256 fence and 32 lost-range records (24 bytes each) in
/// whole pages.
pub fn queue_charge(ring_descs: u32) -> u64 {
    const PAGE: u64 = 4096;
    let block = |bytes: u64| bytes.max(PAGE).next_power_of_two();
    let ring = block(u64::from(ring_descs) * 16);
    2 * ring + block(256 * 8) + ((256 + 32) * 24u64).div_ceil(PAGE) * PAGE
}

/// The locked memory this process may pin through the driver: the soft `RLIMIT_MEMLOCK`, or
/// `None` (no limit) when it is unlimited or the process has `CAP_IPC_LOCK`.
pub fn memlock_budget() -> Option<u64> {
    if has_cap_ipc_lock() {
        return None;
    }
    memlock_soft_limit()
}

/// How a copy's pinned memory grows with its window: `buffers` host buffers (or imports) of the
/// window at once, each charged as the next power of two of its size (a host buffer's charge),
/// plus `fixed` bytes (the queues' rings: [`queue_charge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned {
    /// Window-sized buffers held at once.
    pub buffers: u64,
    /// Bytes charged whatever the window (queues).
    pub fixed: u64,
}

impl Pinned {
    /// Bytes charged with a window of `w` bytes.
    pub fn charge(&self, w: u64) -> u64 {
        self.buffers.saturating_mul(w.next_power_of_two()).saturating_add(self.fixed)
    }
}

/// The window of a copy that pins `p` under `budget` (from [`memlock_budget`]; `None`: no
/// limit): `--window` (`explicit`) if its charge fits, else an error naming the limit, the
/// size needed and what fits; without `--window`, `want` (the default) or, if its charge does
/// not fit, the largest power of two below it that fits and is at least [`MIN_WINDOW`], else an
/// error naming the limit, the size needed and the flags that change it.
pub fn plan_window(explicit: Option<u64>, want: u64, budget: Option<u64>, p: Pinned) -> Result<u64, String> {
    let Some(limit) = budget else {
        return Ok(explicit.unwrap_or(want));
    };
    let fits = |w: u64| p.charge(w) <= limit;
    let largest = |mut w: u64| {
        w = if w.is_power_of_two() { w } else { w.next_power_of_two() / 2 };
        while w >= MIN_WINDOW && !fits(w) {
            w /= 2;
        }
        Some(w).filter(|&w| w >= MIN_WINDOW)
    };
    let limit_text = format!("RLIMIT_MEMLOCK (soft limit {}, ulimit -l {})", crate::human_bytes(limit), limit / 1024);
    let raise = "raise the limit (ulimit -l, /etc/security/limits.d, LimitMEMLOCK= of a systemd unit) or run with \
                 CAP_IPC_LOCK";
    let needs = |w: u64| {
        let mut t = format!("{} buffer(s) of {} pinned", p.buffers, crate::human_bytes(w.next_power_of_two()));
        if p.fixed > 0 {
            t.push_str(&format!(" and {} of queue rings", crate::human_bytes(p.fixed)));
        }
        t
    };
    match explicit {
        Some(w) if fits(w) => Ok(w),
        Some(w) => Err(format!(
            "--window {} needs {} of locked memory ({}), more than {limit_text}: {}",
            crate::human_size(w),
            crate::human_bytes(p.charge(w)),
            needs(w),
            match largest(w) {
                Some(f) => format!("use --window {} (or less), or {raise}", crate::human_size(f)),
                None => format!("{raise}: even --window {} does not fit", crate::human_size(MIN_WINDOW)),
            }
        )),
        None if fits(want) => Ok(want),
        None => largest(want).ok_or_else(|| {
            let w = want.min(MIN_WINDOW);
            format!(
                "the smallest window ({}) needs {} of locked memory ({}), more than {limit_text}: {raise} (to at \
                 least ulimit -l {}); --window sets the window",
                crate::human_size(w),
                crate::human_bytes(p.charge(w)),
                needs(w),
                p.charge(w).div_ceil(1024)
            )
        }),
    }
}

/// What to suggest when `RLIMIT_MEMLOCK` was likely exceeded.
pub enum Remedy {
    /// A smaller `--window`.
    Window,
    /// Smaller `--sizes` (bench --zero-copy imports each size whole).
    Sizes,
}

/// The soft `RLIMIT_MEMLOCK` of this process in bytes; `None` if unlimited.
pub fn memlock_soft_limit() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one struct rlimit, which `r` is.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(r.rlim_cur)
}

/// Whether `uid_map` (the text of `/proc/self/uid_map`) is the initial user namespace's: the
/// identity map of every uid. Capabilities held in another namespace do not count for the
/// driver, whose `capable()` checks the initial one.
pub fn is_initial_uid_map(uid_map: &str) -> bool {
    let fields: Vec<&str> = uid_map.split_whitespace().collect();
    fields == ["0", "0", "4294967295"]
}

/// Whether this process has `CAP_IPC_LOCK` (effective) in the initial user namespace, which
/// exempts it from `RLIMIT_MEMLOCK` (in a user namespace of its own, a rootless container, the
/// bit in `CapEff` does not).
pub fn has_cap_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let initial = std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| is_initial_uid_map(&m));
    initial
        && std::fs::read_to_string("/proc/self/status").ok().is_some_and(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .is_some_and(|caps| caps >> CAP_IPC_LOCK & 1 == 1)
        })
}

/// Why an allocation, import or queue of the driver failed with ENOMEM, for this process.
pub fn memlock_message(remedy: &Remedy) -> String {
    memlock_text(memlock_soft_limit(), has_cap_ipc_lock(), remedy)
}

/// [`memlock_message`] for a soft limit (`None`: unlimited) and whether `CAP_IPC_LOCK` is held.
pub fn memlock_text(soft: Option<u64>, cap_ipc_lock: bool, remedy: &Remedy) -> String {
    if cap_ipc_lock {
        return "out of memory (ENOMEM); not RLIMIT_MEMLOCK: this process has CAP_IPC_LOCK, which the limit does \
                not bind"
            .into();
    }
    let Some(limit) = soft else {
        return "out of memory (ENOMEM); not RLIMIT_MEMLOCK: its soft limit is unlimited".into();
    };
    // The driver charges this user's host buffers, rings and imports against the limit; two
    // buffers of a window (source and destination) and the rings fit in a quarter of it.
    let window = (limit / 4).checked_ilog2().map(|b| 1u64 << b).filter(|&w| w >= MIN_WINDOW);
    let remedy = match (remedy, window) {
        (Remedy::Window, Some(w)) => {
            format!("use --window SIZE (e.g. --window {}), or raise the limit (ulimit -l)", crate::human_size(w))
        }
        (Remedy::Window, None) => format!(
            "raise the limit (ulimit -l): it is too low even for the smallest --window ({})",
            crate::human_size(MIN_WINDOW)
        ),
        (Remedy::Sizes, _) => "use smaller --sizes (each is imported whole), or raise the limit (ulimit -l)".into(),
    };
    format!(
        "out of memory (ENOMEM): RLIMIT_MEMLOCK (soft limit {}, ulimit -l {}) was likely exceeded: the driver \
         charges this user's pinned memory (imports, host buffers, rings) to it; {remedy}",
        crate::human_bytes(limit),
        limit / 1024
    )
}

/// `r` with `what` as context; an ENOMEM explained by [`memlock_message`].
pub fn or_memlock<T>(r: neuron_udma::Result<T>, what: impl Display, remedy: Remedy) -> Result<T> {
    r.map_err(|e| match e {
        Error::OutOfMemory => anyhow!("{what}: {}", memlock_message(&remedy)),
        e => anyhow::Error::new(e).context(what.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_initial_user_namespace_counts_for_cap_ipc_lock() {
        assert!(is_initial_uid_map("         0          0 4294967295\n"));
        // A rootless container: root inside, a normal user outside.
        assert!(!is_initial_uid_map("         0       1000          1\n"));
        assert!(!is_initial_uid_map("0 0 1000\n1000 100000 65536\n"));
        assert!(!is_initial_uid_map(""));
    }

    fn trn1() -> Info {
        Info {
            device_id: 0x7164,
            generation: 2,
            engines: 34,
            queues_per_engine: 16,
            host_engines: [(1 << 34) - 1, 0, 0],
            ..Default::default()
        }
    }

    fn trn2() -> Info {
        Info {
            device_id: 0x7364,
            generation: 3,
            engines: 132,
            queues_per_engine: 16,
            host_engines: [0xF0F0_F0F0_F0F0_F0F0, 0xF0F0_F0F0_F0F0_F0F0, 0xF],
            ..Default::default()
        }
    }

    #[test]
    fn range_errors_name_the_range() {
        assert_eq!(
            check_user_queue(&trn1(), 40, 1).unwrap_err(),
            "engine 40 out of range: this trn1 device has engines 0..33"
        );
        assert_eq!(
            check_user_queue(&trn1(), 0, 16).unwrap_err(),
            "queue 16 out of range: the engines of this trn1 device have queues 0..15"
        );
        assert!(check_user_queue(&trn1(), 33, 15).is_ok());
        assert_eq!(
            check_user_queue(&trn2(), 0, 1).unwrap_err(),
            "engine 0 does not reach host memory, so it has no user queues: on this trn2 device the engines 4-7 12-15 \
             20-23 28-31 36-39 44-47 52-55 60-63 68-71 76-79 84-87 92-95 100-103 108-111 116-119 124-131 serve \
             user queues"
        );
        assert_eq!(
            check_user_queue(&trn2(), 132, 1).unwrap_err(),
            "engine 132 out of range: this trn2 device has engines 0..131"
        );
        assert!(check_user_queue(&trn2(), 4, 1).is_ok());
        let unknown = Info { device_id: 0x1234, host_engines: [0; 3], ..trn1() };
        assert_eq!(
            check_user_queue(&unknown, 1, 1).unwrap_err(),
            "engine 1 does not reach host memory, and no engine of this device (id 0x1234) does: it has no user queues"
        );
        assert!(check_user_queue(&Info::default(), 0, 0).unwrap_err().contains("reports no engines"));
    }

    #[test]
    fn reserved_queue_is_named() {
        let dma = trn1().dmaengine_queues(4);
        let err = |e, q| format!("{:#}", queue_init_error_with(&trn1(), &dma, e, q, 4096, Error::Busy));
        let e = err(32, 0);
        assert!(e.contains("engine 32 queue 0 is reserved: the driver's own H2T queue (the MEMCPY"), "{e}");
        let e = err(33, 0);
        assert!(e.contains("engine 33 queue 0 is reserved: a host-DMA (H2T) queue"), "{e}");
        let e = err(0, 15);
        assert!(e.contains("kept for the NeuronCores"), "{e}");
        let e = err(33, 13);
        assert!(
            e.contains(
                "engine 33 queue 13 is held by the driver's in-kernel dmaengine provider (channel 2 of 4, for kernel \
                 users of DMA_MEMCPY/DMA_MEMSET such as dmatest; it holds the queues 33/15 33/14 33/13 33/12 while"
            ) && e.contains("dma_channels"),
            "{e}"
        );
        // A PCI device that sysfs does not have: the channels are unknown.
        assert_eq!(dmaengine_channels_of("ffff:ff:1f.7"), None);
        // Without dmaengine channels the same queue is some other file's.
        let e = format!("{:#}", queue_init_error_with(&trn1(), &[], 33, 13, 4096, Error::Busy));
        assert!(e.contains("engine 33 queue 13 is in use: another open file of this device holds it"), "{e}");
        let e = err(0, 1);
        assert!(
            e.starts_with("NEURON_UDMA_QUEUE_INIT engine 0 queue 1 ring 4096: busy (EBUSY): engine 0 queue 1"),
            "{e}"
        );
        assert!(
            e.ends_with(
                "pick another --queue (queues 1..3 of an engine other than the H2T engines are never reserved)"
            ),
            "{e}"
        );
        let e = format!("{:#}", queue_init_error_with(&trn1(), &dma, 0, 1, 4096, Error::InvalidArgument));
        assert!(e.starts_with("NEURON_UDMA_QUEUE_INIT engine 0 queue 1 ring 4096: "), "{e}");
    }

    #[test]
    fn queue_charge_is_the_drivers() {
        // 4096 descriptors: two 64 KiB rings, a 4 KiB block of completion slots, 8 KiB of records.
        assert_eq!(queue_charge(4096), 2 * (64 << 10) + (4 << 10) + (8 << 10));
        // The smallest ring still takes a page per ring.
        assert_eq!(queue_charge(32), 2 * 4096 + 4096 + 8192);
        assert_eq!(queue_charge(1 << 23), 2 * (128 << 20) + 4096 + 8192);
    }

    #[test]
    fn default_window_fits_locked_memory() {
        let one_queue = Pinned { buffers: 2, fixed: queue_charge(4096) };
        // Unlimited (or CAP_IPC_LOCK): the default, or --window as given.
        assert_eq!(plan_window(None, 4 << 20, None, one_queue), Ok(4 << 20));
        assert_eq!(plan_window(Some(64 << 20), 4 << 20, None, one_queue), Ok(64 << 20));
        // The usual 8 MiB: two 4 MiB buffers and the rings do not fit, two of 2 MiB do.
        assert_eq!(plan_window(None, 4 << 20, Some(8 << 20), one_queue), Ok(2 << 20));
        // MEMCPY (no queue): two 4 MiB buffers are exactly 8 MiB.
        assert_eq!(plan_window(None, 4 << 20, Some(8 << 20), Pinned { buffers: 2, fixed: 0 }), Ok(4 << 20));
        // A default that is no power of two is charged as the next one.
        assert_eq!(plan_window(None, 3 << 20, Some(8 << 20), one_queue), Ok(2 << 20));
        assert_eq!(plan_window(None, 3 << 20, Some(16 << 20), one_queue), Ok(3 << 20));
        // A small copy's window (its size) fits as it is.
        assert_eq!(plan_window(None, 8192, Some(1 << 20), one_queue), Ok(8192));
        // --window that fits is kept; one that does not is refused with what fits.
        assert_eq!(plan_window(Some(1 << 20), 4 << 20, Some(8 << 20), one_queue), Ok(1 << 20));
        let e = plan_window(Some(4 << 20), 4 << 20, Some(8 << 20), one_queue).unwrap_err();
        assert!(
            e.starts_with(
                "--window 4M needs 8.1 MiB of locked memory (2 buffer(s) of 4.0 MiB pinned and 140.0 KiB of queue \
                 rings), more than RLIMIT_MEMLOCK (soft limit 8.0 MiB, ulimit -l 8192): use --window 2M (or less)"
            ),
            "{e}"
        );
        // Too little for the smallest window: the limit, the size needed, the flags.
        let e = plan_window(None, 4 << 20, Some(256 << 10), one_queue).unwrap_err();
        assert_eq!(
            e,
            "the smallest window (64K) needs 268.0 KiB of locked memory (2 buffer(s) of 64.0 KiB pinned and 140.0 \
             KiB of queue rings), more than RLIMIT_MEMLOCK (soft limit 256.0 KiB, ulimit -l 256): raise the limit \
             (ulimit -l, /etc/security/limits.d, LimitMEMLOCK= of a systemd unit) or run with CAP_IPC_LOCK (to at \
             least ulimit -l 268); --window sets the window"
        );
        let e = plan_window(Some(64 << 10), 4 << 20, Some(256 << 10), one_queue).unwrap_err();
        assert!(e.ends_with("even --window 64K does not fit"), "{e}");
    }

    #[test]
    fn windows_have_a_minimum() {
        assert_eq!(parse_window("64K"), Ok(64 << 10));
        assert_eq!(parse_window("4M"), Ok(4 << 20));
        let e = parse_window("3").unwrap_err();
        assert!(e.contains("3 bytes is below the minimum of 64K"), "{e}");
        assert!(parse_window("65535").is_err());
        assert!(parse_window("x").unwrap_err().contains("bad size"));
    }

    #[test]
    fn enomem_names_the_memlock_limit() {
        let m = memlock_text(Some(8 << 20), false, &Remedy::Window);
        assert!(m.contains("RLIMIT_MEMLOCK (soft limit 8.0 MiB, ulimit -l 8192) was likely exceeded"), "{m}");
        assert!(
            m.contains("use --window SIZE (e.g. --window 2M)") && m.ends_with("or raise the limit (ulimit -l)"),
            "{m}"
        );
        let m = memlock_text(Some(64 << 10), false, &Remedy::Window);
        assert!(m.ends_with("raise the limit (ulimit -l): it is too low even for the smallest --window (64K)"), "{m}");
        assert!(memlock_text(Some(8 << 20), false, &Remedy::Sizes).contains("smaller --sizes"));
        assert!(memlock_text(None, false, &Remedy::Window).contains("unlimited"));
        assert!(memlock_text(Some(8 << 20), true, &Remedy::Window).contains("CAP_IPC_LOCK"));
        let r: neuron_udma::Result<()> = Err(Error::OutOfMemory);
        let e = or_memlock(r, "NEURON_UDMA_MEM_IMPORT of 64.0 MiB", Remedy::Window).unwrap_err().to_string();
        assert!(e.starts_with("NEURON_UDMA_MEM_IMPORT of 64.0 MiB: out of memory (ENOMEM)"), "{e}");
        let r: neuron_udma::Result<()> = Err(Error::Fault);
        let e = format!("{:#}", or_memlock(r, "import", Remedy::Window).unwrap_err());
        assert_eq!(e, "import: bad address (EFAULT)");
    }
}
