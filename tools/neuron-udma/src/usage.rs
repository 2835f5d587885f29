// SPDX-License-Identifier: MIT OR Apache-2.0
//! The driver's usage counters (`Documentation/userspace-api.rst`, "Counters").
//!
//! * Per device, the sysfs group `neuron_udma/` of the PCI device
//!   (`Documentation/ABI/testing/sysfs-driver-neuron_udma`): bytes held by all files by type,
//!   their peaks, the device memory available: [`DeviceUsage`]; copies, bytes, fences, resets,
//!   aborts and the queues' memory since the device was bound: [`DeviceActivity`]. The
//!   [`metrics`](crate::metrics) module writes both in the Prometheus text format.
//! * Per open file, its `/proc/PID/fdinfo/FD` lines `neuron_udma-*`: the PCI device, buffers,
//!   bytes held by type, locked memory charged, queues, bytes copied, fences completed and
//!   failed: [`FileUsage`].
//! * [`scan_processes`] finds the open device files of every process (`/proc/*/fd`) and reads
//!   their counters, as `udmactl top` does.
//!
//! A driver older than the counters has neither: reading them is then
//! [`UsageError::NoCounters`], whose message says so.
//!
//! ```no_run
//! let dev = neuron_udma::Device::open_read_only("/dev/neuron_udma0")?;
//! let file = dev.usage()?; // this file's counters; `file.device` is the PCI device
//! let all = neuron_udma::usage::DeviceUsage::read(&file.device)?;
//! println!("{} of {} bytes of device memory in use", all.device_bytes, all.device_total_bytes);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::Device;

/// Where the PCI devices are in sysfs.
pub const PCI_DEVICES_DIR: &str = "/sys/bus/pci/devices";

/// The name of the driver's sysfs group in the PCI device's directory, and of the driver.
pub const SYSFS_GROUP: &str = "neuron_udma";

/// The prefix of the driver's fdinfo lines.
pub const FDINFO_PREFIX: &str = "neuron_udma-";

/// The prefix of the driver's device node names (`neuron_udma0`, ...).
pub const NODE_PREFIX: &str = "neuron_udma";

/// An error reading the usage counters.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UsageError {
    /// The counters do not exist: the driver is older than them, or the file or PCI device is
    /// not the driver's. `reason` says which, as far as it can be told.
    #[error("{what}: no neuron_udma usage counters: {reason}")]
    NoCounters {
        /// What was read (a path).
        what: String,
        /// Why there are none.
        reason: String,
    },
    /// A file could not be read.
    #[error("cannot read {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error of the read.
        #[source]
        source: io::Error,
    },
    /// The counters are there but not as documented (a driver of another version?).
    #[error("{what}: {problem}")]
    Malformed {
        /// What was read (a path).
        what: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl UsageError {
    /// True for [`UsageError::NoCounters`]: the driver has no counters for this file or device.
    pub fn is_no_counters(&self) -> bool {
        matches!(self, UsageError::NoCounters { .. })
    }

    fn io(path: &Path, source: io::Error) -> Self {
        UsageError::Io { path: path.to_path_buf(), source }
    }
}

/// What `reason` says of a driver without counters.
const OLDER_DRIVER: &str = "the neuron_udma driver is older than its usage counters \
                            (Documentation/userspace-api.rst, \"Counters\")";

/// The counters of one device, from the sysfs group `neuron_udma/` of its PCI device: bytes
/// held now by the buffers of every open file, by type, the largest value each had since the
/// device was bound, and the device memory available to device buffers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceUsage {
    /// `mem_host_bytes`: host buffers (`MEM_ALLOC` host, sizes rounded up to 4 KiB).
    pub host_bytes: u64,
    /// `mem_device_bytes`: device buffers (HBM).
    pub device_bytes: u64,
    /// `mem_imported_bytes`: imports (`MEM_IMPORT`).
    pub imported_bytes: u64,
    /// `mem_host_peak_bytes`.
    pub host_peak_bytes: u64,
    /// `mem_device_peak_bytes`.
    pub device_peak_bytes: u64,
    /// `mem_imported_peak_bytes`.
    pub imported_peak_bytes: u64,
    /// `mem_device_total_bytes`: device memory available to device buffers (INFO's
    /// `device_mem_size`).
    pub device_total_bytes: u64,
    /// `mem_device_stranded_bytes`: of that, bytes kept reserved for dma-buf exports of an
    /// earlier binding that a pinned importer may still reach (0 from a driver without the file).
    pub device_stranded_bytes: u64,
}

impl DeviceUsage {
    /// The files of the sysfs group, in the order of the fields.
    pub const FILES: [&'static str; 7] = [
        "mem_host_bytes",
        "mem_device_bytes",
        "mem_imported_bytes",
        "mem_host_peak_bytes",
        "mem_device_peak_bytes",
        "mem_imported_peak_bytes",
        "mem_device_total_bytes",
    ];

