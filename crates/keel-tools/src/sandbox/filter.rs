//! The seccomp filter a confined command runs under (installed by the launcher's second stage
//! after `no_new_privs`; inherited by everything the command starts, never removable).
//!
//! Three programs are compiled and **chained into one filter** (one `seccomp(2)` install and
//! one program run per system call instead of three; [`chain`]), in this order, the first
//! answer that is not "allow" being the filter's:
//! 1. **Kill** (x86_64): any x32 system call number (`nr & 0x40000000`). First, so that the
//!    chain answers as three stacked filters would (the kernel takes the strictest answer of a
//!    stack, and killing is stricter than any error): no x32 number matches the rules below.
//! 2. **EPERM** for:
//!    - `socket` of any family but `AF_UNIX` (and `AF_INET`, `AF_INET6` when the network is
//!      shared, plus `AF_NETLINK` with protocol `NETLINK_ROUTE` only, which lets `getifaddrs`
//!      and name lookups read the interfaces; changing them needs `CAP_NET_ADMIN` over the host's
//!      network namespace, which the sandbox never has). So `AF_PACKET`, `AF_VSOCK`, `AF_XDP`,
//!      other netlink families, `AF_ALG`, … are refused.
//!    - `socketpair` of any family but `AF_UNIX`.
//!    - `io_uring_setup`, `io_uring_enter`, `io_uring_register` (io_uring requests bypass
//!      seccomp, and have been a steady source of kernel bugs).
//!    - `unshare`, `setns`, and `clone` with any `CLONE_NEW*` flag: no nested namespaces (a user
//!      namespace would give the command capabilities over new mounts again, and widens the
//!      kernel surface).
//!    - `keyctl`, `add_key`, `request_key` (kernel keyrings are not namespaced).
//!    - `bpf`, `perf_event_open`, `userfaultfd` (kernel attack surface, exploitation aids).
//!    - `mount`, `umount2`, `pivot_root`, `chroot`, `open_tree`, `move_mount`, `fsopen`,
//!      `fsconfig`, `fsmount`, `fspick`, `mount_setattr`, `open_tree_attr` (the capabilities
//!      are gone anyway).
//!    - `open_by_handle_at`, `name_to_handle_at` (opening by handle escapes bind mounts),
//!      `syslog` (the kernel log), `kexec_load`, `kexec_file_load`, `init_module`,
//!      `finit_module`, `delete_module`, `reboot`, `swapon`, `swapoff`, `acct`.
//!    - `ioctl(TIOCSTI)` (pushing keystrokes into a terminal) and `ioctl(TIOCLINUX)`.
//!    - `mknod`/`mknodat` of a character or block device (FIFOs and sockets stay allowed).
//!    - `sched_setscheduler`, `sched_setparam`, `sched_setattr`, `sched_setaffinity`,
//!      `prlimit64` of PID 1 (the sandbox's, which ends the call when keel closes its lifeline:
//!      a command that starved it outlived its timeout), and `setpriority` / `ioprio_set` of
//!      anything but a single process other than PID 1 (a process group or a user reaches PID 1
//!      too).
//! 3. **ENOSYS** for `clone3`, whose flags live in memory the filter cannot read: libc falls
//!    back to `clone`, which program 2 checks.
//!
//! Programs 2 and 3 first check the architecture and kill the process for any other: on
//! x86_64, 32-bit calls through `int 0x80` (`socketcall` included) never run. The programs are
//! compiled once per launcher process ([`prepare`]: a session's holder compiles them before it
//! forks the calls' launchers, which inherit them).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

type Rules = BTreeMap<i64, Vec<SeccompRule>>;

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| e.to_string())
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conditions).map_err(|e| e.to_string())
}

fn arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())
}

fn compile(rules: Rules, action: SeccompAction) -> Result<BpfProgram, String> {
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, action, arch()?)
        .map_err(|e| e.to_string())?;
    BpfProgram::try_from(filter).map_err(|e| e.to_string())
}

