// SPDX-License-Identifier: MIT OR Apache-2.0
//! Finding and opening the device nodes: `udmactl list`, and the one error message of a node
//! that cannot be opened.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use neuron_udma::{Device, Info};

/// The node every command but `list` uses when `--device` is not given.
pub const DEFAULT_DEVICE: &str = "/dev/neuron_udma0";

/// Where the driver's nodes are.
pub const DEV_DIR: &str = "/dev";

/// The prefix of the driver's node names (`neuron_udma0`, `neuron_udma1`, ...).
const NODE_PREFIX: &str = "neuron_udma";

/// `errno` as "Permission denied (EACCES)".
pub fn errno_text(errno: i32) -> String {
    // The C library's text (strerror), without std's " (os error N)"; the name from nix.
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    let text = text.split(" (os error").next().unwrap_or_default();
    format!("{text} ({:?})", nix::errno::Errno::from_raw(errno))
}

/// `names` (entries `neuron_udma*` of a directory) in numeric order of their suffix
/// (`neuron_udma2` before `neuron_udma10`); names without a numeric suffix after them, by name.
pub fn sort_nodes(mut names: Vec<String>) -> Vec<String> {
    names.sort_by_key(|name| {
        let n: Option<u64> = name.strip_prefix(NODE_PREFIX).and_then(|s| s.parse().ok());
        (n.is_none(), n, name.clone())
    });
    names
}

/// The `neuron_udma*` entries of `dir`, sorted by [`sort_nodes`].
pub fn device_nodes(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
        if let Some(name) = entry.file_name().to_str().filter(|n| n.starts_with(NODE_PREFIX)) {
            names.push(name.to_string());
        }
    }
    Ok(sort_nodes(names).into_iter().map(|n| dir.join(n)).collect())
}

/// The message for a device that does not exist: `dir`/neuron_udma* has no node at all.
pub fn no_node_message(dir: &Path) -> String {
    format!("no {}/{NODE_PREFIX}* device node: is the neuron_udma module loaded and a device bound?", dir.display())
}

/// Why `path` cannot be opened, in one message (the path named once): for a missing node,
/// whether the driver has any node at all; for a permission error, who may open it.
pub fn open_error_message(path: &Path, errno: i32, read_only: bool) -> String {
    let p = path.display();
    match errno {
        libc::ENOENT => match device_nodes(Path::new(DEV_DIR)) {
            Ok(nodes) if !nodes.is_empty() => {
                let names: Vec<String> = nodes.iter().map(|n| n.display().to_string()).collect();
                format!("no device node {p} (there are {}: see udmactl list)", names.join(", "))
            }
            // The driver's own kind of name: the message `list` gives for no node at all.
            _ if path.parent() == Some(Path::new(DEV_DIR))
                && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(NODE_PREFIX)) =>
            {
                no_node_message(Path::new(DEV_DIR))
            }
            _ => format!("no device node {p}, and {}", no_node_message(Path::new(DEV_DIR))),
        },
        libc::EACCES | libc::EPERM => format!(
            "cannot open {p}{}: {}: its mode and group decide who may use it{}",
            if read_only { "" } else { " read-write" },
            errno_text(errno),
            if read_only { "" } else { " (copies need read-write; `udmactl info` needs only read)" }
        ),
        _ => format!("cannot open {p}: {}", errno_text(errno)),
    }
}

/// Opens `path` (read-only for commands that only read INFO) and reads its INFO. Every error
/// is one message that names the node once.
pub fn open(path: &Path, read_only: bool) -> Result<(Device, Info)> {
    let dev = if read_only { Device::open_read_only(path) } else { Device::open(path) }
        .map_err(|e| anyhow!(open_error_message(path, e.errno(), read_only)))?;
    let info = dev.info().with_context(|| format!("NEURON_UDMA_INFO on {}", path.display()))?;
    Ok((dev, info))
}

