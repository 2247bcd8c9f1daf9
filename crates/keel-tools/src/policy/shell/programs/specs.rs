//! Option specifications ([`Spec`]) of the wrappers and launchers, as their getopt reads them.

use super::*;

pub(super) const NICE: Spec = Spec {
    values: "n",
    long_values: &["adjustment"],
    long_flags: &["help", "version"],
    numeric: true,
    ..SPEC
};
pub(super) const SPEC: Spec = Spec {
    flags: "",
    values: "",
    optional: "",
    long_flags: &[],
    long_values: &[],
    long_optional: &[],
    numeric: false,
};
pub(super) const TIMEOUT: Spec = Spec {
    flags: "v",
    values: "ks",
    long_flags: &[
        "preserve-status",
        "foreground",
        "verbose",
        "help",
        "version",
    ],
    long_values: &["kill-after", "signal"],
    ..SPEC
};
pub(super) const NOHUP: Spec = Spec {
    long_flags: &["help", "version"],
    ..SPEC
};
pub(super) const SETSID: Spec = Spec {
    flags: "cfwhV",
    long_flags: &["ctty", "fork", "wait", "help", "version"],
    ..SPEC
};
pub(super) const STDBUF: Spec = Spec {
    values: "ioe",
    long_values: &["input", "output", "error"],
    long_flags: &["help", "version"],
    ..SPEC
};
pub(super) const TIME: Spec = Spec {
    flags: "apqvhV",
    values: "fo",
    long_flags: &[
        "append",
        "portability",
        "quiet",
        "verbose",
        "help",
        "version",
    ],
    long_values: &["format", "output"],
    ..SPEC
};
pub(super) const FAKEROOT: Spec = Spec {
    flags: "uhv",
    values: "lfisb",
    long_flags: &["unknown-is-real", "help", "version"],
    long_values: &["lib", "faked", "fd-base"],
    ..SPEC
};
pub(super) const CHOOM: Spec = Spec {
    flags: "hV",
    values: "np",
    long_flags: &["help", "version"],
    long_values: &["adjust", "pid"],
    ..SPEC
};
pub(super) const SSH_AGENT: Spec = Spec {
    flags: "cDdks",
    values: "aEOPt",
    ..SPEC
};
pub(super) const IONICE: Spec = Spec {
    flags: "tpPuhV",
    values: "cn",
    long_flags: &["ignore", "pid", "pgid", "uid", "help", "version"],
    long_values: &["class", "classdata"],
    ..SPEC
};
pub(super) const CHRT: Spec = Spec {
    flags: "bdfioRrampvhV",
    values: "TPD",
    long_flags: &[
        "batch",
        "deadline",
        "fifo",
        "idle",
        "other",
        "rr",
        "reset-on-fork",
        "all-tasks",
        "max",
        "pid",
        "verbose",
        "help",
        "version",
    ],
    long_values: &["sched-runtime", "sched-period", "sched-deadline"],
    ..SPEC
};
pub(super) const TASKSET: Spec = Spec {
    flags: "apchV",
    long_flags: &["all-tasks", "pid", "cpu-list", "help", "version"],
    ..SPEC
};
pub(super) const SETARCH: Spec = Spec {
    flags: "BFILRSTXZ3vhV",
    long_flags: &[
        "32bit",
        "fdpic-funcptrs",
        "short-inode",
        "addr-compat-layout",
        "addr-no-randomize",
        "whole-seconds",
        "sticky-timeouts",
        "read-implies-exec",
        "mmap-page-zero",
        "3gb",
        "4gb",
        "uname-2.6",
        "verbose",
        "list",
        "help",
        "version",
    ],
    ..SPEC
};
pub(super) const COMMAND: Spec = Spec {
    flags: "pvV",
    ..SPEC
};
pub(super) const EXEC: Spec = Spec {
    flags: "cl",
    values: "a",
    ..SPEC
};
pub(super) const DOAS: Spec = Spec {
    flags: "Lns",
    values: "Cu",
    ..SPEC
};
pub(super) const SETPRIV: Spec = Spec {
    flags: "dhV",
    long_flags: &[
        "dump",
        "nnp",
        "no-new-privs",
        "clear-groups",
        "keep-groups",
        "init-groups",
        "reset-env",
        "help",
        "version",
    ],
    long_values: &[
        "ambient-caps",
        "inh-caps",
        "bounding-set",
        "ruid",
        "euid",
        "rgid",
        "egid",
        "reuid",
        "regid",
        "groups",
        "securebits",
        "pdeathsig",
        "selinux-label",
        "apparmor-profile",
    ],
    ..SPEC
};
pub(super) const UNSHARE: Spec = Spec {
    flags: "frchV",
    values: "RwSG",
    optional: "muinpUCT",
    long_flags: &[
        "fork",
        "map-root-user",
        "map-current-user",
        "map-auto",
        "keep-caps",
        "help",
        "version",
    ],
    long_values: &[
        "map-user",
        "map-group",
        "map-users",
        "map-groups",
        "propagation",
        "setgroups",
        "root",
        "wd",
        "setuid",
        "setgid",
        "monotonic",
        "boottime",
    ],
    long_optional: &[
        "mount",
        "uts",
        "ipc",
        "net",
        "pid",
        "user",
        "cgroup",
        "time",
        "kill-child",
        "mount-proc",
    ],
    numeric: false,
};
pub(super) const NSENTER: Spec = Spec {
    flags: "aFZhV",
    values: "tSGW",
    optional: "muinpCUTrw",
    long_flags: &[
        "all",
        "preserve-credentials",
        "no-fork",
        "follow-context",
        "help",
        "version",
    ],
    long_values: &["target", "setuid", "setgid", "wdns"],
    long_optional: &[
        "mount", "uts", "ipc", "net", "pid", "cgroup", "user", "time", "root", "wd",
    ],
    numeric: false,
};
pub(super) const CHROOT: Spec = Spec {
    long_flags: &["skip-chdir", "help", "version"],
    long_values: &["groups", "userspec"],
    ..SPEC
};
pub(super) const SUDO: Spec = Spec {
    optional: "",
    flags: "AbBEHKknPSVvlies",
    values: "CDgpRrtTUu",
    long_flags: &[
        "askpass",
        "background",
        "bell",
        "preserve-env",
        "set-home",
        "remove-timestamp",
        "reset-timestamp",
        "non-interactive",
        "preserve-groups",
        "stdin",
        "version",
        "validate",
        "list",
        "login",
        "edit",
        "shell",
        "help",
    ],
    long_values: &[
        "close-from",
        "chdir",
        "group",
        "prompt",
        "chroot",
        "role",
        "type",
        "command-timeout",
        "other-user",
        "user",
        "host",
    ],
    long_optional: &["preserve-env"],
    numeric: false,
};
pub(super) const STRACE: Spec = Spec {
    optional: "",
    flags: "AcCdDfFhiknqrtTvVwxyYzZ",
    values: "abeEIoOpPsSuUX",
    long_flags: &[
        "follow-forks",
        "output-separately",
        "instruction-pointer",
        "stack-traces",
        "syscall-number",
        "output-append-mode",
        "no-abbrev",
        "summary-only",
        "summary",
        "summary-wall-clock",
        "successful-only",
        "failed-only",
        "seccomp-bpf",
        "debug",
        "help",
        "version",
    ],
    long_values: &[
        "env",
        "attach",
        "user",
        "detach-on",
        "interruptible",
        "trace",
        "signal",
        "status",
        "trace-path",
        "columns",
        "abbrev",
        "verbose",
        "raw",
        "read",
        "write",
        "kvm",
        "output",
        "string-limit",
        "const-print-style",
        "summary-syscall-overhead",
        "summary-sort-by",
        "summary-columns",
        "inject",
        "fault",
    ],
    long_optional: &[
        "daemonize",
        "quiet",
        "relative-timestamps",
        "absolute-timestamps",
        "syscall-times",
        "strings-in-hex",
        "decode-fds",
        "decode-pids",
        "tips",
    ],
    numeric: false,
};
pub(super) const ENV: Spec = Spec {
    optional: "",
    flags: "i0v",
    values: "uCS",
    long_flags: &[
        "ignore-environment",
        "null",
        "debug",
        "list-signal-handling",
        "help",
        "version",
    ],
    long_values: &["unset", "chdir", "split-string"],
    long_optional: &["block-signal", "default-signal", "ignore-signal"],
    numeric: false,
};
pub(super) const FLOCK: Spec = Spec {
    flags: "sxenouFhV",
    values: "wEc",
    long_flags: &[
        "shared",
        "exclusive",
        "unlock",
        "nonblock",
        "nb",
        "close",
        "no-fork",
        "verbose",
        "help",
        "version",
    ],
    long_values: &["timeout", "wait", "conflict-exit-code", "command"],
    ..SPEC
};
pub(super) const WATCH: Spec = Spec {
    flags: "bcCegptwxrhv",
    values: "nq",
    optional: "d",
    long_flags: &[
        "beep", "color", "no-color", "errexit", "chgexit", "precise", "no-title", "no-wrap",
        "exec", "no-rerun", "help", "version",
    ],
    long_values: &["interval", "equexit"],
    long_optional: &["differences"],
    numeric: false,
};
pub(super) const XARGS: Spec = Spec {
    flags: "0oprtx",
    values: "adEILnPs",
    optional: "eil",
    long_flags: &[
        "null",
        "open-tty",
        "interactive",
        "no-run-if-empty",
        "verbose",
        "exit",
        "show-limits",
        "help",
        "version",
    ],
    long_values: &[
        "arg-file",
        "delimiter",
        "max-args",
        "max-procs",
        "max-chars",
        "process-slot-var",
    ],
    long_optional: &["eof", "replace", "max-lines"],
    numeric: false,
};