    /// The file of [`Self::device_stranded_bytes`], read apart from [`Self::FILES`]: drivers
    /// before it lack it.
    pub const STRANDED_FILE: &'static str = "mem_device_stranded_bytes";

    /// Reads the counters of the PCI device `pci_name` (e.g. `0000:00:03.0`, what
    /// [`FileUsage::device`] holds) from `/sys/bus/pci/devices/<pci_name>/neuron_udma/`.
    pub fn read(pci_name: &str) -> Result<Self, UsageError> {
        Self::read_from(&Path::new(PCI_DEVICES_DIR).join(pci_name))
    }

    /// Reads the counters of the PCI device whose sysfs directory is `pci_dir`. Without the
    /// group: [`UsageError::NoCounters`], saying whether no driver, another driver or an older
    /// neuron_udma driver is bound.
    pub fn read_from(pci_dir: &Path) -> Result<Self, UsageError> {
        let group = group_of(pci_dir)?;
        let v = read_counters(&group, Self::FILES)?;
        let [host_bytes, device_bytes, imported_bytes, host_peak_bytes, device_peak_bytes, imported_peak_bytes, device_total_bytes] =
            v;
        // Newer than the others: a driver of the same ABI may not have it.
        let device_stranded_bytes = match read_counters(&group, [Self::STRANDED_FILE]) {
            Ok([n]) => n,
            Err(UsageError::Io { ref source, .. }) if source.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(DeviceUsage {
            host_bytes,
            device_bytes,
            imported_bytes,
            host_peak_bytes,
            device_peak_bytes,
            imported_peak_bytes,
            device_total_bytes,
            device_stranded_bytes,
        })
    }
}

/// The activity of one device since it was bound, from the sysfs group `neuron_udma/` of its PCI
/// device: monotonic counters (a file's close takes nothing back) and the memory of the queues in
/// use. `Documentation/ABI/testing/sysfs-driver-neuron_udma` defines each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceActivity {
    /// `copies`: copies user space submitted (COPY_PREPARE entries, COPY_PREPARE_ONE,
    /// URING_COPY entries, MEMCPY, MEMSET).
    pub copies: u64,
    /// `copy_bytes`: their bytes.
    pub copy_bytes: u64,
    /// `fences_completed`: fences retired as done, on every queue (the driver's included).
    pub fences_completed: u64,
    /// `fences_failed`: fences a queue reset failed (EIO, ETIMEDOUT).
    pub fences_failed: u64,
    /// `queue_resets_engine_error`: queue resets for an engine error.
    pub queue_resets_engine_error: u64,
    /// `queue_resets_timeout`: queue resets for a timeout or stall.
    pub queue_resets_timeout: u64,
    /// `queue_resets_other`: queue resets for another cause (a dmaengine client's terminate,
    /// the drain of a revoked dma-buf import).
    pub queue_resets_other: u64,
    /// `engine_aborts`: engine aborts a queue found.
    pub engine_aborts: u64,
    /// `ring_host_bytes`: host memory of the queues in use, bytes (a gauge).
    pub ring_host_bytes: u64,
    /// `ring_device_bytes`: device memory of rings in device memory in use, bytes (a gauge).
    pub ring_device_bytes: u64,
    /// `queue_resets_device`: queue resets for a device reset (every queue in use when it began).
    pub queue_resets_device: u64,
    /// `device_resets`: device resets (function-level resets, PCI error recoveries).
    pub device_resets: u64,
}

impl DeviceActivity {
    /// The files of the sysfs group, in the order of the fields.
    pub const FILES: [&'static str; 12] = [
        "copies",
        "copy_bytes",
        "fences_completed",
        "fences_failed",
        "queue_resets_engine_error",
        "queue_resets_timeout",
        "queue_resets_other",
        "engine_aborts",
        "ring_host_bytes",
        "ring_device_bytes",
        "queue_resets_device",
        "device_resets",
    ];

    /// Reads the activity of the PCI device `pci_name` (e.g. `0000:00:03.0`).
    pub fn read(pci_name: &str) -> Result<Self, UsageError> {
        Self::read_from(&Path::new(PCI_DEVICES_DIR).join(pci_name))
    }

