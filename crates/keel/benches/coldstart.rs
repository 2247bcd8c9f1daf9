//! Cold start and peak RSS of `keel run` (issue 16): a fresh process, a fresh SQLite store in a
//! temp dir, the scripted model, `--sandbox off --permission-mode bypass --output jsonl`, timed
//! from spawn to exit (the result line is its last output) under `/usr/bin/time -f %M` for the
//! peak RSS. One step (the model answers `done`) and 400 steps (399 read-only `read_file` calls,
//! then `done`); `KEEL_BENCH_RUNS` runs each (default 10), median and max printed beside the
//! targets (≤ 25 ms cold start; ≤ 30 MB peak RSS, flat in session length). Exits 0 whatever the
//! figures.
//!
//! `KEEL_BENCH_KEEL=/path/a/keel,/path/b/keel` measures those executables instead of this
//! build's, one run of each in turn (side by side in one run: before / after a change).
//!
//! `cargo bench -p keel --bench coldstart`

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Command, Stdio};
use std::time::Instant;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One `keel run` of a script of `steps` model responses: (wall ms, peak RSS MB).
fn run_once(keel: &str, dir: &std::path::Path, steps: usize) -> (f64, f64) {
    let ws = tempfile::tempdir_in(dir).unwrap();
    let home = tempfile::tempdir_in(dir).unwrap();
    std::fs::write(ws.path().join("README.md"), "hello\n").unwrap();
    let mut lines: Vec<String> = (1..steps)
        .map(|i| {
            format!(
                r#"{{"tool_calls": [{{"id": "c{i}", "name": "read_file", "arguments": {{"path": "README.md"}}}}]}}"#
            )
        })
        .collect();
    lines.push(r#"{"text": "done"}"#.into());
    let script = home.path().join("script.jsonl");
    std::fs::write(&script, lines.join("\n")).unwrap();
    let rss_file = home.path().join("rss");
    let t = Instant::now();
    let out = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(&rss_file)
        .arg(keel)
        .arg("run")
        .arg("--model")
        .arg(format!("script:{}", script.display()))
        .arg("--store")
        .arg(format!(
            "sqlite://{}",
            home.path().join("keel.db").display()
        ))
        .arg("--workspace")
        .arg(ws.path())
        .args([
            "--sandbox",
            "off",
            "--permission-mode",
            "bypass",
            "--output",
            "jsonl",
            "--max-steps",
            "1000",
            "go",
        ])
        .env("HOME", home.path())
        .env("XDG_DATA_HOME", home.path().join("data"))
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("done"),
        "keel run failed: {}\n{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    let kb: f64 = std::fs::read_to_string(&rss_file)
        .unwrap()
        .trim()
        .lines()
        .last()
        .unwrap()
        .parse()
        .unwrap();
    (ms, kb / 1024.0)
}

fn main() {
    let runs: usize = std::env::var("KEEL_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let dir = std::env::var("KEEL_BENCH_DIR").map_or_else(|_| std::env::temp_dir(), Into::into);
    println!(
        "keel run, fresh process and SQLite store in {}, scripted model, {runs} runs each",
        dir.display()
    );
    let bins: Vec<String> = std::env::var("KEEL_BENCH_KEEL").map_or_else(
        |_| vec![env!("CARGO_BIN_EXE_keel").to_owned()],
        |v| v.split(',').map(str::to_owned).collect(),
    );
    // Warm the page cache for the binaries.
    for keel in &bins {
        let _ = run_once(keel, &dir, 1);
    }
    for steps in [1, 400] {
        let mut figures: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); bins.len()];
        for _ in 0..runs {
            for (keel, (ms, mb)) in bins.iter().zip(&mut figures) {
                let (t, m) = run_once(keel, &dir, steps);
                ms.push(t);
                mb.push(m);
            }
        }
        for (keel, (mut ms, mut mb)) in bins.iter().zip(figures) {
            let max_mb = mb.iter().copied().fold(0.0, f64::max);
            let name = if bins.len() > 1 {
                format!("{keel}: ")
            } else {
                String::new()
            };
            println!(
                "  {name}{steps:>3} step(s): wall p50 {:.1} ms   (target for 1 step: <= 25 ms); peak RSS p50 {:.1} MB, max {max_mb:.1} MB   (target: <= 30 MB, flat)",
                median(&mut ms),
                median(&mut mb)
            );
        }
    }
}
