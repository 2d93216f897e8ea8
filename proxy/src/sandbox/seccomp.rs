//! The seccomp filter of a sandboxed command: what an agent never needs is refused, the rest
//! is allowed (docs/sandbox.md lists each call and why).
//!
//! The BPF comes from `seccompiler` (rust-vmm's, pure Rust). Three programs are stacked,
//! since one seccompiler filter has one action for everything it matches: the main one
//! answers `EPERM`; one answers `ENOSYS` to `clone3` (its flags are in memory a filter
//! cannot read, so it cannot be told apart from a plain fork: C libraries fall back to
//! `clone`, whose flags are checked); on x86-64 one answers `ENOSYS` to every x32-ABI call
//! (a second numbering of the same calls that a list of numbers would not match). A call
//! of another architecture's ABI (32-bit `int 0x80`) kills the process: seccompiler checks
//! the architecture first.

use std::collections::BTreeMap;

use nix::libc;
use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

/// Why the filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("building the seccomp filter: {0}")]
    Build(String),
    #[error("installing the seccomp filter: {0}")]
    Install(String),
}

/// Calls refused outright with `EPERM`, by what they would let an agent do.
fn refused() -> Vec<i64> {
    let mut calls = vec![
        // Changing the filesystem view: mounts in any of their forms.
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        // Reading or steering other processes (the init stage, a sibling).
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        // The kernel itself: new kernels, modules.
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        // The kernel keyrings, shared with the host's processes of the same uid.
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_keyctl,
        // Large kernel attack surface no agent needs.
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        // io_uring makes sockets and opens files without the calls this filter checks.
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        // Files by handle, bypassing the view's paths.
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        // Leaving or making namespaces (a new user namespace gives capabilities in it).
        libc::SYS_setns,
        libc::SYS_unshare,
        // The host's state: swap, reboot, clocks, accounting, quotas, the kernel log.
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_adjtimex,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_syslog,
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([libc::SYS_iopl, libc::SYS_ioperm]);
    calls
}

/// The namespace flags `clone` may not carry.
const CLONE_NAMESPACES: [u64; 7] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWCGROUP as u64,
];

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SeccompError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
        .map_err(|e| SeccompError::Build(e.to_string()))
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conditions).map_err(|e| SeccompError::Build(e.to_string()))
}

/// `socket(domain, type, protocol)` refused for packet sockets, raw IP sockets, and
/// netlink other than `NETLINK_ROUTE` (which C libraries' `getaddrinfo` asks for the
/// interfaces; inside a network namespace with only loopback it shows nothing).
fn socket_rules() -> Result<Vec<SeccompRule>, SeccompError> {
    use SeccompCmpOp::{Eq, MaskedEq, Ne};
    // The socket type's low bits; the rest are SOCK_NONBLOCK and SOCK_CLOEXEC.
    const SOCK_TYPE_MASK: u64 = 0xf;
    let raw = libc::SOCK_RAW as u64;
    Ok(vec![
        rule(vec![cond(0, Eq, libc::AF_PACKET as u64)?])?,
        rule(vec![
            cond(0, Eq, libc::AF_INET as u64)?,
            cond(1, MaskedEq(SOCK_TYPE_MASK), raw)?,
        ])?,
        rule(vec![
            cond(0, Eq, libc::AF_INET6 as u64)?,
            cond(1, MaskedEq(SOCK_TYPE_MASK), raw)?,
        ])?,
        rule(vec![
            cond(0, Eq, libc::AF_NETLINK as u64)?,
            cond(2, Ne, libc::NETLINK_ROUTE as u64)?,
        ])?,
    ])
}

fn arch() -> Result<TargetArch, SeccompError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| SeccompError::Build(e.to_string()))
}

fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram, SeccompError> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch()?,
    )
    .map_err(|e| SeccompError::Build(e.to_string()))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| SeccompError::Build(e.to_string()))
}

/// The programs to install, in order.
pub fn programs() -> Result<Vec<BpfProgram>, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = refused()
        .into_iter()
        .map(|call| (call, Vec::new()))
        .collect();
    rules.insert(libc::SYS_socket, socket_rules()?);
    let clone_flags = CLONE_NAMESPACES
        .iter()
        .map(|&flag| rule(vec![cond(0, SeccompCmpOp::MaskedEq(flag), flag)?]))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, clone_flags);
    // Pushing input into a terminal (the operator's, if one is shared). The request's type
    // differs between targets (`c_ulong` here, `c_int` on some C libraries).
    #[allow(clippy::unnecessary_cast)]
    let tiocsti = libc::TIOCSTI as u64;
    rules.insert(
        libc::SYS_ioctl,
        vec![rule(vec![cond(1, SeccompCmpOp::Eq, tiocsti)?])?],
    );
    let mut programs = vec![compile(rules, libc::EPERM)?];
    programs.push(compile(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        libc::ENOSYS,
    )?);
    #[cfg(target_arch = "x86_64")]
    programs.push(x32_refused());
    Ok(programs)
}

/// `ENOSYS` for every call numbered in the x32 ABI (`__X32_SYSCALL_BIT` set); seccompiler's
/// architecture check has let only x86-64 calls reach here.
#[cfg(target_arch = "x86_64")]
fn x32_refused() -> BpfProgram {
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    // BPF opcodes (linux/bpf_common.h): BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JGE|BPF_K,
    // BPF_RET|BPF_K.
    const LD_W_ABS: u16 = 0x20;
    const JMP_JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    let insn = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        // seccomp_data.nr is at offset 0.
        insn(LD_W_ABS, 0, 0, 0),
        insn(JMP_JGE_K, 0, 1, X32_SYSCALL_BIT),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Install the filter on the calling thread (the exec stage, single-threaded, right before
/// it execs the command: the filter stays for everything the command runs). Sets
/// `no_new_privs`, which a filter needs without `CAP_SYS_ADMIN`.
pub fn install() -> Result<(), SeccompError> {
    for program in programs()? {
        seccompiler::apply_filter(&program).map_err(|e| SeccompError::Install(e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_compiles_for_this_architecture() {
        let programs = programs().unwrap();
        assert!(programs.len() >= 2);
        assert!(programs.iter().all(|p| !p.is_empty() && p.len() < 4096));
        // Every refused call is distinct (a duplicate would mean a mistyped one is missing).
        let calls = refused();
        let mut unique = calls.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), calls.len());
    }
}