    /// Reads the activity of the PCI device whose sysfs directory is `pci_dir`. A driver
    /// older than these counters: [`UsageError::NoCounters`].
    pub fn read_from(pci_dir: &Path) -> Result<Self, UsageError> {
        // Without the group at all, the same error as the memory counters'.
        let group = group_of(pci_dir)?;
        if !group.join(Self::FILES[0]).exists() {
            return Err(UsageError::NoCounters {
                what: group.join(Self::FILES[0]).display().to_string(),
                reason: "the neuron_udma driver is older than its activity counters".into(),
            });
        }
        let [copies, copy_bytes, fences_completed, fences_failed, queue_resets_engine_error, queue_resets_timeout, queue_resets_other, engine_aborts, ring_host_bytes, ring_device_bytes, queue_resets_device, device_resets] =
            read_counters(&group, Self::FILES)?;
        Ok(DeviceActivity {
            copies,
            copy_bytes,
            fences_completed,
            fences_failed,
            queue_resets_engine_error,
            queue_resets_timeout,
            queue_resets_other,
            engine_aborts,
            ring_host_bytes,
            ring_device_bytes,
            queue_resets_device,
            device_resets,
        })
    }
}

/// The driver's sysfs group of the PCI device whose directory is `pci_dir`. Without it:
/// [`UsageError::NoCounters`], saying whether no driver, another driver or an older
/// neuron_udma driver is bound.
fn group_of(pci_dir: &Path) -> Result<PathBuf, UsageError> {
    let group = pci_dir.join(SYSFS_GROUP);
    match std::fs::metadata(&group) {
        Ok(_) => Ok(group),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::metadata(pci_dir).map_err(|e| UsageError::io(pci_dir, e))?;
            Err(UsageError::NoCounters { what: group.display().to_string(), reason: why_no_group(pci_dir) })
        }
        Err(e) => Err(UsageError::io(&group, e)),
    }
}

/// The counters `files` of the sysfs group directory `group`, in that order.
fn read_counters<const N: usize>(group: &Path, files: [&str; N]) -> Result<[u64; N], UsageError> {
    let mut v = [0u64; N];
    for (slot, name) in v.iter_mut().zip(files) {
        let path = group.join(name);
        let text = std::fs::read_to_string(&path).map_err(|e| UsageError::io(&path, e))?;
        *slot = parse_counter(&text).ok_or_else(|| UsageError::Malformed {
            what: path.display().to_string(),
            problem: format!("not a number: {:?}", text.trim_end()),
        })?;
    }
    Ok(v)
}

/// Why a PCI device has no `neuron_udma/` group: no driver, another driver, or an older one.
fn why_no_group(pci_dir: &Path) -> String {
    match std::fs::read_link(pci_dir.join("driver")) {
        Err(_) => "no driver is bound to this PCI device".into(),
        Ok(link) => match link.file_name().and_then(|n| n.to_str()) {
            Some(SYSFS_GROUP) | None => OLDER_DRIVER.into(),
            Some(other) => format!("the PCI device is bound to the driver {other}, not {SYSFS_GROUP}"),
        },
    }
}

/// One sysfs counter: a decimal number and a newline.
fn parse_counter(text: &str) -> Option<u64> {
    text.trim_end_matches('\n').parse().ok()
}

/// The counters of one open device file, from its `fdinfo`: what the file holds now and what
/// it did since it was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileUsage {
    /// `neuron_udma-device`: the PCI device of the file (e.g. `0000:00:03.0`; its sysfs
    /// directory is `/sys/bus/pci/devices/<device>`).
    pub device: String,
    /// `neuron_udma-buffers`: live buffers (allocated and imported).
    pub buffers: u64,
    /// `neuron_udma-host-bytes`: host buffers' sizes.
    pub host_bytes: u64,
    /// `neuron_udma-device-bytes`: device buffers' sizes.
    pub device_bytes: u64,
    /// `neuron_udma-imported-bytes`: imports' sizes.
    pub imported_bytes: u64,
    /// `neuron_udma-memlock-bytes`: charged to `RLIMIT_MEMLOCK` (host buffers, a power of two
    /// each; imported pages; queue memory).
    pub memlock_bytes: u64,
    /// `neuron_udma-queues`: queues taken.
    pub queues: u64,
    /// `neuron_udma-copy-bytes`: bytes of the copies prepared and of the `MEMCPY`/`MEMSET`
    /// calls that succeeded.
    pub copy_bytes: u64,
    /// `neuron_udma-fences-completed`: fences completed, on every queue the file had.
    pub fences_completed: u64,
    /// `neuron_udma-fences-failed`: fences dropped by an engine error or a reset.
    pub fences_failed: u64,
}

/// The numeric fdinfo keys (after [`FDINFO_PREFIX`]), in the order of the fields.
const FILE_KEYS: [&str; 9] = [
    "buffers",
    "host-bytes",
    "device-bytes",
    "imported-bytes",
    "memlock-bytes",
    "queues",
    "copy-bytes",
    "fences-completed",
    "fences-failed",
];

