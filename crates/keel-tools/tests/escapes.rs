//! Escapes from the `shell` sandbox (issue 11, items 1–5). Each attack first runs unconfined
//! (`off`) and must succeed there — so a missing tool (python3, psql, ip, losetup, setpriv) fails
//! the test instead of making it pass — then runs confined and must fail.
//!
//! They run the real sandbox through this crate's `keel-sandbox` binary: a host process that
//! spawns `bash -c SCRIPT` through `Sandbox::spawn` exactly as `shell` does (own process group,
//! stdin `/dev/null`), so a test can also kill the host or run it as another user. Attacks a normal
//! user can make too run again as uid 65534 (`setpriv --reuid=65534 --regid=65534
//! --clear-groups`), where the sandbox is built without any privilege (unprivileged user
//! namespaces). Tests that create device nodes, raw/XDP/netlink-admin sockets or loop devices
//! run as root only: a normal user cannot do those even unconfined.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub(crate) const OFF: &str = "off";
pub(crate) const WW: &str = "workspace_write";
pub(crate) const RO: &str = "read_only";
pub(crate) const CONFINED: [&str; 2] = [WW, RO];
pub(crate) const NOBODY: u32 = 65534;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Who {
    Root,
    Nobody,
}

pub(crate) const BOTH: [Who; 2] = [Who::Root, Who::Nobody];

/// The `keel-sandbox` binary, where uid 65534 can run it: the build's own when every directory
/// above it is world-searchable, else a copy in /tmp.
pub(crate) fn binary(who: Who) -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_keel-sandbox"));
    if who == Who::Root {
        return built;
    }
    static COPY: OnceLock<PathBuf> = OnceLock::new();
    COPY.get_or_init(|| {
        let reachable = built
            .ancestors()
            .skip(1)
            .all(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
        if reachable {
            return built.clone();
        }
        let dir = Path::new("/tmp/keel-tools-test-launcher");
        std::fs::create_dir_all(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let tmp = dir.join(format!("keel-sandbox.{}", std::process::id()));
        std::fs::copy(&built, &tmp).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        let to = dir.join("keel-sandbox");
        std::fs::rename(&tmp, &to).unwrap();
        to
    })
    .clone()
}

pub(crate) fn chown_tree(path: &Path, uid: u32) {
    let out = Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{uid}"))
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "chown: {out:?}");
}

/// A workspace (`ws/` in a fresh temp dir under /tmp) owned by `who`.
pub(crate) struct Sbx {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) who: Who,
}

/// What a run printed (stdout then stderr) and how it ended.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: Option<i32>,
    pub(crate) text: String,
}

impl Run {
    pub(crate) fn has(&self, needle: &str) -> bool {
        self.text.contains(needle)
    }
}

impl Sbx {
    pub(crate) fn new(who: Who) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(dir.path().join("ws")).unwrap();
        if who == Who::Nobody {
            chown_tree(dir.path(), NOBODY);
        }
        Self { dir, who }
    }

    pub(crate) fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.ws().join(rel)
    }

    /// Writes a file in the workspace (owned by the workspace's user).
    pub(crate) fn write(&self, rel: &str, text: &str) {
        std::fs::write(self.path(rel), text).unwrap();
        if self.who == Who::Nobody {
            chown_tree(&self.path(rel), NOBODY);
        }
    }

    /// The host command running `script` under `mode` (`extra`: more `keel-sandbox` flags).
    pub(crate) fn command(&self, mode: &str, extra: &[&str], script: &str) -> Command {
        let mut c = match self.who {
            Who::Root => Command::new(binary(Who::Root)),
            Who::Nobody => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                    .arg(binary(Who::Nobody));
                c
            }
        };
        c.args(["--mode", mode, "--workspace"])
            .arg(self.ws())
            .args(extra)
            .args(["--", "bash", "-c", script])
            .current_dir(self.ws())
            .stdin(Stdio::null());
        c
    }

    pub(crate) fn run_with(&self, mode: &str, extra: &[&str], script: &str) -> Run {
        let out = self.command(mode, extra, script).output().unwrap();
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        Run {
            code: out.status.code(),
            text,
        }
    }

    pub(crate) fn run(&self, mode: &str, script: &str) -> Run {
        self.run_with(mode, &[], script)
    }
}

