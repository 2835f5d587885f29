// SPDX-License-Identifier: MIT OR Apache-2.0
//! `udmactl top`: the driver's usage counters per device (sysfs) and per process holding a
//! device open (fdinfo), refreshed every `--interval`.
//!
//! Devices are the driver's misc devices (`/sys/class/misc/neuron_udma*`) and nodes
//! (`/dev/neuron_udma*`), or the one `--device`, plus the PCI devices bound to the driver
//! without a node. A node's PCI device is its sysfs `device` link where the misc device has
//! one (it has no parent today), otherwise the `neuron_udma-device` line of the fdinfo of a
//! read-only open of the node, otherwise that of a process's file of the node.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use neuron_udma::usage::{self, ProcessScan, ScanOptions};
use neuron_udma::{Device, DeviceUsage, FileUsage};
use serde::Serialize;

use crate::json::DeviceUsageJson;
use crate::{error_text, human_bytes, nodes};

/// The driver's misc devices in sysfs.
const MISC_DIR: &str = "/sys/class/misc";
/// The PCI devices bound to the driver.
const DRIVER_DIR: &str = "/sys/bus/pci/drivers/neuron_udma";

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Seconds between refreshes (fractions allowed).
    #[arg(long, value_name = "SECS", default_value_t = 2.0, value_parser = parse_interval)]
    interval: f64,
    /// Print one report and exit (no copy rates: they need two).
    #[arg(long)]
    once: bool,
    /// Print one JSON object per refresh, one line each: "devices" (per device "device",
    /// "pci_device", "usage" (the sysfs counters by file name) or null and "usage_error", and
    /// "processes"), "unreadable_processes" and "interval_seconds".
    #[arg(long)]
    json: bool,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.1..=86400.0).contains(&v) => Ok(v),
        _ => Err(format!("bad interval {s:?}: seconds from 0.1 to 86400")),
    }
}

/// One process's files of one device: a row of the table.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Row {
    pub pid: u32,
    pub command: String,
    /// The descriptors (duplicates of one open file included).
    pub fds: Vec<u32>,
    /// Distinct open files (descriptors of one file counted once where kcmp(2) can tell).
    pub files: usize,
    pub buffers: u64,
    pub host_bytes: u64,
    pub device_bytes: u64,
    pub imported_bytes: u64,
    pub memlock_bytes: u64,
    pub queues: u64,
    pub copy_bytes: u64,
    /// Bytes copied per second since the last refresh; null on the first one, or when the
    /// process closed a file since (the sum went down).
    pub copy_bytes_per_second: Option<f64>,
    pub fences_completed: u64,
    pub fences_failed: u64,
}

impl Row {
    fn new(pid: u32, command: &str, fds: Vec<u32>, files: usize, u: &FileUsage) -> Self {
        Row {
            pid,
            command: command.to_string(),
            fds,
            files,
            buffers: u.buffers,
            host_bytes: u.host_bytes,
            device_bytes: u.device_bytes,
            imported_bytes: u.imported_bytes,
            memlock_bytes: u.memlock_bytes,
            queues: u.queues,
            copy_bytes: u.copy_bytes,
            copy_bytes_per_second: None,
            fences_completed: u.fences_completed,
            fences_failed: u.fences_failed,
        }
    }
}

/// One device of a report.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct DeviceReport {
    /// The node (`/dev/neuron_udma0`), null for a bound PCI device without one.
    pub device: Option<String>,
    /// The PCI device, null if it could not be found (see usage_error).
    pub pci_device: Option<String>,
    pub usage: Option<DeviceUsageJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_error: Option<String>,
    pub processes: Vec<Row>,
}

/// One refresh.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Report {
    pub devices: Vec<DeviceReport>,
    /// Processes whose descriptors could not be read: they may hold devices open.
    pub unreadable_processes: usize,
    /// Seconds since the previous refresh (what the rates are over), null on the first.
    pub interval_seconds: Option<f64>,
}

/// The copy bytes of each (pid, PCI device) row of a report.
type CopyBytes = HashMap<(u32, String), u64>;

/// A device node found in /dev or /sys/class/misc.
#[derive(Debug, Default)]
struct Node {
    path: PathBuf,
    rdev: Option<u64>,
    pci: Option<String>,
    /// Why `pci` is unknown.
    problem: Option<String>,
}