/// What `list` found at one node: its INFO, or why it could not be read (message, errno).
pub type Probe = std::result::Result<Info, (String, i32)>;

/// Opens `path` read-only and reads its INFO.
pub fn probe(path: &Path) -> Probe {
    let dev =
        Device::open_read_only(path).map_err(|e| (format!("cannot open: {}", errno_text(e.errno())), e.errno()))?;
    dev.info().map_err(|e| (format!("NEURON_UDMA_INFO failed: {e}"), e.errno()))
}

/// "v2", "v3", or "generation N" for one this tool does not know.
pub fn gen_name(info: &Info) -> String {
    match info.gen() {
        neuron_udma::Generation::V2 => "v2".into(),
        neuron_udma::Generation::V3 => "v3".into(),
        neuron_udma::Generation::Unknown(g) => format!("generation {g}"),
    }
}

/// The model name, or the PCI device id for an unknown one.
pub fn model_name(info: &Info) -> String {
    info.model().map_or_else(|| format!("device {:#06x}", info.device_id), str::to_string)
}

/// The header row of `list` for nodes `width` characters wide.
pub fn list_header(width: usize) -> String {
    format!(
        "{:<width$}  {:<11} {:<3} {:>7} {:>14} {:>13} {:>9}",
        "NODE", "MODEL", "GEN", "ENGINES", "HOST-CONNECTED", "DEVICE-MEMORY", "MAX-BATCH"
    )
}

/// One row of `list` for a node, under [`list_header`]: model, generation, engines,
/// host-connected engines, device memory, max batch; or the reason it could not be read.
pub fn list_line(node: &str, width: usize, probe: &Probe) -> String {
    match probe {
        Ok(i) => format!(
            "{node:<width$}  {:<11} {:<3} {:>7} {:>14} {:>13} {:>9}",
            model_name(i),
            gen_name(i),
            i.engines,
            i.host_engine_list().len(),
            crate::human_bytes(i.device_mem_size),
            i.max_batch
        ),
        Err((msg, _)) => format!("{node:<width$}  {msg}"),
    }
}