/// A directory outside the workspace that confined commands still see (read-only): under
/// /var/tmp, which the sandbox does not replace (everything under /tmp is hidden anyway).
pub(crate) fn visible_outside(who: Who) -> tempfile::TempDir {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    if who == Who::Nobody {
        chown_tree(dir.path(), NOBODY);
    }
    dir
}

fn wait_until(deadline: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    ok()
}

/// Whether a process whose command line contains `mark` is running.
fn running(mark: &str) -> bool {
    Command::new("pgrep")
        .args(["-f", mark])
        .output()
        .unwrap()
        .status
        .success()
}

fn kill_all(mark: &str) {
    let _ = Command::new("pkill").args(["-9", "-f", mark]).output();
}

fn mark(s: &Sbx) -> String {
    format!(
        "keel-escape-{}",
        s.dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace('.', "")
    )
}

// --- item 1: metadata outside the workspace, chmod inside in read_only ----------------------

fn metadata_attack(target: &Path, with_chown: bool) -> String {
    let t = target.display();
    let chown = if with_chown {
        format!("chown 1:1 '{t}' && echo chown-ok;")
    } else {
        String::new()
    };
    format!(
        "chmod 600 '{t}' && echo chmod-ok; {chown} python3 -c 'import os; os.setxattr(\"{t}\", \"user.keel\", b\"x\")' && echo xattr-ok; touch -d @1000000000 '{t}' && echo utime-ok"
    )
}

fn has_xattr(path: &Path) -> bool {
    let out = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import os; print('user.keel' in os.listxattr('{}'))",
            path.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "python3: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim() == "True"
}

fn metadata_outside(who: Who) {
    let s = Sbx::new(who);
    let outside = visible_outside(who);
    let target = outside.path().join("victim.txt");
    let fresh = || {
        std::fs::write(&target, "outside\n").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        if who == Who::Nobody {
            chown_tree(&target, NOBODY);
        }
        std::fs::metadata(&target).unwrap()
    };
    let chown = who == Who::Root;
    let attack = metadata_attack(&target, chown);

    let before = fresh();
    let r = s.run(OFF, &attack);
    let mut oks = vec!["chmod-ok", "xattr-ok", "utime-ok"];
    if chown {
        oks.push("chown-ok");
    }
    for ok in &oks {
        assert!(r.has(ok), "unconfined, {ok} missing ({who:?}): {r:?}");
    }
    let after = std::fs::metadata(&target).unwrap();
    assert_eq!(after.mode() & 0o777, 0o600);
    assert_eq!(after.mtime(), 1_000_000_000);
    assert!(has_xattr(&target));
    if chown {
        assert_eq!(after.uid(), 1);
    }
    assert_ne!(before.mtime(), after.mtime());

    for mode in CONFINED {
        let _ = std::fs::remove_file(&target);
        let before = fresh();
        let r = s.run(mode, &attack);
        for ok in &oks {
            assert!(!r.has(ok), "{mode} ({who:?}) let {ok} through: {r:?}");
        }
        assert!(r.has("Read-only file system"), "{mode}: {r:?}");
        let after = std::fs::metadata(&target).unwrap();
        assert_eq!(after.mode(), before.mode(), "{mode}");
        assert_eq!(after.uid(), before.uid(), "{mode}");
        assert_eq!(after.mtime(), before.mtime(), "{mode}");
        assert!(!has_xattr(&target), "{mode}");
    }
}

#[test]
fn metadata_changes_outside_the_workspace_fail_confined() {
    metadata_outside(Who::Root);
}

#[test]
fn metadata_changes_outside_the_workspace_fail_confined_for_a_normal_user() {
    metadata_outside(Who::Nobody);
}

