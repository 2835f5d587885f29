// SPDX-License-Identifier: MIT OR Apache-2.0
//! `udmactl metrics`: every device's counters in the Prometheus text format
//! ([`neuron_udma::metrics`]), to stdout or to a file for node_exporter's textfile collector.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use neuron_udma::metrics::{prometheus_text, DeviceMetrics};
use neuron_udma::usage::NODE_PREFIX;
use neuron_udma::{Device, DeviceActivity, DeviceUsage};

use crate::{error_text, nodes};

#[derive(Args, Debug)]
pub struct MetricsArgs {
    /// Write to this file instead of stdout: written to a temporary file in the same directory
    /// and renamed over it, so a collector never reads half a file (node_exporter's textfile
    /// collector reads `*.prom` files of its --collector.textfile.directory). An existing FILE
    /// must be a regular file. Every node is read (-d: only that one); the nodes need not be
    /// readable by the caller (sysfs maps them to their PCI devices).
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The directory searched for neuron_udma* nodes (tests point it elsewhere).
    #[arg(long, hide = true, default_value = nodes::DEV_DIR)]
    pub dev_dir: PathBuf,
}

/// N of a node named `neuron_udma<N>` (a symbolic link to one is followed).
pub fn node_index(node: &Path) -> Option<u32> {
    let real = std::fs::canonicalize(node).unwrap_or_else(|_| node.to_path_buf());
    real.file_name()?.to_str()?.strip_prefix(NODE_PREFIX)?.parse().ok()
}

/// The PCI address of node `neuron_udma<index>`: its misc device's parent in sysfs
/// (`/sys/class/misc/neuron_udma<N>/device`), which needs no access to the node; else the
/// node's fdinfo (it is opened read-only).
fn pci_of(node: &Path, index: u32) -> Result<String> {
    let link = Path::new("/sys/class/misc").join(format!("{NODE_PREFIX}{index}")).join("device");
    if let Some(name) =
        std::fs::read_link(&link).ok().and_then(|t| t.file_name().and_then(|n| n.to_str().map(String::from)))
    {
        return Ok(name);
    }
    let dev = Device::open_read_only(node).map_err(|e| anyhow::anyhow!(error_text(&e)))?;
    Ok(dev.usage().map_err(|e| anyhow::anyhow!(error_text(&e)))?.device)
}

/// The counters of the device of `node`.
fn read_device(node: &Path) -> Result<DeviceMetrics> {
    let index = node_index(node).with_context(|| format!("{}: not a neuron_udma<N> node", node.display()))?;
    let pci = pci_of(node, index)?;
    let usage = DeviceUsage::read(&pci).map_err(|e| anyhow::anyhow!(error_text(&e)))?;
    let activity = DeviceActivity::read(&pci).map_err(|e| anyhow::anyhow!(error_text(&e)))?;
    Ok(DeviceMetrics { index, pci, usage, activity })
}

/// Writes `text` to `path` whole, or to stdout without one.
pub fn emit(path: Option<&Path>, text: &str) -> Result<()> {
    match path {
        Some(path) => write_whole(path, text),
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes()).and_then(|()| out.flush()).context("writing to stdout")
        }
    }
}

/// Writes `text` to `path` whole: a temporary file beside it, synced, renamed over it. An
/// existing `path` must be a regular file (not a symbolic link, a device or a directory): it
/// is replaced, never written through.
fn write_whole(path: &Path, text: &str) -> Result<()> {
    if let Ok(md) = std::fs::symlink_metadata(path) {
        if !md.file_type().is_file() {
            bail!("{} exists and is not a regular file: not replacing it", path.display());
        }
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!("directory {} does not exist", dir.display());
    }
    let mut tmp = tempfile::Builder::new().prefix(".neuron_udma").suffix(".tmp").tempfile_in(dir).map_err(|e| {
        anyhow::anyhow!("cannot create a file in {}: {}", dir.display(), std::io::Error::from(e.kind()))
    })?;
    tmp.write_all(text.as_bytes()).and_then(|()| tmp.as_file().sync_all()).context("writing the metrics")?;
    // Readable by the collector (tempfile creates 0600): on the open file, not by its path,
    // which another user of the directory could replace meanwhile.
    tmp.as_file().set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    tmp.persist(path).map_err(|e| anyhow::anyhow!("cannot rename the metrics to {}: {}", path.display(), e.error))?;
    Ok(())
}

pub fn run(device: Option<&Path>, a: &MetricsArgs) -> Result<()> {
    let nodes = match device {
        Some(d) => vec![d.to_path_buf()],
        None => nodes::device_nodes(&a.dev_dir)?,
    };
    if nodes.is_empty() {
        bail!(nodes::no_node_message(&a.dev_dir));
    }
    // All or nothing: a file with some devices missing would read as those devices gone.
    let devices = nodes.iter().map(|n| read_device(n)).collect::<Result<Vec<_>>>()?;
    emit(a.output.as_deref(), &prometheus_text(&devices))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_indices() {
        assert_eq!(node_index(Path::new("/dev/neuron_udma0")), Some(0));
        assert_eq!(node_index(Path::new("/dev/neuron_udma12")), Some(12));
        assert_eq!(node_index(Path::new("/dev/neuron_udmax")), None);
        assert_eq!(node_index(Path::new("/dev/null")), None);
    }

    #[test]
    fn output_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("neuron_udma.prom");
        std::fs::write(&path, "old").unwrap();
        write_whole(&path, "# HELP x y\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "# HELP x y\n");
        // Only the target is left: no temporary file.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn only_regular_files_are_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link.prom");
        std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
        let e = write_whole(&link, "x\n").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        assert!(write_whole(dir.path(), "x\n").is_err());
        let e = write_whole(&dir.path().join("no/such/dir.prom"), "x\n").unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn no_node_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let a = MetricsArgs { output: None, dev_dir: dir.path().to_path_buf() };
        assert!(run(None, &a).is_err());
    }
}