/// `udmactl list`: every node of `dir`, one line (or one JSON object) each. Fails if there is
/// no node, or after listing them if any could not be read.
pub fn cmd_list(dir: &Path, json: bool) -> Result<()> {
    let nodes = device_nodes(dir)?;
    if nodes.is_empty() {
        bail!(no_node_message(dir));
    }
    let probes: Vec<(String, Probe)> = nodes.iter().map(|n| (n.display().to_string(), probe(n))).collect();
    if json {
        let entries: Vec<crate::json::ListEntry> =
            probes.iter().map(|(node, p)| crate::json::ListEntry::new(node, p)).collect();
        println!("{}", serde_json::to_string(&entries)?);
    } else {
        let width = probes.iter().map(|(n, _)| n.len()).max().unwrap_or(0).max("NODE".len());
        println!("{}", list_header(width));
        for (node, p) in &probes {
            println!("{}", list_line(node, width, p));
        }
    }
    let failed = probes.iter().filter(|(_, p)| p.is_err()).count();
    if failed > 0 {
        bail!("{failed} of {} device nodes could not be read (see the list)", probes.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_sort_numerically() {
        let names = ["neuron_udma10", "neuron_udma2", "neuron_udma_x", "neuron_udma0", "neuron_udma1"];
        let sorted = sort_nodes(names.iter().map(|s| s.to_string()).collect());
        assert_eq!(sorted, ["neuron_udma0", "neuron_udma1", "neuron_udma2", "neuron_udma10", "neuron_udma_x"]);
    }

    #[test]
    fn nodes_of_a_directory() {
        let dir = std::env::temp_dir().join(format!("udmactl-nodes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for n in ["neuron_udma10", "neuron_udma9", "other"] {
            std::fs::write(dir.join(n), b"").unwrap();
        }
        let nodes = device_nodes(&dir).unwrap();
        assert_eq!(nodes, [dir.join("neuron_udma9"), dir.join("neuron_udma10")]);
        // A regular file is no neuron_udma device: INFO fails with ENOTTY, the node is listed.
        let p = probe(&nodes[0]);
        assert!(matches!(&p, Err((msg, libc::ENOTTY)) if msg.contains("ENOTTY")), "{p:?}");
        assert!(list_line("x", 3, &p).starts_with("x    NEURON_UDMA_INFO failed"));
        for n in ["neuron_udma10", "neuron_udma9"] {
            std::fs::remove_file(dir.join(n)).unwrap();
        }
        let e = cmd_list(&dir, false).unwrap_err().to_string();
        assert_eq!(e, no_node_message(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(cmd_list(&dir, false).is_err());
    }

    #[test]
    fn open_errors_name_the_node_once() {
        let m = open_error_message(Path::new("/dev/neuron_udma7"), libc::EACCES, false);
        assert_eq!(m.matches("/dev/neuron_udma7").count(), 1, "{m}");
        assert!(m.contains("Permission denied (EACCES)") && m.contains("read-write"), "{m}");
        let m = open_error_message(Path::new("/nonexistent/neuron_udma0"), libc::ENOENT, true);
        assert_eq!(m.matches("neuron_udma0").count(), 1, "{m}");
        assert!(m.starts_with("no device node /nonexistent/neuron_udma0"), "{m}");
        // Without any node (this host has no driver), the message of `list`, said once.
        if device_nodes(Path::new(DEV_DIR)).is_ok_and(|n| n.is_empty()) {
            let m = open_error_message(Path::new(DEFAULT_DEVICE), libc::ENOENT, false);
            assert_eq!(m, no_node_message(Path::new(DEV_DIR)));
        }
        assert_eq!(
            no_node_message(Path::new("/dev")),
            "no /dev/neuron_udma* device node: is the neuron_udma module loaded and a device bound?"
        );
        assert_eq!(errno_text(libc::ENOTTY), "Inappropriate ioctl for device (ENOTTY)");
    }

    #[test]
    fn list_lines() {
        let info = Info {
            device_id: 0x7364,
            generation: 3,
            engines: 132,
            host_engines: [0xF0F0_F0F0_F0F0_F0F0, 0xF0F0_F0F0_F0F0_F0F0, 0xF],
            device_mem_size: 96 << 30,
            max_batch: 4096,
            ..Default::default()
        };
        assert_eq!(
            list_header(17),
            "NODE               MODEL       GEN ENGINES HOST-CONNECTED DEVICE-MEMORY MAX-BATCH"
        );
        assert_eq!(
            list_line("/dev/neuron_udma0", 17, &Ok(info)),
            "/dev/neuron_udma0  trn2        v3      132             68      96.0 GiB      4096"
        );
        // The right-aligned columns end where their headers end.
        let (h, l) = (list_header(17), list_line("/dev/neuron_udma0", 17, &Ok(info)));
        assert_eq!(h.len(), l.len());
        for (title, value) in [("ENGINES", "132"), ("HOST-CONNECTED", "68"), ("DEVICE-MEMORY", "GiB")] {
            assert_eq!(h.find(title).unwrap() + title.len(), l.find(value).unwrap() + value.len(), "{title}");
        }
        let unknown = Info { device_id: 0x1234, generation: 7, ..info };
        assert!(
            list_line("n", 1, &Ok(unknown)).starts_with("n  device 0x1234 generation 7 "),
            "{}",
            list_line("n", 1, &Ok(unknown))
        );
        let denied = Err(("cannot open: Permission denied (EACCES)".to_string(), libc::EACCES));
        assert_eq!(
            list_line("/dev/neuron_udma1", 17, &denied),
            "/dev/neuron_udma1  cannot open: Permission denied (EACCES)"
        );
    }
}