impl FileUsage {
    /// Parses the text of an fdinfo file (`what` names it in errors). Lines of other kinds
    /// (`pos:`, `flags:`, ...) and `neuron_udma-*` keys this library does not know are ignored;
    /// a text without any `neuron_udma-` line is [`UsageError::NoCounters`] (an older driver,
    /// or not a neuron_udma file), one that lacks a documented key or has a value that is not a
    /// number is [`UsageError::Malformed`].
    pub fn parse(what: &str, text: &str) -> Result<Self, UsageError> {
        let mut device = None;
        let mut vals: [Option<u64>; 9] = [None; 9];
        let mut any = false;
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(FDINFO_PREFIX) else { continue };
            any = true;
            let Some((key, value)) = rest.split_once(':') else { continue };
            let value = value.trim();
            if key == "device" {
                device = Some(value.to_string());
            } else if let Some(i) = FILE_KEYS.iter().position(|&k| k == key) {
                vals[i] = Some(value.parse().map_err(|_| UsageError::Malformed {
                    what: what.into(),
                    problem: format!("{FDINFO_PREFIX}{key}: not a number: {value:?}"),
                })?);
            }
        }
        if !any {
            return Err(UsageError::NoCounters {
                what: what.into(),
                reason: format!("no {FDINFO_PREFIX}* lines: not a neuron_udma file, or {OLDER_DRIVER}"),
            });
        }
        let missing = |key: &str| UsageError::Malformed {
            what: what.into(),
            problem: format!("no {FDINFO_PREFIX}{key} line (a driver of another version?)"),
        };
        let device = device.filter(|d| !d.is_empty()).ok_or_else(|| missing("device"))?;
        let mut v = [0u64; 9];
        for (i, slot) in v.iter_mut().enumerate() {
            *slot = vals[i].ok_or_else(|| missing(FILE_KEYS[i]))?;
        }
        let [buffers, host_bytes, device_bytes, imported_bytes, memlock_bytes, queues, copy_bytes, fences_completed, fences_failed] =
            v;
        Ok(FileUsage {
            device,
            buffers,
            host_bytes,
            device_bytes,
            imported_bytes,
            memlock_bytes,
            queues,
            copy_bytes,
            fences_completed,
            fences_failed,
        })
    }

    /// Reads `/proc/<pid>/fdinfo/<fd>`.
    pub fn read(pid: u32, fd: u32) -> Result<Self, UsageError> {
        Self::read_path(&PathBuf::from(format!("/proc/{pid}/fdinfo/{fd}")))
    }

    /// Reads the counters of a file of this process (`/proc/self/fdinfo/<fd>`).
    pub fn of(fd: BorrowedFd<'_>) -> Result<Self, UsageError> {
        Self::read_path(&PathBuf::from(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())))
    }

    /// Reads an fdinfo file.
    pub fn read_path(path: &Path) -> Result<Self, UsageError> {
        let text = std::fs::read_to_string(path).map_err(|e| UsageError::io(path, e))?;
        Self::parse(&path.display().to_string(), &text)
    }

    /// Adds the counters of `other` (another file of the same device) to these.
    pub fn add(&mut self, other: &FileUsage) {
        self.buffers += other.buffers;
        self.host_bytes += other.host_bytes;
        self.device_bytes += other.device_bytes;
        self.imported_bytes += other.imported_bytes;
        self.memlock_bytes += other.memlock_bytes;
        self.queues += other.queues;
        self.copy_bytes += other.copy_bytes;
        self.fences_completed += other.fences_completed;
        self.fences_failed += other.fences_failed;
    }
}

impl Device {
    /// The counters of this open file (its `/proc/self/fdinfo`); [`FileUsage::device`] names
    /// the PCI device, whose counters [`Device::device_usage`] reads. Needs no ioctl, so it
    /// works on a read-only file.
    pub fn usage(&self) -> Result<FileUsage, UsageError> {
        FileUsage::of(self.as_fd())
    }

    /// The counters of this file's device (its PCI device's sysfs group).
    pub fn device_usage(&self) -> Result<DeviceUsage, UsageError> {
        DeviceUsage::read(&self.usage()?.device)
    }
}

/// One open device file of a process, found by [`scan_processes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenDeviceFile {
    /// The descriptor number.
    pub fd: u32,
    /// Where the descriptor's link points (`/dev/neuron_udma0`, as the process opened it).
    pub target: PathBuf,
    /// The file's counters.
    pub usage: FileUsage,
    /// An earlier descriptor of the same process that refers to the same open file (`dup(2)`,
    /// a received descriptor), as `kcmp(2)` tells; `None` if it is the first, or if the kernel
    /// cannot tell (no `CONFIG_KCMP`). Sums count such a descriptor once.
    pub same_file_as: Option<u32>,
}

