//! A private PostgreSQL cluster for the chaos trials: `initdb` in a temporary directory, a
//! server on a free port of its own (never the shared 127.0.0.1:5432 other tests use), so a
//! trial can stop it hard (`pg_ctl stop -m immediate`: a crash, recovered from the WAL on start)
//! and start it again. `initdb` and `postgres` refuse to run as root: as root, every command
//! runs as the `postgres` user (`setpriv`).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// A running private cluster; stopped (immediately) and deleted on drop.
pub(super) struct PrivatePg {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
}

impl PrivatePg {
    /// `initdb` and start a cluster (trust authentication for `postgres` on 127.0.0.1).
    pub(super) fn start() -> Self {
        let bin = pg_bin();
        let dir = tempfile::Builder::new()
            .prefix("keel-chaos-pg")
            .tempdir()
            .unwrap();
        let as_postgres =
            String::from_utf8_lossy(&Command::new("id").arg("-u").output().unwrap().stdout).trim()
                == "0";
        let pg = PrivatePg {
            dir,
            bin,
            port: free_port(),
            as_postgres,
        };
        if as_postgres {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(pg.dir.path())
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown of the private cluster's directory to postgres");
        }
        let out = pg
            .cmd("initdb")
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(pg.data())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        pg.up();
        pg
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub(super) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server the way a crash would (`-m immediate`: no checkpoint, clients cut),
    /// waits `outage`, and starts it again (crash recovery from the WAL). Returns how long the
    /// server did not answer.
    pub(super) fn crash_restart(&self, outage: Duration) -> Duration {
        let t = Instant::now();
        self.ctl(&["stop", "-m", "immediate", "-w"]);
        std::thread::sleep(outage);
        self.up();
        t.elapsed()
    }

    fn up(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log");
        self.ctl(&[
            "start",
            "-w",
            "-t",
            "120",
            "-l",
            &log.display().to_string(),
            "-o",
            &opts,
        ]);
    }

    fn ctl(&self, args: &[&str]) {
        let out = self
            .cmd("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl {args:?}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
        );
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn cmd(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut c = if self.as_postgres {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=postgres", "--regid=postgres", "--clear-groups"])
                .arg(path);
            c
        } else {
            Command::new(path)
        };
        c.current_dir(self.dir.path())
            .env("HOME", self.dir.path())
            .stdin(std::process::Stdio::null());
        c
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let _ = self
            .cmd("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["stop", "-m", "immediate", "-w"])
            .output();
    }
}

/// The directory of `initdb` and `pg_ctl`: `KEEL_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian's layout).
fn pg_bin() -> PathBuf {
    if let Ok(dir) = std::env::var("KEEL_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries under /usr/lib/postgresql (apt-get install postgresql), or KEEL_PG_BIN")
        .filter_map(|e| {
            let e = e.ok()?;
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .expect("initdb under /usr/lib/postgresql/*/bin, or KEEL_PG_BIN")
}

/// A free TCP port on 127.0.0.1 (bound once, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