/// The `neuron_udma*` names of a directory.
fn names_in(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    rd.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with(usage::NODE_PREFIX)).collect()
}

/// The PCI device name at the end of a sysfs link (`.../0000:00:03.0`), if it looks like one.
fn pci_name_of_link(link: &Path) -> Option<String> {
    let target = std::fs::canonicalize(link).ok()?;
    let name = target.file_name()?.to_str()?;
    (name.contains(':') && name.contains('.') && target.join(usage::SYSFS_GROUP).exists()).then(|| name.to_string())
}

/// The nodes to report: `--device`, or every misc device and node of the driver.
fn find_nodes(device: Option<&Path>) -> Vec<Node> {
    let paths: Vec<PathBuf> = match device {
        Some(d) => vec![d.to_path_buf()],
        None => {
            let mut names = names_in(Path::new(MISC_DIR));
            for n in names_in(Path::new(nodes::DEV_DIR)) {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
            nodes::sort_nodes(names).into_iter().map(|n| Path::new(nodes::DEV_DIR).join(n)).collect()
        }
    };
    paths
        .into_iter()
        .map(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            let misc = Path::new(MISC_DIR).join(&name);
            let rdev = std::fs::metadata(&path)
                .ok()
                .filter(|m| m.file_type().is_char_device())
                .map(|m| m.rdev())
                .or_else(|| usage::parse_dev_t(&std::fs::read_to_string(misc.join("dev")).ok()?));
            let mut node = Node { path, rdev, ..Default::default() };
            node.pci = pci_name_of_link(&misc.join("device"));
            if node.pci.is_none() {
                // The file is closed again before the processes are scanned.
                match Device::open_read_only(&node.path) {
                    Ok(dev) => match dev.usage() {
                        Ok(u) => node.pci = Some(u.device),
                        Err(e) => node.problem = Some(error_text(&e)),
                    },
                    Err(e) => node.problem = Some(nodes::open_error_message(&node.path, e.errno(), true)),
                }
            }
            node
        })
        .collect()
}

/// The PCI devices bound to the driver.
fn bound_pci_devices() -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(DRIVER_DIR) else { return Vec::new() };
    let mut v: Vec<String> = rd
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains(':') && n.contains('.'))
        .collect();
    v.sort();
    v
}

/// Builds a report from what was found: the nodes, the bound PCI devices (unless `only` a node
/// was asked for), the processes' files, and the device counters (`read_usage`).
fn build_report(
    nodes: Vec<Node>,
    bound: Vec<String>,
    scan: &ProcessScan,
    only: bool,
    read_usage: &dyn Fn(&str) -> Result<DeviceUsage, String>,
) -> Report {
    let mut devs: Vec<(Node, Vec<Row>)> = nodes.into_iter().map(|n| (n, Vec::new())).collect();
    // A node whose PCI device we could not learn ourselves: a process's file of it says it.
    for (node, _) in devs.iter_mut().filter(|(n, _)| n.pci.is_none()) {
        let file = scan.processes.iter().flat_map(|p| &p.files).find(|f| f.target == node.path);
        if let Some(f) = file {
            node.pci = Some(f.usage.device.clone());
        }
    }
    if !only {
        for pci in bound {
            if !devs.iter().any(|(n, _)| n.pci.as_deref() == Some(&pci)) {
                devs.push((Node { pci: Some(pci), ..Default::default() }, Vec::new()));
            }
        }
    }
    for p in &scan.processes {
        for pci in p.devices() {
            let at = match devs.iter().position(|(n, _)| n.pci.as_deref() == Some(pci)) {
                Some(i) => i,
                None if only => continue,
                None => {
                    // A device of no node we know (a node of another name, or unbound).
                    let target = p.files.iter().find(|f| f.usage.device == pci).map(|f| f.target.clone());
                    devs.push((
                        Node { path: target.unwrap_or_default(), pci: Some(pci.to_string()), ..Default::default() },
                        Vec::new(),
                    ));
                    devs.len() - 1
                }
            };
            let (sum, files) = p.totals(pci);
            let fds = p.files.iter().filter(|f| f.usage.device == pci).map(|f| f.fd).collect();
            devs[at].1.push(Row::new(p.pid, &p.command, fds, files, &sum));
        }
    }
    let devices = devs
        .into_iter()
        .map(|(node, processes)| {
            let usage = match &node.pci {
                Some(pci) => read_usage(pci),
                None => Err(node.problem.clone().unwrap_or_else(|| "its PCI device is unknown".into())),
            };
            let path = node.path.display().to_string();
            DeviceReport {
                device: (!path.is_empty()).then_some(path),
                pci_device: node.pci,
                usage: usage.as_ref().ok().map(Into::into),
                usage_error: usage.err(),
                processes,
            }
        })
        .collect();
    Report { devices, unreadable_processes: scan.unreadable.len(), interval_seconds: None }
}