#[test]
fn chmod_inside_the_workspace_fails_in_read_only() {
    for who in BOTH {
        let s = Sbx::new(who);
        s.write("mine.txt", "x\n");
        std::fs::set_permissions(s.path("mine.txt"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        let attack = "chmod 600 mine.txt && echo chmod-ok";
        let r = s.run(WW, attack);
        assert!(r.has("chmod-ok"), "workspace_write ({who:?}): {r:?}");
        std::fs::set_permissions(s.path("mine.txt"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        let r = s.run(RO, attack);
        assert!(!r.has("chmod-ok"), "read_only ({who:?}): {r:?}");
        assert!(r.has("Read-only file system"), "{r:?}");
        let mode = std::fs::metadata(s.path("mine.txt")).unwrap().mode();
        assert_eq!(mode & 0o777, 0o644);
    }
}

// --- item 2: device nodes, loop devices, /dev/kmsg (root only) --------------------------------

struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).output();
    }
}

#[test]
fn device_nodes_cannot_be_made_and_a_loop_device_cannot_be_written_through() {
    let s = Sbx::new(Who::Root);
    let outside = visible_outside(Who::Root);
    let image = outside.path().join("disk.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let out = Command::new("losetup")
        .args(["-f", "--show"])
        .arg(&image)
        .output()
        .unwrap();
    assert!(out.status.success(), "losetup: {out:?}");
    let dev = Loop(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    let rdev = std::fs::metadata(&dev.0).unwrap().rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let through = |name: &str| {
        format!(
            "printf pwned-through-loop | dd of={name} conv=notrunc,fsync status=none && echo wrote-{name}"
        )
    };
    let make = format!(
        "mknod blk b {major} {minor} && echo mknod-ok && {}; mknod chr c 1 7 && echo chr-ok",
        through("blk")
    );

    let r = s.run(OFF, &make);
    assert!(
        r.has("mknod-ok") && r.has("wrote-blk") && r.has("chr-ok"),
        "unconfined: {r:?}"
    );
    assert!(
        std::fs::read(&image)
            .unwrap()
            .starts_with(b"pwned-through-loop")
    );

    // Confined: no new node, and a node that is already in the workspace does not open.
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    for f in ["blk", "chr"] {
        std::fs::remove_file(s.path(f)).unwrap();
    }
    let pre = Command::new("mknod")
        .arg(s.path("pre"))
        .args(["b", &major.to_string(), &minor.to_string()])
        .output()
        .unwrap();
    assert!(pre.status.success(), "{pre:?}");
    for mode in CONFINED {
        let r = s.run(mode, &format!("{make}; {}", through("pre")));
        for ok in ["mknod-ok", "chr-ok", "wrote-blk", "wrote-pre"] {
            assert!(!r.has(ok), "{mode} let {ok} through: {r:?}");
        }
        assert!(!s.path("blk").exists() && !s.path("chr").exists());
        assert!(
            std::fs::read(&image).unwrap().iter().all(|&b| b == 0),
            "{mode}: the image outside was written"
        );
    }
}

#[test]
fn dev_kmsg_is_not_writable_confined() {
    let s = Sbx::new(Who::Root);
    let attack = "echo keel-sandbox-escape-test > /dev/kmsg && echo kmsg-ok";
    let r = s.run(OFF, attack);
    assert!(r.has("kmsg-ok"), "unconfined: {r:?}");
    for mode in CONFINED {
        let r = s.run(mode, attack);
        assert!(!r.has("kmsg-ok"), "{mode}: {r:?}");
    }
}

// --- item 3: socket families, foreign syscall ABIs, io_uring ----------------------------------

/// A UDP datagram with a spoofed source, written as a raw Ethernet frame on `lo` to one of the
/// host's own addresses (frames to 127.0.0.1 are dropped as martians on input).
const PACKET: &str = r#"
import socket, struct, sys
dst, port = sys.argv[1], int(sys.argv[2])
def csum(b):
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
payload = b'pwned-by-af-packet'
udp = struct.pack('!HHHH', 40000, port, 8 + len(payload), 0) + payload
ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                 socket.inet_aton('10.9.8.7'), socket.inet_aton(dst))
ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(('lo', 0))
s.send(b'\0' * 12 + b'\x08\x00' + ip + udp)
print('packet-sent', flush=True)
"#;

/// One of this host's global IPv4 addresses.
fn host_address() -> String {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .unwrap_or_else(|| panic!("no global IPv4 address to send a frame to: {text}"))
        .to_owned()
}

#[test]
fn af_packet_cannot_deliver_a_raw_frame_to_a_local_listener() {
    let s = Sbx::new(Who::Root);
    s.write("packet.py", PACKET);
    let listener = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let attack = format!("python3 packet.py {} {port}", host_address());

    let r = s.run(OFF, &attack);
    assert!(r.has("packet-sent"), "unconfined: {r:?}");
    listener
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = listener.recv_from(&mut buf).expect("the raw frame arrived");
    assert_eq!(&buf[..n], b"pwned-by-af-packet");
    assert_eq!(from.ip().to_string(), "10.9.8.7", "the spoofed source");

    listener
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    for (mode, extra) in [(WW, &[][..]), (RO, &[][..]), (WW, &["--network"][..])] {
        let r = s.run_with(mode, extra, &attack);
        assert!(!r.has("packet-sent"), "{mode} {extra:?}: {r:?}");
        assert!(r.has("Operation not permitted"), "{r:?}");
        assert!(listener.recv(&mut buf).is_err(), "{mode}: a frame arrived");
    }
}

fn lo_has(address: &str) -> bool {
    let out = Command::new("ip")
        .args(["-4", "addr", "show", "dev", "lo"])
        .output()
        .unwrap();
    assert!(out.status.success(), "ip: {out:?}");
    String::from_utf8_lossy(&out.stdout).contains(address)
}

#[test]
fn af_netlink_cannot_add_an_address_to_an_interface() {
    let s = Sbx::new(Who::Root);
    let address = "198.51.100.77";
    let attack = format!("ip addr add {address}/32 dev lo && echo added");
    struct Remove(&'static str);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = Command::new("ip")
                .args(["addr", "del", &format!("{}/32", self.0), "dev", "lo"])
                .output();
        }
    }
    let _cleanup = Remove("198.51.100.77");

    let r = s.run(OFF, &attack);
    assert!(r.has("added") && lo_has(address), "unconfined: {r:?}");
    drop(Remove(address));
    assert!(!lo_has(address));

    for (mode, extra) in [(WW, &[][..]), (RO, &[][..]), (WW, &["--network"][..])] {
        let r = s.run_with(mode, extra, &attack);
        assert!(!r.has("added"), "{mode} {extra:?}: {r:?}");
        assert!(!lo_has(address), "{mode} {extra:?}: the address was added");
    }
}

const FAMILIES: &str = r#"
import socket
for name, family, kind in [('vsock', 40, socket.SOCK_STREAM), ('xdp', 44, socket.SOCK_RAW)]:
    try:
        socket.socket(family, kind)
        print(name + '-ok', flush=True)
    except OSError as e:
        print(name, e, flush=True)
"#;

#[test]
fn af_vsock_and_af_xdp_sockets_are_refused_confined() {
    for who in BOTH {
        let s = Sbx::new(who);
        s.write("families.py", FAMILIES);
        let r = s.run(OFF, "python3 families.py");
        assert!(r.has("vsock-ok"), "unconfined ({who:?}): {r:?}");
        // XDP needs CAP_NET_RAW: only root opens one unconfined.
        if who == Who::Root {
            assert!(r.has("xdp-ok"), "unconfined: {r:?}");
        }
        for (mode, extra) in [(WW, &[][..]), (RO, &[][..]), (WW, &["--network"][..])] {
            let r = s.run_with(mode, extra, "python3 families.py");
            assert!(
                !r.has("vsock-ok") && !r.has("xdp-ok"),
                "{mode} {who:?}: {r:?}"
            );
            assert!(r.has("vsock [Errno 1] Operation not permitted"), "{r:?}");
        }
    }
}

/// `socketcall(SYS_SOCKET, {AF_INET, SOCK_STREAM, 0})` through `int 0x80` from a 64-bit
/// process: the 32-bit ABI, which a filter written for x86_64 numbers would not see.
#[cfg(target_arch = "x86_64")]
const INT80: &str = r#"
import ctypes, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
page = libc.mmap(None, 4096, 7, 0x22 | 0x40, -1, 0)   # RWX, MAP_32BIT: 32-bit addresses
ctypes.memmove(page + 256, struct.pack('<III', 2, 1, 0), 12)
code = (bytes([0x53, 0xb8, 0x66, 0, 0, 0, 0xbb, 1, 0, 0, 0, 0xb9]) + struct.pack('<I', page + 256)
        + bytes([0xcd, 0x80, 0x5b, 0xc3]))  # push rbx; eax=102; ebx=1; ecx=args; int 0x80; pop rbx; ret
ctypes.memmove(page, code, len(code))
print('socketcall-fd', ctypes.CFUNCTYPE(ctypes.c_int)(page)(), flush=True)
"#;

#[cfg(target_arch = "x86_64")]
#[test]
fn i386_socketcall_through_int_0x80_kills_the_command_confined() {
    for who in BOTH {
        let s = Sbx::new(who);
        s.write("int80.py", INT80);
        let r = s.run(OFF, "python3 int80.py");
        let fd: i32 = r
            .text
            .lines()
            .find_map(|l| l.strip_prefix("socketcall-fd "))
            .unwrap_or_else(|| panic!("unconfined ({who:?}): {r:?}"))
            .trim()
            .parse()
            .unwrap();
        assert!(
            fd >= 0,
            "unconfined, no AF_INET socket through int 0x80: {r:?}"
        );
        for mode in CONFINED {
            let r = s.run(mode, "python3 int80.py; echo \"status $?\"");
            assert!(!r.has("socketcall-fd"), "{mode} {who:?}: {r:?}");
            // 128 + SIGSYS: killed by the filter.
            assert!(r.has("status 159"), "{mode} {who:?}: {r:?}");
        }
    }
}

/// `socket(AF_INET, SOCK_STREAM)` with the x32 numbering (`0x40000000 | 41`).
#[cfg(target_arch = "x86_64")]
const X32: &str = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(0x40000000 + 41, 2, 1, 0)
print('x32-returned', r, 'errno', ctypes.get_errno(), flush=True)
"#;

/// This machine's kernel has no x32 ABI (`CONFIG_X86_X32_ABI` unset), so unconfined the call
/// reaches the kernel and fails with ENOSYS (on a kernel with x32 it returns a socket): what
/// matters is that confined it never reaches the kernel and the process is killed.
#[cfg(target_arch = "x86_64")]
#[test]
fn x32_system_calls_kill_the_command_confined() {
    for who in BOTH {
        let s = Sbx::new(who);
        s.write("x32.py", X32);
        let r = s.run(OFF, "python3 x32.py");
        let line = r
            .text
            .lines()
            .find(|l| l.starts_with("x32-returned"))
            .unwrap_or_else(|| panic!("unconfined ({who:?}): {r:?}"))
            .to_owned();
        assert!(
            line.ends_with("errno 38") || !line.starts_with("x32-returned -1"),
            "unconfined: the x32 call neither ran nor reached the kernel: {line}"
        );
        for mode in CONFINED {
            let r = s.run(mode, "python3 x32.py; echo \"status $?\"");
            assert!(!r.has("x32-returned"), "{mode} {who:?}: {r:?}");
            assert!(r.has("status 159"), "{mode} {who:?}: {r:?}");
        }
    }
}

const IO_URING: &str = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
r = libc.syscall(425, 8, params)   # io_uring_setup(8, &params)
print('io_uring-fd' if r >= 0 else 'io_uring-refused', r, 'errno', ctypes.get_errno(), flush=True)
"#;

#[test]
fn io_uring_is_refused_confined() {
    for who in BOTH {
        let s = Sbx::new(who);
        s.write("uring.py", IO_URING);
        let r = s.run(OFF, "python3 uring.py");
        assert!(r.has("io_uring-fd"), "unconfined ({who:?}): {r:?}");
        for mode in CONFINED {
            let r = s.run(mode, "python3 uring.py");
            assert!(
                r.has("io_uring-refused -1 errno 1"),
                "{mode} {who:?}: {r:?}"
            );
        }
    }
}

// --- item 4: processes outliving the call or keel; keel's own process ------------------------

fn background(mark: &str) -> String {
    format!(
        "setsid sh -c 'sleep 2; echo alive >> late; : {mark}' >/dev/null 2>&1 < /dev/null & echo started"
    )
}

#[test]
fn a_setsid_background_job_does_not_outlive_the_call() {
    for who in BOTH {
        let s = Sbx::new(who);
        let mark = mark(&s);
        let r = s.run(OFF, &background(&mark));
        assert!(r.has("started"), "{r:?}");
        assert!(
            running(&mark),
            "unconfined ({who:?}): the job is gone already"
        );
        assert!(
            wait_until(Duration::from_secs(20), || s.path("late").exists()),
            "unconfined ({who:?}): the job did not write"
        );
        std::fs::remove_file(s.path("late")).unwrap();

        let r = s.run(WW, &background(&mark));
        assert!(r.has("started"), "{r:?}");
        // The namespace is gone when the call returns: nothing of it runs.
        assert!(
            !running(&mark),
            "confined ({who:?}): the job outlived the call"
        );
        std::thread::sleep(Duration::from_secs(4));
        assert!(
            !s.path("late").exists(),
            "confined ({who:?}): the job wrote"
        );
        kill_all(&mark);
    }
}

#[test]
fn a_background_job_does_not_outlive_keel_killed() {
    for who in BOTH {
        for mode in [OFF, WW] {
            let s = Sbx::new(who);
            let mark = mark(&s);
            let script = format!(
                "setsid sh -c 'sleep 2; echo alive >> late; : {mark}' >/dev/null 2>&1 < /dev/null & echo x > started; sleep 30 # {mark}"
            );
            let mut host = s
                .command(mode, &[], &script)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            assert!(wait_until(Duration::from_secs(20), || s
                .path("started")
                .exists()));
            host.kill().unwrap();
            host.wait().unwrap();
            if mode == OFF {
                assert!(running(&mark), "unconfined ({who:?}): nothing left running");
                assert!(
                    wait_until(Duration::from_secs(20), || s.path("late").exists()),
                    "unconfined ({who:?}): the job did not write"
                );
            } else {
                assert!(
                    wait_until(Duration::from_secs(10), || !running(&mark)),
                    "{mode} ({who:?}): the command outlived keel"
                );
                std::thread::sleep(Duration::from_secs(3));
                assert!(!s.path("late").exists(), "{mode} ({who:?}): the job wrote");
            }
            kill_all(&mark);
        }
    }
}

/// A stand-in for the keel process (same user): `sleep`, with a marker in its environment.
fn victim(who: Who) -> std::process::Child {
    let mut c = match who {
        Who::Root => Command::new("sleep"),
        Who::Nobody => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "sleep"]);
            c
        }
    };
    let child = c
        .arg("60")
        .env("KEEL_VICTIM_MARK", "victim-environ-visible")
        .spawn()
        .unwrap();
    // `setpriv` becomes `sleep` (as the user) only once it has executed it.
    let comm = format!("/proc/{}/comm", child.id());
    assert!(wait_until(Duration::from_secs(20), || {
        std::fs::read_to_string(&comm).is_ok_and(|c| c.trim() == "sleep")
    }));
    child
}

