//! Diagnostics: the `tracing` subscriber of the `keel` binary.
//!
//! Log lines go to standard error (standard output belongs to the event stream). The filter is
//! `KEEL_LOG`, else `RUST_LOG`, in `tracing_subscriber::EnvFilter` syntax (`warn`,
//! `keel_runtime=info`, `debug`…), default `warn`. `--log-format text` (default) writes one
//! human line per event; `--log-format json` one JSON object per line (`timestamp`, `level`,
//! `target`, `fields`). Every line is redacted before it is written: the built-in secret
//! patterns and the provider keys keel reads ([`keel_runtime::redact::PROVIDER_KEY_ENV`]).

use std::io::Write;
use std::sync::Arc;

use keel_runtime::redact::Redactor;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The filter: `KEEL_LOG`, else `RUST_LOG`, else `warn`. A filter that does not parse is
/// reported once on standard error and `warn` is used.
fn filter() -> EnvFilter {
    let spec = ["KEEL_LOG", "RUST_LOG"].iter().find_map(|v| {
        std::env::var(v)
            .ok()
            .filter(|s| !s.trim().is_empty())
            .map(|s| (*v, s))
    });
    match spec {
        Some((var, text)) => EnvFilter::try_new(&text).unwrap_or_else(|e| {
            eprintln!("keel: ${var}={text:?} is not a log filter ({e}); using \"warn\"");
            EnvFilter::new("warn")
        }),
        None => EnvFilter::new("warn"),
    }
}

/// Installs the subscriber for this process (once; a second call does nothing).
pub fn init(format: LogFormat) {
    let redactor = match Redactor::new(&[], &[]) {
        Ok(r) => Arc::new(r),
        Err(_) => return,
    };
    let writer = RedactingStderr { redactor };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(writer)
        .with_ansi(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Standard error, each write redacted (the formatter writes one whole line per event).
#[derive(Clone)]
struct RedactingStderr {
    redactor: Arc<Redactor>,
}

impl<'a> MakeWriter<'a> for RedactingStderr {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter {
            redactor: self.redactor.clone(),
            buf: Vec::new(),
        }
    }
}

/// Collects one event's bytes and writes them redacted when dropped or flushed.
pub struct LineWriter {
    redactor: Arc<Redactor>,
    buf: Vec<u8>,
}

impl LineWriter {
    /// What was written so far, redacted; empties the buffer.
    fn take_redacted(&mut self) -> String {
        let text = self
            .redactor
            .redact_str(&String::from_utf8_lossy(&self.buf));
        self.buf.clear();
        text
    }
}

impl Write for LineWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let text = self.take_redacted();
        let mut err = std::io::stderr().lock();
        err.write_all(text.as_bytes())?;
        err.flush()
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_line_is_redacted_before_it_is_written() {
        let mut w = LineWriter {
            redactor: Arc::new(Redactor::new(&[], &[]).unwrap()),
            buf: Vec::new(),
        };
        // The formatter may write one event in pieces; the secret spans two of them.
        w.write_all(b"upstream said: bad key sk-proj-abcdefghij")
            .unwrap();
        w.write_all(b"klmnopqrstuvwx\n").unwrap();
        assert_eq!(w.take_redacted(), "upstream said: bad key [REDACTED]\n");
        assert_eq!(w.take_redacted(), "");
    }
}