/// How many devices of `report` have no counters shown: a PCI device whose counters could not
/// be read, or a node whose PCI device is unknown while no device without a node (whose
/// counters may be the node's: a node a user may not open) is shown either.
fn failed_devices(report: &Report) -> usize {
    let nodeless = report.devices.iter().any(|d| d.device.is_none() && d.usage.is_some());
    report.devices.iter().filter(|d| d.usage.is_none() && (d.pci_device.is_some() || !nodeless)).count()
}

/// The copy rates of `report` against the previous refresh's copy bytes.
fn add_rates(report: &mut Report, prev: &CopyBytes, secs: Option<f64>) {
    report.interval_seconds = secs;
    for d in &mut report.devices {
        let pci = d.pci_device.clone().unwrap_or_default();
        for r in &mut d.processes {
            r.copy_bytes_per_second = match (secs, prev.get(&(r.pid, pci.clone()))) {
                (Some(s), Some(&before)) if s > 0.0 && r.copy_bytes >= before => {
                    Some((r.copy_bytes - before) as f64 / s)
                }
                _ => None,
            };
        }
    }
}

fn copy_bytes_by_row(report: &Report) -> CopyBytes {
    let mut m = HashMap::new();
    for d in &report.devices {
        for r in &d.processes {
            m.insert((r.pid, d.pci_device.clone().unwrap_or_default()), r.copy_bytes);
        }
    }
    m
}