/// A process with device files open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessFiles {
    /// The process id.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`), `?` if it could not be read.
    pub command: String,
    /// Its device files, by descriptor number.
    pub files: Vec<OpenDeviceFile>,
}

impl ProcessFiles {
    /// The distinct open files of this process on the PCI device `pci_name` (descriptors that
    /// duplicate an earlier one, as far as the kernel can tell, left out).
    pub fn distinct_files<'a>(&'a self, pci_name: &'a str) -> impl Iterator<Item = &'a OpenDeviceFile> + 'a {
        self.files.iter().filter(move |f| f.usage.device == pci_name && f.same_file_as.is_none())
    }

    /// The sum of the counters of the distinct files of this process on `pci_name`, and how
    /// many there are.
    pub fn totals(&self, pci_name: &str) -> (FileUsage, usize) {
        let mut sum = FileUsage { device: pci_name.to_string(), ..Default::default() };
        let mut n = 0;
        for f in self.distinct_files(pci_name) {
            sum.add(&f.usage);
            n += 1;
        }
        (sum, n)
    }

    /// The PCI devices this process has files of, in order of first descriptor.
    pub fn devices(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for f in &self.files {
            if !out.contains(&f.usage.device.as_str()) {
                out.push(&f.usage.device);
            }
        }
        out
    }
}

/// What [`scan_processes`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessScan {
    /// The processes with at least one device file open, by pid.
    pub processes: Vec<ProcessFiles>,
    /// The pids of the processes whose descriptors could not be read (another user's, without
    /// `CAP_SYS_PTRACE` or root): they may hold device files too. Kernel threads, which hold
    /// no files, are not among them.
    pub unreadable: Vec<u32>,
}

/// Which descriptors [`scan_processes`] reads the fdinfo of.
#[derive(Debug, Clone, Default)]
pub struct ScanOptions {
    /// Device numbers (`st_rdev`) of the driver's nodes: a descriptor whose file is a character
    /// device with one of them is a device file, whatever its path (a node of another name or
    /// in a container's `/dev`). Descriptors whose link names a `neuron_udma*` file are read
    /// in any case.
    pub rdevs: Vec<u64>,
    /// A process to leave out (the caller itself).
    pub skip_pid: Option<u32>,
    /// Ask `kcmp(2)` which descriptors of a process share an open file (only meaningful for
    /// the real `/proc`).
    pub kcmp: bool,
}

/// Finds every open device file of every process under `proc_root` (`/proc`): the descriptors
/// in `/proc/PID/fd` that link to a `neuron_udma*` node or a character device of
/// `opts.rdevs`, and whose fdinfo has the driver's counters. A process whose descriptors
/// cannot be read is listed in [`ProcessScan::unreadable`]; a process that exits while it is
/// read is left out. Fails only if `proc_root` itself cannot be read.
pub fn scan_processes(proc_root: &Path, opts: &ScanOptions) -> io::Result<ProcessScan> {
    let mut scan = ProcessScan::default();
    let mut pids: Vec<u32> = std::fs::read_dir(proc_root)?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&pid| Some(pid) != opts.skip_pid)
        .collect();
    pids.sort_unstable();
    let rdevs: HashSet<u64> = opts.rdevs.iter().copied().collect();
    for pid in pids {
        match scan_process(proc_root, pid, &rdevs, opts.kcmp) {
            Ok(Some(p)) => scan.processes.push(p),
            Ok(None) => {}
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                if !is_kernel_thread(proc_root, pid) {
                    scan.unreadable.push(pid);
                }
            }
            // Gone (ENOENT, ESRCH), or a zombie: nothing open.
            Err(_) => {}
        }
    }
    Ok(scan)
}

/// `PF_KTHREAD` in the flags of `/proc/PID/stat`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Whether `pid` is a kernel thread (its `stat`, readable by everyone, says so).
fn is_kernel_thread(proc_root: &Path, pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) else { return false };
    // "pid (comm) state ppid pgrp session tty_nr tpgid flags ...": comm may hold anything.
    let Some((_, rest)) = stat.rsplit_once(')') else { return false };
    rest.split_whitespace().nth(6).and_then(|f| f.parse::<u64>().ok()).is_some_and(|f| f & PF_KTHREAD != 0)
}

