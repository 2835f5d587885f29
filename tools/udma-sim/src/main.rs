// SPDX-License-Identifier: GPL-2.0
//! `udma-sim`: vfio-user server exposing the UDMA device model to QEMU.
//!
//! Usage: `udma-sim --model trn1 --socket /abs/path.sock [--hbm-size 64M]
//! [--trace FILE] [--control /abs/ctl.sock] [--ready-file PATH] [-v]`.
//! Serves one client connection and exits 0 when it disconnects.

use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use udma_sim::layout::Model;
use udma_sim::mem::DmaTable;
use udma_sim::peer::PeerDir;
use udma_sim::server::{irqs, regions, Backend};
use udma_sim::{control, parse_size, Config, Device, Options};

/// Command line.
#[derive(Parser, Debug)]
#[command(name = "udma-sim", version, about = "AWS Neuron UDMA device model (vfio-user server)")]
struct Args {
    /// Chip model: trn1 (0x7164, v2), inf2 (0x7264, v2) or trn2 (0x7364, v3).
    #[arg(long, value_parser = parse_model)]
    model: Model,
    /// Absolute path of the vfio-user socket to create.
    #[arg(long)]
    socket: PathBuf,
    /// Device memory (BAR4) size, e.g. 64M, 1G (power of two, >= 4K). Default: 64M (trn1,
    /// inf2); 256M (trn2, where each of the four HBM windows is a quarter of BAR4).
    #[arg(long, value_parser = parse_hbm)]
    hbm_size: Option<u64>,
    /// Write one JSON line per consumed descriptor to FILE.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Serve the JSON control protocol on this Unix socket.
    #[arg(long)]
    control: Option<PathBuf>,
    /// Create this file once the vfio-user socket is listening.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// A directory shared by the models of one guest: publish this model's BAR4 there and map
    /// the other models' BAR4s for peer-to-peer DMA (Documentation/udma-sim.rst).
    #[arg(long)]
    peer_dir: Option<PathBuf>,
    /// Unordered completion: hold the writes of a barrier-free packet (> 64 bytes) for up to
    /// this many milliseconds; 0 = every packet lands in order at once (hardware.rst §4.4,
    /// §5.1 [I]).
    #[arg(long, default_value_t = 100)]
    unordered_delay_ms: u64,
    /// A device-memory read of a packet without DMB lands the queue's earlier held writes it
    /// overlaps first (the old, lenient rule). By default it does not see them (hardware.rst
    /// §4.2 bit 30, §8.2 [I]; Documentation/udma-sim.rst).
    #[arg(long)]
    ordered_device_reads: bool,
    /// A device-memory write is visible to every reader (other queues, other engines, BAR4) once
    /// it lands. By default a queue's device writes are visible to others only once it publishes
    /// them: at its next DMB packet (the driver's fence marker), when it goes idle, or after the
    /// unordered delay (hardware.rst §4.2 bit 30 [I]; Documentation/udma-sim.rst).
    #[arg(long)]
    shared_device_writes: bool,
    /// Let every V3 engine reach host memory (hardware.rst §2.5 assumes only the listed ones can
    /// [I]).
    #[arg(long)]
    all_engines_reach_host: bool,
    /// Reset unwritten registers to driver-like values (cfg_len bit 24 set, 65 descriptors per
    /// packet, errors unmasked) instead of the strict ones (hardware.rst §8.1 [I]).
    #[arg(long)]
    driver_reset_values: bool,
    /// A queue reset plus re-enable also ends an abort and clears its cause bits (hardware.rst
    /// §8.3 [I]).
    #[arg(long)]
    reinit_clears_abort: bool,
    /// More logging (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

fn parse_model(s: &str) -> Result<Model, String> {
    Model::parse(s).ok_or_else(|| format!("unknown model {s:?} (trn1, inf2, trn2)"))
}

fn parse_hbm(s: &str) -> Result<u64, String> {
    match parse_size(s) {
        Some(v) if v.is_power_of_two() && v >= 4096 => Ok(v),
        _ => Err(format!("invalid size {s:?}: need a power of two >= 4K, e.g. 64M")),
    }
}

fn main() {
    let args = Args::parse();
    let level = match args.verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    if let Err(e) = run(args) {
        log::error!("{e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), String> {
    let dma = Arc::new(DmaTable::new());
    let options = Options {
        unordered_delay: (args.unordered_delay_ms > 0).then(|| Duration::from_millis(args.unordered_delay_ms)),
        host_connectivity: !args.all_engines_reach_host,
        strict_reset: !args.driver_reset_values,
        sticky_errors: !args.reinit_clears_abort,
        unordered_device_reads: !args.ordered_device_reads,
        private_device_writes: !args.shared_device_writes,
    };
    log::info!("model options: {options:?}");
    let hbm_size = args.hbm_size.unwrap_or(match args.model {
        Model::Trn2 => 256 << 20,
        Model::Trn1 | Model::Inf2 => 64 << 20,
    });
    let cfg = Config { model: args.model, hbm_size, trace: args.trace.clone(), options };
    let dev = Arc::new(Device::new(cfg, dma.clone()).map_err(|e| format!("device: {e}"))?);
    if let Some(p) = &args.control {
        control::serve(dev.clone(), p).map_err(|e| format!("control socket {}: {e}", p.display()))?;
    }
    let server = vfio_user::Server::new(&args.socket, true, irqs(), regions(&dev))
        .map_err(|e| format!("vfio-user socket {}: {e}", args.socket.display()))?;
    if let Some(p) = &args.ready_file {
        std::fs::write(p, format!("{}\n", std::process::id())).map_err(|e| format!("ready file: {e}"))?;
    }
    log::info!(
        "udma-sim {:?} (device 0x{:04x}) listening on {}; BAR0 {} MiB, BAR4 {} MiB",
        args.model,
        args.model.device_id(),
        args.socket.display(),
        dev.gen().bar0_size() >> 20,
        hbm_size >> 20
    );
    let peers = match (&args.peer_dir, dev.hbm().raw_fd()) {
        (Some(d), Some(fd)) => Some(PeerDir::new(d.clone(), fd, dev.hbm().len() as u64)),
        (Some(_), None) => return Err("--peer-dir: device memory without a memfd".into()),
        (None, _) => None,
    };
    let mut backend = Backend::new(dev.clone(), dma, peers);
    let res = server.run(&mut backend);
    if let Some(p) = &args.control {
        let _ = std::fs::remove_file(p);
    }
    match res {
        Ok(()) => {
            log::info!("client disconnected; exiting");
            Ok(())
        }
        Err(e) => Err(format!("vfio-user: {e}")),
    }
}