fn human_rate(r: Option<f64>) -> String {
    match r {
        None => "-".into(),
        Some(r) if r <= 0.0 => "0 B/s".into(),
        Some(r) if r >= 1e9 => format!("{:.2} GB/s", r / 1e9),
        Some(r) if r >= 1e6 => format!("{:.2} MB/s", r / 1e6),
        Some(r) if r >= 1e3 => format!("{:.2} kB/s", r / 1e3),
        Some(r) => format!("{r:.0} B/s"),
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The text of one report.
pub fn render_text(r: &Report, interval: Option<f64>) -> String {
    let mut out = String::new();
    let procs: std::collections::HashSet<u32> =
        r.devices.iter().flat_map(|d| d.processes.iter().map(|p| p.pid)).collect();
    let every = match interval {
        Some(s) => format!("; every {s} s, Ctrl-C quits"),
        None => String::new(),
    };
    out += &format!(
        "neuron_udma usage: {}, {} with device files open{every}\n",
        plural(r.devices.len(), "device", "devices"),
        plural(procs.len(), "process", "processes")
    );
    for d in &r.devices {
        out += "\n";
        let node = d.device.as_deref().unwrap_or("(no node)");
        let pci = d.pci_device.as_deref().unwrap_or("PCI device unknown");
        let h = human_bytes;
        match (&d.usage, &d.usage_error) {
            (Some(u), _) => {
                out += &format!(
                    "{node}  {pci}  host {} (peak {})  device {} of {} (peak {})  imported {} (peak {})\n",
                    h(u.mem_host_bytes),
                    h(u.mem_host_peak_bytes),
                    h(u.mem_device_bytes),
                    h(u.mem_device_total_bytes),
                    h(u.mem_device_peak_bytes),
                    h(u.mem_imported_bytes),
                    h(u.mem_imported_peak_bytes)
                )
            }
            (None, e) => out += &format!("{node}  {pci}  counters not available: {}\n", e.as_deref().unwrap_or("?")),
        }
        if d.processes.is_empty() {
            out += "  no process has it open\n";
            continue;
        }
        out += &format!(
            "  {:>7} {:<16} {:>5} {:>7} {:>10} {:>10} {:>10} {:>10} {:>6} {:>10} {:>10} {:>8} {:>6}\n",
            "PID",
            "COMMAND",
            "FILES",
            "BUFFERS",
            "HOST",
            "DEVICE",
            "IMPORTED",
            "MEMLOCK",
            "QUEUES",
            "COPIED",
            "COPY RATE",
            "FENCES",
            "FAILED"
        );
        for p in &d.processes {
            out += &format!(
                "  {:>7} {:<16} {:>5} {:>7} {:>10} {:>10} {:>10} {:>10} {:>6} {:>10} {:>10} {:>8} {:>6}\n",
                p.pid,
                p.command,
                p.files,
                p.buffers,
                h(p.host_bytes),
                h(p.device_bytes),
                h(p.imported_bytes),
                h(p.memlock_bytes),
                p.queues,
                h(p.copy_bytes),
                human_rate(p.copy_bytes_per_second),
                p.fences_completed,
                p.fences_failed
            );
        }
    }
    if r.unreadable_processes > 0 {
        out += &format!(
            "\n{} not readable (another user's: they may hold devices open; root sees every process)\n",
            plural(r.unreadable_processes, "process", "processes")
        );
    }
    out
}

/// One refresh: find the devices, scan the processes, read the counters.
fn collect(device: Option<&Path>) -> Result<Report> {
    let nodes = find_nodes(device);
    let bound = if device.is_some() { Vec::new() } else { bound_pci_devices() };
    let opts = ScanOptions {
        rdevs: nodes.iter().filter_map(|n| n.rdev).collect(),
        skip_pid: Some(std::process::id()),
        kcmp: true,
    };
    let scan = usage::scan_processes(Path::new("/proc"), &opts).context("cannot read /proc")?;
    let read = |pci: &str| DeviceUsage::read(pci).map_err(|e| error_text(&e));
    Ok(build_report(nodes, bound, &scan, device.is_some(), &read))
}

/// Whether stdout is a terminal that can be redrawn.
fn redraw() -> bool {
    std::io::stdout().is_terminal() && std::env::var("TERM").is_ok_and(|t| !t.is_empty() && t != "dumb")
}

/// Writes `text`; a closed pipe (`udmactl top | head`) ends the command quietly: by SIGPIPE's
/// default action (`main` restores it), or as `Ok(false)` where SIGPIPE is ignored.
fn emit(text: &str) -> Result<bool> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e).context("writing to stdout"),
    }
}

