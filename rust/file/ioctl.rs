// SPDX-License-Identifier: GPL-2.0

//! The ioctl dispatch of an open file: one table, [`COMMANDS`], says for every command its
//! argument (struct, and so size, and direction), who may call it and what runs it. The table
//! is checked at build time against the command numbers of the UAPI header (`_IOR`, `_IOW`,
//! `_IOWR`: the direction and the size they encode), so the driver copies exactly the bytes the
//! header says, in the direction it says.
//!
//! Order of the checks, the same for every command: a device that was unbound (`ENODEV`), a
//! read-only file calling anything but a look (`EBADF`, also for unknown commands), an unknown
//! command (`ENOTTY`); then abandoned work is reaped (commands that need memory or the shared
//! queue), the argument is copied in (unless the command only writes it) and, if it also goes
//! out, checked writable before the command changes anything (`EFAULT`).

use super::OpenFile;
use crate::uapi;
use core::marker::PhantomData;
use kernel::{
    fs::{file::flags, File},
    ioctl::{_IOC_DIR, _IOC_NR, _IOC_SIZE, _IOC_TYPE},
    prelude::*,
    transmute::{AsBytes, FromBytes},
    uaccess::{UserPtr, UserSlice},
};

/// Which way an ioctl's argument goes: the direction bits of its command number.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// `_IOW`: user space passes it in.
    In,
    /// `_IOR`: the driver writes it (`INFO`).
    Out,
    /// `_IOWR`: in, then back out with the results.
    InOut,
}

impl Dir {
    /// The `_IOC_DIR` bits of a command number with this direction.
    const fn bits(self) -> u32 {
        match self {
            Dir::In => kernel::uapi::_IOC_WRITE,
            Dir::Out => kernel::uapi::_IOC_READ,
            Dir::InOut => kernel::uapi::_IOC_READ | kernel::uapi::_IOC_WRITE,
        }
    }
}

/// What a command may do, which decides whether a file opened read-only may call it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Only looks: allowed on a read-only file.
    Look,
    /// Allocates, starts DMA or changes a queue: the file must be open for writing (`EBADF`).
    Write,
    /// As [`Access::Write`], and needs memory or the shared H2T queue: what abandoned copies
    /// held comes back first, as soon as the engine is done with it (`MEM_FREE` reaps itself).
    WriteReap,
}

/// An ioctl argument struct (`uapi.rs`): plain bytes both ways, all zero by default.
pub(super) trait Argument: FromBytes + AsBytes + Default {}

impl<T: FromBytes + AsBytes + Default> Argument for T {}

/// The user-space argument of one call of a command whose argument struct is `T`.
pub(super) struct Arg<T> {
    /// Its user address.
    addr: usize,
    /// Its size in bytes, from the command number: `size_of::<T>()`, or for `INFO` that of an
    /// older ABI's (smaller) struct.
    size: usize,
    /// Its command's direction.
    dir: Dir,
    _arg: PhantomData<T>,
}

impl<T: Argument> Arg<T> {
    /// Copies the argument in (unless the command only writes it), runs `f` on it, and copies
    /// it back out (unless the command only reads it); `f`'s value is the ioctl's.
    ///
    /// An argument that goes both ways is written back once before `f` runs, so that `EFAULT`
    /// comes before any change; one that only goes out (`INFO`: its first `size` bytes) changes
    /// nothing and is written once.
    ///
    /// # Errors
    ///
    /// `EFAULT` for an argument user space cannot read or write; `f`'s errors.
    pub(super) fn run(self, f: impl FnOnce(&mut T) -> Result<isize>) -> Result<isize> {
        let slice = || UserSlice::new(UserPtr::from_addr(self.addr), self.size);
        let mut v = if self.dir == Dir::Out {
            T::default()
        } else {
            slice().reader().read()?
        };
        if self.dir == Dir::InOut {
            // The output must be writable before anything changes (EFAULT then changes nothing).
            slice().writer().write(&v)?;
        }
        let r = f(&mut v)?;
        if self.dir != Dir::In {
            let bytes = v.as_bytes().get(..self.size).ok_or(EINVAL)?;
            slice().writer().write_slice(bytes)?;
        }
        Ok(r)
    }
}

/// One ioctl command of the ABI.
struct Command {
    /// Its number (`uapi::IOC_*`).
    cmd: u32,
    /// The size of its argument struct, in bytes.
    size: usize,
    /// Which way its argument goes.
    dir: Dir,
    /// Whether a read-only file may call it, and whether it reaps first.
    access: Access,
    /// Runs it on the argument at a user address with the size its command number says.
    run: fn(&OpenFile, usize, usize) -> Result<isize>,
}

/// The [`Command`]s of rows `number argument direction access handler;`: command number
/// `uapi::number`, argument struct `uapi::argument` going `direction` ([`Dir`]), [`Access`]
/// `access`, run by `handler` (a `fn(&OpenFile, Arg<uapi::argument>) -> Result<isize>`).
macro_rules! commands {
    ($($cmd:ident $arg:ident $dir:ident $access:ident $handler:expr;)*) => {
        [$(
            Command {
                cmd: uapi::$cmd,
                size: core::mem::size_of::<uapi::$arg>(),
                dir: Dir::$dir,
                access: Access::$access,
                run: |me, addr, size| {
                    let handler: fn(&OpenFile, Arg<uapi::$arg>) -> Result<isize> = $handler;
                    let arg = Arg {
                        addr,
                        size,
                        dir: Dir::$dir,
                        _arg: PhantomData,
                    };
                    handler(me, arg)
                },
            }
        ),*]
    };
}