#[test]
fn keels_process_cannot_be_read_or_killed_from_the_sandbox() {
    for who in BOTH {
        let s = Sbx::new(who);
        let attack = |pid: u32| {
            format!(
                "tr '\\0' '\\n' < /proc/{pid}/environ | grep KEEL_VICTIM_MARK; kill -9 {pid} && echo killed"
            )
        };
        let mut v = victim(who);
        let r = s.run(OFF, &attack(v.id()));
        assert!(
            r.has("victim-environ-visible") && r.has("killed"),
            "unconfined ({who:?}): {r:?}"
        );
        assert!(v.wait().unwrap().code().is_none(), "the victim was killed");

        for mode in CONFINED {
            let mut v = victim(who);
            let r = s.run(mode, &attack(v.id()));
            assert!(
                !r.has("victim-environ-visible") && !r.has("killed"),
                "{mode} ({who:?}): {r:?}"
            );
            assert!(v.try_wait().unwrap().is_none(), "{mode}: the victim died");
            v.kill().unwrap();
            v.wait().unwrap();
        }
    }
}

// --- item 5: keel's files, the environment, local services -----------------------------------

#[test]
fn keels_store_seal_key_and_config_are_hidden() {
    for who in BOTH {
        let s = Sbx::new(who);
        let outside = visible_outside(who);
        let data = outside.path().join("data/keel");
        let config = outside.path().join("config/keel");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(data.join("keel.db"), "STORE-ROW-SECRET").unwrap();
        std::fs::write(data.join("seal.key"), "SEAL-KEY-SECRET").unwrap();
        std::fs::write(config.join("keel.toml"), "CONFIG-SECRET").unwrap();
        // A store the user keeps inside the workspace.
        s.write("keel.db", "WS-STORE-SECRET");
        if who == Who::Nobody {
            chown_tree(outside.path(), NOBODY);
        }
        let attack = format!(
            "cat '{d}/keel.db' '{d}/seal.key' '{c}/keel.toml' keel.db; ls '{d}'",
            d = data.display(),
            c = config.display()
        );
        let ws_store = s.path("keel.db");
        let hide = [
            "--hide",
            data.to_str().unwrap(),
            "--hide",
            config.to_str().unwrap(),
            "--hide",
            ws_store.to_str().unwrap(),
        ];
        let secrets = [
            "STORE-ROW-SECRET",
            "SEAL-KEY-SECRET",
            "CONFIG-SECRET",
            "WS-STORE-SECRET",
        ];
        let r = s.run_with(OFF, &hide, &attack);
        for secret in secrets {
            assert!(r.has(secret), "unconfined ({who:?}), {secret}: {r:?}");
        }
        for mode in CONFINED {
            let r = s.run_with(mode, &hide, &attack);
            for secret in secrets {
                assert!(!r.has(secret), "{mode} ({who:?}) showed {secret}: {r:?}");
            }
        }
        // Hidden, not removed.
        assert_eq!(
            std::fs::read_to_string(s.path("keel.db")).unwrap(),
            "WS-STORE-SECRET"
        );
    }
}