/// `open_tree_attr(2)` (Linux 6.15; one number on every architecture but alpha), which the
/// `libc` crate does not name yet.
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// Program 2: the calls that fail with EPERM.
fn eperm_rules(network: bool) -> Result<Rules, String> {
    let mut rules = Rules::new();
    let mut allowed = vec![libc::AF_UNIX];
    if network {
        allowed.extend([libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK]);
    }
    let mut socket = vec![rule(
        allowed
            .iter()
            .map(|&family| cond(0, SeccompCmpOp::Ne, family as u64))
            .collect::<Result<_, _>>()?,
    )?];
    if network {
        socket.push(rule(vec![
            cond(0, SeccompCmpOp::Eq, libc::AF_NETLINK as u64)?,
            cond(2, SeccompCmpOp::Ne, libc::NETLINK_ROUTE as u64)?,
        ])?);
    }
    rules.insert(libc::SYS_socket, socket);
    rules.insert(
        libc::SYS_socketpair,
        vec![rule(vec![cond(
            0,
            SeccompCmpOp::Ne,
            libc::AF_UNIX as u64,
        )?])?],
    );
    let namespaces = [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWCGROUP,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
    ];
    rules.insert(
        libc::SYS_clone,
        namespaces
            .iter()
            .map(|&flag| {
                let flag = flag as u32 as u64;
                rule(vec![cond(0, SeccompCmpOp::MaskedEq(flag), flag)?])
            })
            .collect::<Result<_, _>>()?,
    );
    // `Ioctl` is `c_ulong` or `c_int` depending on the target.
    #[allow(clippy::unnecessary_cast)]
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCSTI as u64)?])?,
            rule(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCLINUX as u64)?])?,
        ],
    );
    let device = |mode_arg: u8| -> Result<Vec<SeccompRule>, String> {
        let fmt = libc::S_IFMT as u64;
        Ok(vec![
            rule(vec![cond(
                mode_arg,
                SeccompCmpOp::MaskedEq(fmt),
                libc::S_IFCHR as u64,
            )?])?,
            rule(vec![cond(
                mode_arg,
                SeccompCmpOp::MaskedEq(fmt),
                libc::S_IFBLK as u64,
            )?])?,
        ])
    };
    // The sandbox's PID 1 ends the call when keel closes its lifeline, and it runs in the
    // command's user namespace under the command's uid: a command that made it `SCHED_IDLE`
    // (or nice 19, or pinned it beside busy loops) starved it, and outlived its timeout, its
    // cancel and keel itself (attack pass of 2026-12-07). So no scheduling, affinity or limit
    // change of PID 1, and `setpriority` only of single processes (a process group — the
    // command's is PID 1's — or a user reaches PID 1 too); the command's own processes it may
    // renice, pin and schedule as it likes.
    #[allow(clippy::unnecessary_cast)]
    let (prio_process, ioprio_who_process) = (libc::PRIO_PROCESS as u64, 1u64);
    for nr in [
        libc::SYS_sched_setscheduler,
        libc::SYS_sched_setparam,
        libc::SYS_sched_setattr,
        libc::SYS_sched_setaffinity,
        libc::SYS_prlimit64,
    ] {
        rules.insert(nr, vec![rule(vec![cond(0, SeccompCmpOp::Eq, 1)?])?]);
    }
    for (nr, single) in [
        (libc::SYS_setpriority, prio_process),
        (libc::SYS_ioprio_set, ioprio_who_process),
    ] {
        rules.insert(
            nr,
            vec![
                rule(vec![cond(0, SeccompCmpOp::Ne, single)?])?,
                rule(vec![
                    cond(0, SeccompCmpOp::Eq, single)?,
                    cond(1, SeccompCmpOp::Eq, 1)?,
                ])?,
            ],
        );
    }
    rules.insert(libc::SYS_mknodat, device(2)?);
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_mknod, device(1)?);
    let always = [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        SYS_OPEN_TREE_ATTR,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_syslog,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_acct,
    ];
    for nr in always {
        rules.insert(nr, Vec::new());
    }
    Ok(rules)
}