/// The handler of a command whose method takes the argument struct and returns nothing but
/// success: `|me, arg| arg.run(|a| me.method(a).map(|()| 0))` (the ioctl's value is 0).
macro_rules! unit {
    ($method:ident) => {
        |me, arg| arg.run(|a| me.$method(a).map(|()| 0))
    };
}

/// Every command of the ABI, at the index of its number's `_IOC_NR` (checked below).
static COMMANDS: [Command; 20] = commands! {
    // number              argument struct                direction access
    //     handler
    IOC_INFO               neuron_udma_info               Out       Look
        |me, arg| arg.run(|i| { *i = me.info()?; Ok(0) });
    IOC_MEM_ALLOC          neuron_udma_mem_alloc          InOut     WriteReap
        |me, arg| me.new_buffer(arg, OpenFile::mem_alloc);
    IOC_MEM_FREE           neuron_udma_mem_free           In        Write
        unit!(mem_free);
    IOC_QUEUE_INIT         neuron_udma_queue_init         In        WriteReap
        unit!(queue_init);
    IOC_QUEUE_RELEASE      neuron_udma_queue_id           In        Write
        unit!(queue_release);
    IOC_COPY_PREPARE_ONE   neuron_udma_copy_prepare_one   In        Write
        |me, arg| arg.run(|p| me.prepare(p.engine, p.queue, core::slice::from_ref(&p.copy)));
    IOC_COPY_PREPARE       neuron_udma_copy_prepare       In        Write
        |me, arg| arg.run(|p| me.copy_prepare(p));
    IOC_COPY_START         neuron_udma_copy_start         In        Write
        unit!(copy_start);
    IOC_COPY_WAIT          neuron_udma_copy_wait          InOut     Write
        unit!(copy_wait);
    IOC_QUEUE_STATE        neuron_udma_queue_state        InOut     Look
        unit!(queue_state);
    IOC_MEMCPY             neuron_udma_memcpy             In        WriteReap
        unit!(memcpy);
    IOC_MEM_IMPORT         neuron_udma_mem_import         InOut     WriteReap
        |me, arg| me.new_buffer(arg, OpenFile::mem_import);
    IOC_COPY_SUBMIT        neuron_udma_copy_submit        InOut     Write
        unit!(copy_submit);
    IOC_FENCE_STATUS       neuron_udma_fence_status       InOut     Look
        unit!(fence_status);
    IOC_FENCE_WAIT         neuron_udma_fence_wait         In        Write
        unit!(fence_wait);
    IOC_QUEUE_EVENTS       neuron_udma_events             InOut     Write
        unit!(queue_events);
    IOC_QUEUE_EVENTFD      neuron_udma_eventfd            In        Write
        unit!(queue_eventfd);
    IOC_MEMSET             neuron_udma_memset             In        WriteReap
        unit!(memset);
    IOC_DMABUF_EXPORT      neuron_udma_dmabuf_export      InOut     Write
        |me, arg| me.dmabuf_export(arg);
    IOC_DMABUF_IMPORT      neuron_udma_dmabuf_import      InOut     Write
        |me, arg| me.dmabuf_import(arg);
};

// The table agrees with the UAPI header's command numbers: each has the driver's magic, its
// entry's index as its number, and its entry's direction and argument size.
const _: () = {
    let mut i = 0;
    while i < COMMANDS.len() {
        let c = &COMMANDS[i];
        assert!(_IOC_TYPE(c.cmd) == uapi::NEURON_UDMA_IOC_MAGIC);
        assert!(_IOC_NR(c.cmd) as usize == i);
        assert!(_IOC_DIR(c.cmd) == c.dir.bits());
        assert!(_IOC_SIZE(c.cmd) == c.size);
        i += 1;
    }
};

/// The command `cmd` names, if any: exactly one of [`COMMANDS`] (a known number with another
/// size or direction is another command), except that `INFO` of every ABI is `INFO` (an older
/// ABI's struct is a prefix of today's).
fn lookup(cmd: u32) -> Option<&'static Command> {
    let cmd = if uapi::info_size(cmd).is_some() {
        uapi::IOC_INFO
    } else {
        cmd
    };
    // CAST: `_IOC_NR` is 8 bits.
    COMMANDS.get(_IOC_NR(cmd) as usize).filter(|c| c.cmd == cmd)
}

/// `ioctl()` of the open file `me` (opened as `file`): command `cmd` on the argument at user
/// address `arg`.
///
/// # Errors
///
/// `ENODEV` after unbind, `EBADF` for anything but a look on a read-only file, `ENOTTY` for an
/// unknown command, `EFAULT` for an argument user space cannot read or write, and the
/// command's own errors; `ENOENT` where the command found its queue gone from a live device.
pub(super) fn dispatch(me: &OpenFile, file: &File, cmd: u32, arg: usize) -> Result<isize> {
    // After unbind nothing is left to operate on (the file's resources were freed with it).
    if !me.dev.is_alive() {
        return Err(ENODEV);
    }
    let command = lookup(cmd);
    // Commands that allocate, start DMA or change a queue need a file opened for writing: a
    // read-only descriptor may only look (and an unknown command is no look).
    let look = command.is_some_and(|c| c.access == Access::Look);
    if !look && file.flags() & flags::O_ACCMODE == flags::O_RDONLY {
        return Err(EBADF);
    }
    let command = command.ok_or(ENOTTY)?;
    if command.access == Access::WriteReap {
        me.dev.reap();
    }
    let r = (command.run)(me, arg, _IOC_SIZE(cmd));
    // A queue that another thread of the file released while this call used it answers
    // ECANCELED (the instance is gone); ENODEV from a live device is a queue that is not
    // this file's any more (ENOENT); ENODEV from a dead one means the device was unbound.
    match r {
        Err(e) if e == ENODEV && me.dev.is_alive() => Err(ENOENT),
        r => r,
    }
}