#[test]
fn secret_and_provider_variables_are_scrubbed_in_every_mode() {
    let vars = [
        ("OPENAI_API_KEY", "sk-scrub-0001"),
        ("ANTHROPIC_API_KEY", "sk-ant-scrub-0002"),
        ("MY_SERVICE_TOKEN", "token-scrub-0003"),
        ("AWS_SECRET_ACCESS_KEY", "aws-scrub-0004"),
        ("db_password", "pw-scrub-0005"),
        ("GITHUB_TOKEN", "ghp-scrub-0006"),
        ("CUSTOM_LLM_CRED", "custom-scrub-0007"),
        ("PLAIN_SETTING", "plain-visible-0008"),
    ];
    // Baseline: a process keel starts without the scrub sees them all.
    let mut plain = Command::new("bash");
    plain.args(["-c", "env"]).envs(vars);
    let baseline = String::from_utf8_lossy(&plain.output().unwrap().stdout).into_owned();
    for (_, value) in vars {
        assert!(baseline.contains(value), "{baseline}");
    }
    let s = Sbx::new(Who::Root);
    for mode in [OFF, RO, WW] {
        let mut c = s.command(mode, &["--withhold", "CUSTOM_LLM_CRED"], "env");
        c.envs(vars);
        let out = String::from_utf8_lossy(&c.output().unwrap().stdout).into_owned();
        for (name, value) in vars {
            assert_eq!(
                out.contains(value),
                name == "PLAIN_SETTING",
                "{mode}: {name}: {out}"
            );
        }
        // Passed explicitly (`[env]` entries): keel's own value, or one set in the config.
        let mut c = s.command(
            mode,
            &[
                "--withhold",
                "CUSTOM_LLM_CRED",
                "--pass",
                "GITHUB_TOKEN",
                "--pass",
                "CUSTOM_LLM_CRED",
                "--set",
                "DEPLOY_KEY=from-config-0009",
            ],
            "env",
        );
        c.envs(vars);
        let out = String::from_utf8_lossy(&c.output().unwrap().stdout).into_owned();
        for wanted in [
            "GITHUB_TOKEN=ghp-scrub-0006",
            "CUSTOM_LLM_CRED=custom-scrub-0007",
            "DEPLOY_KEY=from-config-0009",
        ] {
            assert!(out.contains(wanted), "{mode}: {wanted}: {out}");
        }
        assert!(!out.contains("sk-scrub-0001"), "{mode}: {out}");
    }
}