/// Program 1 on x86_64: kill any x32 system call (`nr & __X32_SYSCALL_BIT`).
#[cfg(target_arch = "x86_64")]
fn x32_filter() -> BpfProgram {
    use seccompiler::sock_filter;
    // BPF_LD | BPF_W | BPF_ABS (0x00 | 0x00 | 0x20).
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JMP_JSET_K: u16 = 0x05 | 0x40;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    vec![
        // A = seccomp_data.nr (offset 0)
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        // if (A & X32_SYSCALL_BIT) kill else allow
        sock_filter {
            code: BPF_JMP_JSET_K,
            jt: 0,
            jf: 1,
            k: X32_SYSCALL_BIT,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_KILL_PROCESS,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ]
}

/// Classic BPF opcodes `chain` reads and writes (`linux/bpf_common.h`).
const BPF_RET_K: u16 = 0x06;
const BPF_JMP_JA: u16 = 0x05;

/// One program that answers as `programs` run in order, the first answer other than
/// `SECCOMP_RET_ALLOW` winning: every "return allow" of a program but the last becomes a jump to
/// the next program's first instruction (`BPF_JA`, whose 32-bit offset reaches anywhere in a
/// filter; conditional jumps stay inside their own program). Each program must begin by
/// loading what it tests (seccompiler's programs load the architecture first; program 1 loads
/// the number), since the accumulator is not reset between them.
fn chain(programs: Vec<BpfProgram>) -> BpfProgram {
    let count = programs.len();
    let mut out = Vec::with_capacity(programs.iter().map(Vec::len).sum());
    for (index, program) in programs.into_iter().enumerate() {
        let len = program.len();
        for (i, mut instruction) in program.into_iter().enumerate() {
            let allows = instruction.code == BPF_RET_K && instruction.k == libc::SECCOMP_RET_ALLOW;
            if allows && index + 1 < count {
                instruction = seccompiler::sock_filter {
                    code: BPF_JMP_JA,
                    jt: 0,
                    jf: 0,
                    // From the next instruction to this program's end.
                    k: (len - i - 1) as u32,
                };
            }
            out.push(instruction);
        }
    }
    out
}

/// More classic BPF opcodes: load a word of `seccomp_data`, and the conditional jumps.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
const BPF_JMP_JGT_K: u16 = 0x05 | 0x20;

/// `program` (seccompiler's, whose mismatch action is "allow") with an **index** of the
/// system call numbers its rules name inserted right after it loads the number: a binary search
/// over the numbers' ranges that returns "allow" at once for a number no rule names and falls
/// into seccompiler's rules for one that a rule names. The answer for every call is unchanged
/// (a number no rule names reaches seccompiler's final "allow" anyway); what changes is that
/// such a number runs ~8 instructions instead of two per rule, which the kernel does for every
/// system call number when it installs the filter (`seccomp_cache_prepare` emulates the filter
/// to find the calls it always allows, with interrupts off: ~0.17 ms a call in the profile
/// of 100 sandboxed calls). `program` is returned as it is when its layout is not the one
/// expected (no load of the number, a jump crossing the insertion point, an offset the 8-bit
/// conditional jumps cannot hold).
fn with_index(program: BpfProgram, numbers: &[i64]) -> BpfProgram {
    let Some(load) = program
        .iter()
        .position(|i| i.code == BPF_LD_W_ABS && i.k == 0)
    else {
        return program;
    };
    // Nothing before the load may jump past it.
    let crosses = program[..load].iter().enumerate().any(|(at, i)| {
        let class = i.code & 0x07;
        let jumps = class == 0x05;
        let far = if i.code == BPF_JMP_JA {
            i.k as usize
        } else {
            usize::from(i.jt.max(i.jf))
        };
        jumps && at + 1 + far > load
    });
    if crosses {
        return program;
    }
    let mut sorted: Vec<u32> = numbers
        .iter()
        .filter_map(|&n| u32::try_from(n).ok())
        .collect();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != numbers.len() {
        return program;
    }
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for n in sorted {
        match ranges.last_mut() {
            Some((_, hi)) if *hi + 1 == n => *hi = n,
            _ => ranges.push((n, n)),
        }
    }
    let Some(index) = index(&ranges) else {
        return program;
    };
    let mut out = program;
    out.splice(load + 1..load + 1, index);
    out
}

/// The code that returns "allow" for a number (in the accumulator) outside `ranges` (sorted,
/// disjoint) and falls off its end for one inside; `None` when an offset does not fit.
fn index(ranges: &[(u32, u32)]) -> Option<Vec<seccompiler::sock_filter>> {
    let insn = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
    let allow = insn(BPF_RET_K, 0, 0, libc::SECCOMP_RET_ALLOW);
    match ranges {
        [] => Some(vec![allow]),
        [(lo, hi)] => Some(vec![
            // Below: allow.
            insn(BPF_JMP_JGE_K, 0, 2, *lo),
            // Above: allow; inside: off the end.
            insn(BPF_JMP_JGT_K, 1, 0, *hi),
            insn(BPF_JMP_JA, 0, 0, 1),
            allow,
        ]),
        _ => {
            let (low, high) = ranges.split_at(ranges.len() / 2);
            let high_code = index(high)?;
            let low_code = index(low)?;
            // From the comparison: over the high half's code and the jump after it.
            let skip = u8::try_from(high_code.len() + 1).ok()?;
            let mut code = vec![insn(BPF_JMP_JGE_K, 0, skip, high[0].0)];
            code.extend(high_code);
            code.push(insn(BPF_JMP_JA, 0, 0, u32::try_from(low_code.len()).ok()?));
            code.extend(low_code);
            Some(code)
        }
    }
}

/// The chained filter for `network` (see the module docs).
///
/// Errors: an unsupported architecture, or a rule seccompiler refuses.
fn build(network: bool) -> Result<BpfProgram, String> {
    let rules = eperm_rules(network)?;
    let numbers: Vec<i64> = rules.keys().copied().collect();
    let eperm = with_index(
        compile(rules, SeccompAction::Errno(libc::EPERM as u32))?,
        &numbers,
    );
    #[cfg(target_arch = "x86_64")]
    let programs = vec![x32_filter(), eperm, clone3_program()?];
    #[cfg(not(target_arch = "x86_64"))]
    let programs = vec![eperm, clone3_program()?];
    Ok(chain(programs))
}

/// Program 3: `clone3` fails with ENOSYS.
fn clone3_program() -> Result<BpfProgram, String> {
    let mut clone3 = Rules::new();
    clone3.insert(libc::SYS_clone3, Vec::new());
    compile(clone3, SeccompAction::Errno(libc::ENOSYS as u32))
}

/// The filters of this process, compiled at first use: `[without network, with network]`.
static PROGRAMS: [std::sync::OnceLock<Result<BpfProgram, String>>; 2] =
    [std::sync::OnceLock::new(), std::sync::OnceLock::new()];

fn program(network: bool) -> &'static Result<BpfProgram, String> {
    PROGRAMS[usize::from(network)].get_or_init(|| build(network))
}