/// The device files of one process, `None` if it has none.
fn scan_process(proc_root: &Path, pid: u32, rdevs: &HashSet<u64>, kcmp: bool) -> io::Result<Option<ProcessFiles>> {
    let dir = proc_root.join(pid.to_string());
    let mut fds: Vec<u32> =
        std::fs::read_dir(dir.join("fd"))?.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    fds.sort_unstable();
    let mut files: Vec<OpenDeviceFile> = Vec::new();
    for fd in fds {
        let link = dir.join("fd").join(fd.to_string());
        let Ok(target) = std::fs::read_link(&link) else { continue };
        if !is_candidate(&link, &target, rdevs) {
            continue;
        }
        let info = dir.join("fdinfo").join(fd.to_string());
        let text = match std::fs::read_to_string(&info) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Err(e),
            Err(_) => continue, // closed meanwhile
        };
        // A node of the name without the driver's lines is not the driver's file.
        let Ok(usage) = FileUsage::parse(&info.display().to_string(), &text) else { continue };
        let same_file_as = if kcmp {
            files.iter().find(|f| f.same_file_as.is_none() && same_open_file(pid, f.fd, fd)).map(|f| f.fd)
        } else {
            None
        };
        files.push(OpenDeviceFile { fd, target, usage, same_file_as });
    }
    if files.is_empty() {
        return Ok(None);
    }
    let command = std::fs::read_to_string(dir.join("comm"))
        .map(|c| c.trim_end_matches('\n').to_string())
        .unwrap_or_else(|_| "?".into());
    Ok(Some(ProcessFiles { pid, command, files }))
}

/// Whether the descriptor at `link` (pointing to `target`) may be a device file: its target's
/// name starts with `neuron_udma`, or it is a character device of `rdevs`.
fn is_candidate(link: &Path, target: &Path, rdevs: &HashSet<u64>) -> bool {
    if target.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(NODE_PREFIX)) {
        return true;
    }
    // Sockets, pipes and anonymous inodes ("socket:[123]") are no nodes: no stat for them.
    if rdevs.is_empty() || !target.is_absolute() {
        return false;
    }
    std::fs::metadata(link).is_ok_and(|m| m.file_type().is_char_device() && rdevs.contains(&m.rdev()))
}

/// `kcmp(2)`: whether descriptors `a` and `b` of process `pid` refer to the same open file.
/// False when the kernel cannot tell (no `CONFIG_KCMP`: `ENOSYS`; not permitted).
fn same_open_file(pid: u32, a: u32, b: u32) -> bool {
    const KCMP_FILE: libc::c_long = 0;
    let pid = pid as libc::c_long;
    // SAFETY: kcmp takes five integer arguments and touches no memory of the caller for
    // KCMP_FILE.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_FILE, a as libc::c_long, b as libc::c_long) };
    r == 0
}