pub fn run(device: Option<&Path>, a: &TopArgs) -> Result<()> {
    let redraw = !a.json && !a.once && redraw();
    let mut prev: Option<(Instant, CopyBytes)> = None;
    let mut first = true;
    loop {
        let t = Instant::now();
        let mut report = collect(device)?;
        if first && report.devices.is_empty() {
            bail!(nodes::no_node_message(Path::new(nodes::DEV_DIR)));
        }
        let secs = prev.as_ref().map(|(at, _)| t.duration_since(*at).as_secs_f64());
        add_rates(&mut report, prev.as_ref().map(|(_, m)| m).unwrap_or(&HashMap::new()), secs);
        let text = if a.json {
            serde_json::to_string(&report)? + "\n"
        } else {
            let body = render_text(&report, (!a.once).then_some(a.interval));
            if redraw {
                format!("\x1b[H\x1b[2J{body}")
            } else if first {
                body
            } else {
                format!("\n{body}")
            }
        };
        if !emit(&text)? {
            return Ok(());
        }
        if a.once {
            let failed = failed_devices(&report);
            if failed > 0 {
                bail!("the counters of {failed} of {} devices could not be read (see above)", report.devices.len());
            }
            return Ok(());
        }
        prev = Some((t, copy_bytes_by_row(&report)));
        first = false;
        std::thread::sleep(Duration::from_secs_f64(a.interval).saturating_sub(t.elapsed()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuron_udma::usage::{OpenDeviceFile, ProcessFiles};

    fn file(fd: u32, pci: &str, host: u64, copy: u64) -> OpenDeviceFile {
        OpenDeviceFile {
            fd,
            target: PathBuf::from("/dev/neuron_udma0"),
            usage: FileUsage {
                device: pci.into(),
                buffers: 1,
                host_bytes: host,
                memlock_bytes: host,
                copy_bytes: copy,
                ..Default::default()
            },
            same_file_as: None,
        }
    }

    fn usage_ok(pci: &str) -> Result<DeviceUsage, String> {
        match pci {
            "0000:00:03.0" => {
                Ok(DeviceUsage { host_bytes: 12288, device_total_bytes: 240 << 20, ..Default::default() })
            }
            _ => Err(format!("{pci}: no neuron_udma usage counters: older driver")),
        }
    }

    fn scan() -> ProcessScan {
        ProcessScan {
            processes: vec![
                ProcessFiles {
                    pid: 42,
                    command: "runtime".into(),
                    files: vec![file(3, "0000:00:03.0", 4096, 1000), file(4, "0000:00:03.0", 8192, 0)],
                },
                ProcessFiles { pid: 43, command: "other".into(), files: vec![file(5, "0000:00:04.0", 4096, 7)] },
            ],
            unreadable: vec![1, 2],
        }
    }

    #[test]
    fn rows_per_process_and_device() {
        let nodes = vec![Node {
            path: "/dev/neuron_udma0".into(),
            rdev: None,
            pci: Some("0000:00:03.0".into()),
            problem: None,
        }];
        let r = build_report(nodes, vec!["0000:00:03.0".into(), "0000:00:05.0".into()], &scan(), false, &usage_ok);
        assert_eq!(r.unreadable_processes, 2);
        let devs: Vec<_> = r.devices.iter().map(|d| (d.device.as_deref(), d.pci_device.as_deref())).collect();
        assert_eq!(
            devs,
            [
                (Some("/dev/neuron_udma0"), Some("0000:00:03.0")),
                (None, Some("0000:00:05.0")),
                (Some("/dev/neuron_udma0"), Some("0000:00:04.0"))
            ]
        );
        let row = &r.devices[0].processes[0];
        assert_eq!((row.pid, row.files, row.buffers, row.host_bytes, row.copy_bytes), (42, 2, 2, 12288, 1000));
        assert_eq!(row.fds, [3, 4]);
        assert_eq!(r.devices[0].usage.unwrap().mem_host_bytes, 12288);
        assert!(r.devices[1].usage.is_none() && r.devices[1].usage_error.as_deref().unwrap().contains("older"));
        assert_eq!(r.devices[2].processes[0].pid, 43);
        // --device: only that node's rows.
        let nodes =
            vec![Node { path: "/dev/neuron_udma0".into(), pci: Some("0000:00:03.0".into()), ..Default::default() }];
        let r = build_report(nodes, Vec::new(), &scan(), true, &usage_ok);
        assert_eq!(r.devices.len(), 1);
        assert_eq!(r.devices[0].processes.len(), 1);
    }

    #[test]
    fn a_node_learns_its_pci_device_from_a_process() {
        let nodes =
            vec![Node { path: "/dev/neuron_udma0".into(), problem: Some("cannot open".into()), ..Default::default() }];
        let r = build_report(nodes, Vec::new(), &scan(), true, &usage_ok);
        assert_eq!(r.devices[0].pci_device.as_deref(), Some("0000:00:03.0"));
        let nodes =
            vec![Node { path: "/dev/neuron_udma9".into(), problem: Some("cannot open".into()), ..Default::default() }];
        let r = build_report(nodes, Vec::new(), &scan(), true, &usage_ok);
        assert_eq!(r.devices[0].usage_error.as_deref(), Some("cannot open"));
        assert_eq!(failed_devices(&r), 1);
    }

    #[test]
    fn what_fails_once() {
        // A node nobody could map, beside a bound PCI device without a node: shown there.
        let nodes =
            vec![Node { path: "/dev/neuron_udma9".into(), problem: Some("cannot open".into()), ..Default::default() }];
        let r = build_report(nodes, vec!["0000:00:03.0".into()], &ProcessScan::default(), false, &usage_ok);
        assert_eq!(r.devices.len(), 2);
        assert_eq!(failed_devices(&r), 0);
        // A PCI device whose counters cannot be read (an older driver).
        let r = build_report(Vec::new(), vec!["0000:00:05.0".into()], &ProcessScan::default(), false, &usage_ok);
        assert_eq!(failed_devices(&r), 1);
    }

    #[test]
    fn rates_since_the_last_refresh() {
        let nodes =
            vec![Node { path: "/dev/neuron_udma0".into(), pci: Some("0000:00:03.0".into()), ..Default::default() }];
        let mut r = build_report(nodes, Vec::new(), &scan(), true, &usage_ok);
        add_rates(&mut r, &HashMap::new(), None);
        assert_eq!(r.devices[0].processes[0].copy_bytes_per_second, None);
        let prev = HashMap::from([((42, "0000:00:03.0".to_string()), 500)]);
        add_rates(&mut r, &prev, Some(2.0));
        assert_eq!(r.devices[0].processes[0].copy_bytes_per_second, Some(250.0));
        assert_eq!(r.interval_seconds, Some(2.0));
        // A file closed since: the sum went down, no rate.
        let prev = HashMap::from([((42, "0000:00:03.0".to_string()), 5000)]);
        add_rates(&mut r, &prev, Some(2.0));
        assert_eq!(r.devices[0].processes[0].copy_bytes_per_second, None);
        assert_eq!(copy_bytes_by_row(&r)[&(42, "0000:00:03.0".to_string())], 1000);
        assert_eq!(human_rate(Some(2.5e6)), "2.50 MB/s");
        assert_eq!(human_rate(Some(0.0)), "0 B/s");
        assert_eq!(human_rate(None), "-");
    }

    #[test]
    fn text_and_json() {
        let nodes =
            vec![Node { path: "/dev/neuron_udma0".into(), pci: Some("0000:00:03.0".into()), ..Default::default() }];
        let r = build_report(nodes, vec!["0000:00:05.0".into()], &scan(), false, &usage_ok);
        let t = render_text(&r, Some(2.0));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "neuron_udma usage: 3 devices, 2 processes with device files open; every 2 s, Ctrl-C quits"
        );
        assert_eq!(
            lines[2],
            "/dev/neuron_udma0  0000:00:03.0  host 12.0 KiB (peak 0 B)  device 0 B of 240.0 MiB (peak 0 B)  imported 0 B (peak 0 B)"
        );
        assert!(lines[3].trim_start().starts_with("PID COMMAND"), "{t}");
        assert!(lines[4].contains("     42 runtime              2       2   12.0 KiB"), "{t}");
        assert!(t.contains("(no node)  0000:00:05.0  counters not available: 0000:00:05.0: no neuron_udma"), "{t}");
        assert!(t.contains("  no process has it open\n"), "{t}");
        assert!(t.ends_with(
            "2 processes not readable (another user's: they may hold devices open; root sees every process)\n"
        ));
        assert!(render_text(&r, None).lines().next().unwrap().ends_with("with device files open"));

        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["unreadable_processes"], 2);
        assert_eq!(v["interval_seconds"], serde_json::Value::Null);
        let d = &v["devices"][0];
        assert_eq!((d["device"].as_str(), d["pci_device"].as_str()), (Some("/dev/neuron_udma0"), Some("0000:00:03.0")));
        assert_eq!(d["usage"]["mem_device_total_bytes"], 240u64 << 20);
        assert!(d.get("usage_error").is_none());
        let p = &d["processes"][0];
        assert_eq!(p["pid"], 42);
        assert_eq!(p["command"], "runtime");
        assert_eq!(p["fds"], serde_json::json!([3, 4]));
        assert_eq!((p["files"].as_u64(), p["host_bytes"].as_u64()), (Some(2), Some(12288)));
        assert_eq!(p["copy_bytes_per_second"], serde_json::Value::Null);
        assert_eq!(p.as_object().unwrap().len(), 14);
        assert_eq!(v["devices"][1]["usage"], serde_json::Value::Null);
        assert!(v["devices"][1]["usage_error"].as_str().unwrap().contains("older driver"));
    }

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("0.5"), Ok(0.5));
        assert_eq!(parse_interval("2"), Ok(2.0));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("-1").is_err());
        assert!(parse_interval("nan").is_err());
        assert!(parse_interval("x").is_err());
    }
}