/// Compiles the filter for `network` now, so that processes forked later (a session holder's
/// calls) inherit it compiled.
pub(super) fn prepare(network: bool) {
    let _ = program(network);
}

/// Installs the filter on the calling thread (and so on everything it starts later).
/// `no_new_privs` must be set.
///
/// Errors: what failed (an unsupported architecture, a kernel without seccomp filters).
pub(super) fn install(network: bool) -> Result<(), String> {
    let program = program(network).as_ref().map_err(Clone::clone)?;
    seccompiler::apply_filter(program).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ret(k: u32) -> seccompiler::sock_filter {
        seccompiler::sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k,
        }
    }

    #[test]
    fn chaining_turns_each_allow_but_the_last_programs_into_a_jump_to_the_next_program() {
        let kill = libc::SECCOMP_RET_KILL_PROCESS;
        let allow = libc::SECCOMP_RET_ALLOW;
        let first = vec![ret(allow), ret(kill), ret(allow)];
        let second = vec![ret(allow)];
        let chained = chain(vec![first, second]);
        let codes: Vec<(u16, u32)> = chained.iter().map(|i| (i.code, i.k)).collect();
        // Instruction 0 jumps over 1 and 2 to 3; instruction 2 jumps over nothing to 3.
        assert_eq!(
            codes,
            [
                (BPF_JMP_JA, 2),
                (BPF_RET_K, kill),
                (BPF_JMP_JA, 0),
                (BPF_RET_K, allow)
            ]
        );
    }

    /// Runs `program` on one `seccomp_data` (number, architecture, six arguments) the way the
    /// kernel does, for the instructions seccompiler and this module emit; panics on another.
    fn run(program: &[seccompiler::sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut a: u32 = 0;
        let mut pc = 0usize;
        loop {
            let i = &program[pc];
            pc += 1;
            match i.code {
                BPF_LD_W_ABS => {
                    a = match i.k {
                        0 => nr,
                        4 => arch,
                        k if (16..64).contains(&k) => {
                            let arg = args[((k - 16) / 8) as usize];
                            if (k - 16) % 8 == 0 {
                                arg as u32
                            } else {
                                (arg >> 32) as u32
                            }
                        }
                        k => panic!("load of offset {k}"),
                    }
                }
                BPF_RET_K => return i.k,
                BPF_JMP_JA => pc += i.k as usize,
                0x54 => a &= i.k, // BPF_ALU | BPF_AND | BPF_K
                code if code & 0x07 == 0x05 => {
                    let taken = match code & 0xf0 {
                        0x10 => a == i.k,
                        0x20 => a > i.k,
                        0x30 => a >= i.k,
                        0x40 => a & i.k != 0,
                        other => panic!("jump {other:#x}"),
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                code => panic!("instruction {code:#x}"),
            }
        }
    }

    // `Ioctl` is `c_ulong` or `c_int` depending on the target.
    #[allow(clippy::unnecessary_cast)]
    #[test]
    fn the_index_changes_no_answer_for_any_call_number_architecture_or_argument() {
        let x86_64 = 0xc000_003e_u32; // AUDIT_ARCH_X86_64
        let i386 = 0x4000_0003_u32; // AUDIT_ARCH_I386
        let aarch64 = 0xc000_00b7_u32; // AUDIT_ARCH_AARCH64
        let values: Vec<u64> = (0u64..64)
            .chain([
                libc::TIOCSTI as u64,
                libc::TIOCLINUX as u64,
                libc::S_IFCHR as u64 | 0o644,
                libc::S_IFBLK as u64 | 0o600,
                libc::S_IFIFO as u64 | 0o600,
                libc::CLONE_NEWUSER as u64 | libc::SIGCHLD as u64,
                libc::CLONE_NEWNS as u64,
                libc::CLONE_NEWNET as u64,
                libc::CLONE_VM as u64 | libc::CLONE_THREAD as u64,
                libc::AF_INET as u64 | (1 << 32),
                u64::MAX,
            ])
            .collect();
        for network in [false, true] {
            let rules = eperm_rules(network).unwrap();
            let numbers: Vec<i64> = rules.keys().copied().collect();
            let plain = compile(rules, SeccompAction::Errno(libc::EPERM as u32)).unwrap();
            let indexed = with_index(plain.clone(), &numbers);
            assert!(
                indexed.len() > plain.len(),
                "the index was inserted (network={network})"
            );
            let chained_plain = chain(vec![x32_filter(), plain.clone(), clone3_program().unwrap()]);
            let chained = chain(vec![
                x32_filter(),
                indexed.clone(),
                clone3_program().unwrap(),
            ]);
            for nr in (0u32..600).chain([0x4000_0000 | 41, 0x4000_0000 | 272, u32::MAX]) {
                for arch in [x86_64, i386, aarch64] {
                    for (n, &v) in values.iter().enumerate() {
                        let w = values[(n * 7 + 3) % values.len()];
                        let args = [v, w, v, w, v, w];
                        assert_eq!(
                            run(&plain, nr, arch, args),
                            run(&indexed, nr, arch, args),
                            "nr {nr} arch {arch:#x} args {args:?} (network={network})"
                        );
                        assert_eq!(
                            run(&chained_plain, nr, arch, args),
                            run(&chained, nr, arch, args),
                            "chained: nr {nr} arch {arch:#x} args {args:?} (network={network})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn only_the_last_program_of_the_chained_filter_allows() {
        let last_program = clone3_program().expect("compiles").len();
        for network in [false, true] {
            let program = build(network).expect("the filter compiles");
            let last = program.len();
            let allows: Vec<usize> = (0..last)
                .filter(|&i| {
                    program[i].code == BPF_RET_K && program[i].k == libc::SECCOMP_RET_ALLOW
                })
                .collect();
            assert!(!allows.is_empty(), "network={network}");
            assert!(
                allows.iter().all(|&i| i >= last - last_program),
                "network={network}: an allow before the last program: {allows:?}"
            );
            for (i, ins) in program.iter().enumerate() {
                if ins.code == BPF_JMP_JA {
                    assert!(
                        i + 1 + (ins.k as usize) < last,
                        "jump {i} out of the filter"
                    );
                }
            }
        }
    }
}
