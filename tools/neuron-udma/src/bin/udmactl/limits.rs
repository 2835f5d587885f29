// SPDX-License-Identifier: GPL-2.0
//! Errors that name the limit: engine and queue arguments checked against INFO, the smallest
//! `--window`, and ENOMEM explained by `RLIMIT_MEMLOCK`.

use std::fmt::Display;

use anyhow::{anyhow, Result};
use neuron_udma::{Error, Info};

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

/// The error of a `QUEUE_INIT` of (`engine`, `queue`) that failed with `e`; for a queue the
/// driver keeps for itself (`EBUSY`), which one and what it is kept for.
pub fn queue_init_error(info: &Info, engine: u32, queue: u32, ring: u32, e: Error) -> anyhow::Error {
    let what = format!("NEURON_UDMA_QUEUE_INIT engine {engine} queue {queue} ring {ring}");
    match e {
        Error::Busy if info.is_reserved_queue(engine, queue) => {
            let why = if info.h2t_queues().contains(&(engine, queue)) {
                "the driver's own H2T queue (MEMCPY, dmaengine)"
            } else {
                "kept for the NeuronCores and collectives"
            };
            anyhow!(
                "{what}: engine {engine} queue {queue} is reserved, {why}: pick another --queue (1..3 are never \
                 reserved)"
            )
        }
        Error::OutOfMemory => anyhow!("{what}: {}", memlock_message(&Remedy::Window)),
        e => anyhow::Error::new(e).context(what),
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

/// Whether this process has `CAP_IPC_LOCK` (effective), which exempts it from `RLIMIT_MEMLOCK`.
pub fn has_cap_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    std::fs::read_to_string("/proc/self/status").ok().is_some_and(|s| {
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
        let e = queue_init_error(&trn1(), 32, 0, 4096, Error::Busy).to_string();
        assert!(e.contains("engine 32 queue 0 is reserved, the driver's own H2T queue"), "{e}");
        let e = queue_init_error(&trn1(), 0, 15, 4096, Error::Busy).to_string();
        assert!(e.contains("kept for the NeuronCores"), "{e}");
        let e = format!("{:#}", queue_init_error(&trn1(), 0, 1, 4096, Error::Busy));
        assert!(e.starts_with("NEURON_UDMA_QUEUE_INIT engine 0 queue 1 ring 4096: busy"), "{e}");
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