#[test]
fn psql_through_the_local_postgresql_socket_fails_confined() {
    for who in BOTH {
        let s = Sbx::new(who);
        let attack = "psql -h /var/run/postgresql -U postgres -d postgres -XAtc 'select 4242'";
        let r = s.run(OFF, attack);
        assert!(r.has("4242"), "unconfined ({who:?}): {r:?}");
        for (mode, extra) in [(WW, &[][..]), (RO, &[][..]), (WW, &["--network"][..])] {
            let r = s.run_with(mode, extra, attack);
            assert!(!r.has("4242"), "{mode} {extra:?} ({who:?}): {r:?}");
            assert!(r.has("No such file or directory"), "{r:?}");
        }
    }
}

// --- privileges: capabilities and no_new_privs ----------------------------------------------

/// Every capability set is empty and `no_new_privs` is on in a confined command (as root, whose
/// user namespace would otherwise give it a full set, and as a normal user). Unconfined the
/// same command shows the bounding set full and `no_new_privs` off (and root's effective set).
#[test]
fn a_confined_command_has_no_capabilities_and_no_new_privs() {
    const SETS: [&str; 5] = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];
    let attack = "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/self/status";
    let none = |set: &str| format!("{set}:\t0000000000000000");
    for who in BOTH {
        let s = Sbx::new(who);
        let r = s.run(OFF, attack);
        assert!(r.has("NoNewPrivs:\t0"), "unconfined ({who:?}): {r:?}");
        assert!(
            r.has("CapBnd:") && !r.has(&none("CapBnd")),
            "unconfined: {r:?}"
        );
        if who == Who::Root {
            assert!(
                r.has("CapEff:") && !r.has(&none("CapEff")),
                "unconfined: {r:?}"
            );
        }
        for mode in CONFINED {
            let r = s.run(mode, attack);
            for set in SETS {
                assert!(r.has(&none(set)), "{mode} ({who:?}) kept {set}: {r:?}");
            }
            assert!(r.has("NoNewPrivs:\t1"), "{mode} ({who:?}): {r:?}");
        }
    }
}