/// The device number (`st_rdev`) in a sysfs `dev` file ("10:123").
pub fn parse_dev_t(text: &str) -> Option<u64> {
    let (major, minor) = text.trim().split_once(':')?;
    Some(libc::makedev(major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FDINFO: &str = "pos:\t0\nflags:\t02100002\nmnt_id:\t15\nino:\t5\n\
        neuron_udma-device:\t0000:00:03.0\n\
        neuron_udma-buffers:\t3\n\
        neuron_udma-host-bytes:\t12288\n\
        neuron_udma-device-bytes:\t65536\n\
        neuron_udma-imported-bytes:\t8192\n\
        neuron_udma-memlock-bytes:\t45056\n\
        neuron_udma-queues:\t1\n\
        neuron_udma-copy-bytes:\t4306\n\
        neuron_udma-fences-completed:\t1\n\
        neuron_udma-fences-failed:\t0\n";

    fn sample() -> FileUsage {
        FileUsage {
            device: "0000:00:03.0".into(),
            buffers: 3,
            host_bytes: 12288,
            device_bytes: 65536,
            imported_bytes: 8192,
            memlock_bytes: 45056,
            queues: 1,
            copy_bytes: 4306,
            fences_completed: 1,
            fences_failed: 0,
        }
    }

    /// A fresh directory under the temporary directory, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let p = std::env::temp_dir().join(format!("neuron-udma-usage-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn parses_fdinfo() {
        assert_eq!(FileUsage::parse("x", FDINFO).unwrap(), sample());
        // Unknown keys (a newer driver) and spaces instead of the tab are fine.
        let newer = format!("{FDINFO}neuron_udma-something-new:\t7\n").replace("buffers:\t3", "buffers: 3");
        assert_eq!(FileUsage::parse("x", &newer).unwrap(), sample());
    }

    #[test]
    fn fdinfo_of_an_older_driver_says_so() {
        let e = FileUsage::parse("/proc/1/fdinfo/3", "pos:\t0\nflags:\t02\nmnt_id:\t15\nino:\t5\n").unwrap_err();
        assert!(e.is_no_counters());
        let msg = e.to_string();
        assert!(msg.starts_with("/proc/1/fdinfo/3: no neuron_udma usage counters"), "{msg}");
        assert!(msg.contains("older than its usage counters"), "{msg}");
    }

    #[test]
    fn malformed_fdinfo() {
        let e = FileUsage::parse("f", &FDINFO.replace("neuron_udma-queues:\t1\n", "")).unwrap_err();
        assert!(matches!(&e, UsageError::Malformed { .. }), "{e:?}");
        assert!(e.to_string().contains("no neuron_udma-queues line"), "{e}");
        let e = FileUsage::parse("f", &FDINFO.replace("copy-bytes:\t4306", "copy-bytes:\t-1")).unwrap_err();
        assert!(e.to_string().contains("neuron_udma-copy-bytes: not a number: \"-1\""), "{e}");
        let e = FileUsage::parse("f", &FDINFO.replace("0000:00:03.0", "")).unwrap_err();
        assert!(e.to_string().contains("no neuron_udma-device line"), "{e}");
    }

    #[test]
    fn sums_files() {
        let mut a = sample();
        a.add(&sample());
        assert_eq!((a.buffers, a.host_bytes, a.copy_bytes, a.fences_completed), (6, 24576, 8612, 2));
        assert_eq!(a.device, "0000:00:03.0");
    }

    fn write_group(pci: &Path, values: &[u64; 7]) {
        let g = pci.join(SYSFS_GROUP);
        std::fs::create_dir_all(&g).unwrap();
        for (name, v) in DeviceUsage::FILES.iter().zip(values) {
            std::fs::write(g.join(name), format!("{v}\n")).unwrap();
        }
    }

    #[test]
    fn reads_the_sysfs_group() {
        let t = TempDir::new("sysfs");
        let pci = t.0.join("0000:00:03.0");
        write_group(&pci, &[16384, 65536, 0, 32768, 1 << 20, 8192, 240 << 20]);
        let u = DeviceUsage::read_from(&pci).unwrap();
        assert_eq!(
            u,
            DeviceUsage {
                host_bytes: 16384,
                device_bytes: 65536,
                imported_bytes: 0,
                host_peak_bytes: 32768,
                device_peak_bytes: 1 << 20,
                imported_peak_bytes: 8192,
                device_total_bytes: 240 << 20,
                // A driver without the file.
                device_stranded_bytes: 0,
            }
        );
        std::fs::write(pci.join(SYSFS_GROUP).join(DeviceUsage::STRANDED_FILE), "4096\n").unwrap();
        assert_eq!(DeviceUsage::read_from(&pci).unwrap().device_stranded_bytes, 4096);
        std::fs::write(pci.join(SYSFS_GROUP).join("mem_imported_bytes"), "lots\n").unwrap();
        let e = DeviceUsage::read_from(&pci).unwrap_err().to_string();
        assert!(e.ends_with("neuron_udma/mem_imported_bytes: not a number: \"lots\""), "{e}");
        std::fs::remove_file(pci.join(SYSFS_GROUP).join("mem_imported_bytes")).unwrap();
        let e = DeviceUsage::read_from(&pci).unwrap_err();
        assert!(matches!(&e, UsageError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound), "{e:?}");
    }

    #[test]
    fn a_missing_group_says_why() {
        let t = TempDir::new("nogroup");
        let pci = t.0.join("0000:00:03.0");
        std::fs::create_dir_all(&pci).unwrap();
        let e = DeviceUsage::read_from(&pci).unwrap_err();
        assert!(e.is_no_counters());
        assert!(e.to_string().contains("no driver is bound"), "{e}");
        // Bound to neuron_udma, but no group: an older driver.
        std::os::unix::fs::symlink("../../../bus/pci/drivers/neuron_udma", pci.join("driver")).unwrap();
        let e = DeviceUsage::read_from(&pci).unwrap_err().to_string();
        assert!(e.contains("0000:00:03.0/neuron_udma: no neuron_udma usage counters"), "{e}");
        assert!(e.contains("the neuron_udma driver is older than its usage counters"), "{e}");
        std::fs::remove_file(pci.join("driver")).unwrap();
        std::os::unix::fs::symlink("../../../bus/pci/drivers/neuron", pci.join("driver")).unwrap();
        let e = DeviceUsage::read_from(&pci).unwrap_err().to_string();
        assert!(e.contains("bound to the driver neuron, not neuron_udma"), "{e}");
        // No such PCI device at all.
        let e = DeviceUsage::read_from(&t.0.join("0000:99:00.0")).unwrap_err();
        assert!(matches!(&e, UsageError::Io { .. }), "{e:?}");
    }

    #[test]
    fn dev_t() {
        assert_eq!(parse_dev_t("10:123\n"), Some(libc::makedev(10, 123)));
        assert_eq!(parse_dev_t("10"), None);
        assert_eq!(parse_dev_t("a:b"), None);
    }

    /// A fake /proc: process 10 holds neuron_udma0 on two descriptors, neuron_udma1 and a pipe;
    /// 11 holds nothing of ours, 12 a file called neuron_udma* without the driver's lines, 14
    /// is the caller. (Unreadable processes need another user: `udmactl selftest` in the guest.)
    #[test]
    fn scans_a_fake_proc() {
        let t = TempDir::new("proc");
        let p = &t.0;
        let proc_fd = |pid: u32, fd: u32, target: &str, info: Option<&str>| {
            let d = p.join(pid.to_string());
            std::fs::create_dir_all(d.join("fd")).unwrap();
            std::fs::create_dir_all(d.join("fdinfo")).unwrap();
            std::fs::write(d.join("comm"), format!("proc{pid}\n")).unwrap();
            std::os::unix::fs::symlink(target, d.join("fd").join(fd.to_string())).unwrap();
            if let Some(info) = info {
                std::fs::write(d.join("fdinfo").join(fd.to_string()), info).unwrap();
            }
        };
        proc_fd(10, 3, "/dev/neuron_udma0", Some(FDINFO));
        proc_fd(10, 1, "pipe:[77]", Some("pos:\t0\n"));
        let other = FDINFO.replace("0000:00:03.0", "0000:00:04.0").replace("buffers:\t3", "buffers:\t1");
        proc_fd(10, 7, "/dev/neuron_udma1", Some(&other));
        proc_fd(10, 9, "/dev/neuron_udma0", Some(FDINFO));
        proc_fd(11, 0, "/dev/null", Some("pos:\t0\n"));
        proc_fd(12, 4, "/tmp/neuron_udma_fake", Some("pos:\t0\n"));
        std::fs::create_dir_all(p.join("self")).unwrap();
        std::fs::create_dir_all(p.join("sys")).unwrap();
        proc_fd(14, 5, "/dev/neuron_udma0", Some(FDINFO));

        let scan = scan_processes(p, &ScanOptions { skip_pid: Some(14), ..Default::default() }).unwrap();
        assert!(scan.unreadable.is_empty());
        assert_eq!(scan.processes.len(), 1, "{scan:?}");
        let pr = &scan.processes[0];
        assert_eq!((pr.pid, pr.command.as_str()), (10, "proc10"));
        assert_eq!(pr.files.iter().map(|f| f.fd).collect::<Vec<_>>(), [3, 7, 9]);
        assert_eq!(pr.files[0].target, Path::new("/dev/neuron_udma0"));
        assert_eq!(pr.devices(), ["0000:00:03.0", "0000:00:04.0"]);
        // Without kcmp the two descriptors of neuron_udma0 count as two files.
        let (sum, n) = pr.totals("0000:00:03.0");
        assert_eq!((n, sum.buffers, sum.host_bytes), (2, 6, 24576));
        let (sum, n) = pr.totals("0000:00:04.0");
        assert_eq!((n, sum.buffers), (1, 1));
        assert_eq!(pr.totals("0000:00:05.0").1, 0);
        // Known as duplicates: counted once.
        let mut dup = pr.clone();
        dup.files[2].same_file_as = Some(3);
        assert_eq!(dup.totals("0000:00:03.0").0, sample());
        assert!(scan_processes(&p.join("missing"), &ScanOptions::default()).is_err());
    }

    #[test]
    fn kernel_threads() {
        let t = TempDir::new("kthread");
        for (pid, stat) in [
            (2, "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 0 0 0"),
            (7, "7 (a (b) c) S 1 7 7 0 -1 4194560 0 0"),
            (8, "garbage"),
        ] {
            std::fs::create_dir_all(t.0.join(pid.to_string())).unwrap();
            std::fs::write(t.0.join(pid.to_string()).join("stat"), stat).unwrap();
        }
        assert!(is_kernel_thread(&t.0, 2));
        assert!(!is_kernel_thread(&t.0, 7));
        assert!(!is_kernel_thread(&t.0, 8));
        assert!(!is_kernel_thread(&t.0, 9));
        // The real kthreadd, where this machine has one as pid 2.
        if std::fs::read_to_string("/proc/2/comm").is_ok_and(|c| c.trim() == "kthreadd") {
            assert!(is_kernel_thread(Path::new("/proc"), 2));
        }
        assert!(!is_kernel_thread(Path::new("/proc"), std::process::id()));
    }

    #[test]
    fn our_own_descriptors() {
        // This process has no device file; kcmp of stdin with itself is "same" where the
        // kernel has kcmp, and false (not an error) where it has not.
        let scan = scan_processes(Path::new("/proc"), &ScanOptions { kcmp: true, ..Default::default() }).unwrap();
        assert!(scan.processes.iter().all(|p| p.pid != std::process::id()));
        let _ = same_open_file(std::process::id(), 0, 0);
        let null = std::fs::File::open("/dev/null").unwrap();
        let e = FileUsage::of(null.as_fd()).unwrap_err();
        assert!(e.is_no_counters(), "{e:?}");
    }
}