// --- required layers --------------------------------------------------------------------------

/// A sandbox inside the sandbox cannot create its namespaces (the filter refuses `unshare`):
/// the inner one must refuse to run its command, naming the missing layer, never run it looser.
#[test]
fn a_missing_namespace_fails_the_command_naming_the_layer() {
    let s = Sbx::new(Who::Root);
    // The inner launcher is run from inside the sandbox, where only the workspace and the
    // read-only root are visible (not /tmp, where a checkout may have its target dir): copy it
    // into the workspace.
    let inner = s.path("keel-sandbox-inner");
    std::fs::copy(binary(Who::Root), &inner).unwrap();
    let script = format!(
        "'{}' --mode workspace_write -- touch ran; echo \"inner $?\"",
        inner.display()
    );
    let r = s.run(OFF, &script);
    assert!(
        r.has("inner 0") && s.path("ran").exists(),
        "unconfined: {r:?}"
    );
    std::fs::remove_file(s.path("ran")).unwrap();
    let r = s.run(WW, &script);
    assert!(r.has("inner 125"), "{r:?}");
    assert!(
        r.has("sandbox `workspace_write` is unavailable: user namespace: "),
        "{r:?}"
    );
    assert!(!s.path("ran").exists(), "the command ran");
    assert_eq!(r.code, Some(0));
}

/// A confined command cannot slow, pin or limit the sandbox's PID 1 — which ends the call when
/// keel gives it up, and runs under the command's uid in its user namespace: made `SCHED_IDLE`
/// (or nice 19) beside busy loops it never ran again, and the command outlived its timeout,
/// its cancel and keel (attack pass of 2026-12-07). `renice` of PID 1, of its process group and
/// of the whole uid, `chrt`, `taskset` and `prlimit` of PID 1 all fail and change nothing;
/// the command still renices and reschedules its own processes.
#[test]
fn a_confined_command_cannot_slow_or_pin_the_sandboxs_pid_1() {
    let script = "renice -n 19 -p 1 >/dev/null 2>&1; echo r1=$?; \
                  renice -n 19 -g 1 >/dev/null 2>&1; echo r2=$?; \
                  renice -n 19 -u $(id -u) >/dev/null 2>&1; echo r3=$?; \
                  chrt -i -p 0 1 >/dev/null 2>&1; echo c=$?; \
                  taskset -p 1 1 >/dev/null 2>&1; echo t=$?; \
                  prlimit --pid 1 --nofile=10:10 >/dev/null 2>&1; echo p=$?; \
                  awk '{print \"pid1\", $19, $41}' /proc/1/stat; \
                  grep Cpus_allowed_list /proc/1/status; grep Cpus_allowed_list /proc/self/status; \
                  nice -n 5 awk '{print \"own\", $19}' /proc/self/stat; \
                  chrt -i 0 awk '{print \"ownidle\", $41}' /proc/self/stat";
    for who in BOTH {
        let s = Sbx::new(who);
        // The same tools work on the command's own processes (`own 5`, `ownidle 5`): the
        // refusals are the filter's, not missing tools.
        for mode in CONFINED {
            let r = s.run(mode, script);
            let what = format!("{mode} ({who:?})");
            for refused in ["r1=1", "r2=1", "r3=1", "c=1", "t=1", "p=1"] {
                assert!(r.has(refused), "{what}: {refused}: {r:?}");
            }
            assert!(r.has("pid1 0 0"), "{what}: PID 1 changed: {r:?}");
            let allowed: Vec<&str> = r
                .text
                .lines()
                .filter(|l| l.starts_with("Cpus_allowed_list"))
                .collect();
            assert_eq!(allowed.len(), 2, "{what}: {r:?}");
            assert_eq!(allowed[0], allowed[1], "{what}: PID 1 pinned: {r:?}");
            assert!(r.has("own 5"), "{what}: {r:?}");
            assert!(r.has("ownidle 5"), "{what}: {r:?}");
        }
    }
}
