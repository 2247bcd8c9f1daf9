//! Diagnostics: the `tracing` subscriber of the `keel` binary.
//!
//! Log lines go to standard error (standard output belongs to the event stream). The filter is
//! `KEEL_LOG`, else `RUST_LOG`, in `tracing_subscriber::EnvFilter` syntax (`warn`,
//! `keel_runtime=info`, `debug`…), default `warn`. `--log-format text` (default) writes one
//! human line per event; `--log-format json` one JSON object per line (`timestamp`, `level`,
//! `target`, `fields`). Every line is redacted before it is written: the built-in secret
//! patterns, the provider keys keel reads ([`keel_runtime::redact::PROVIDER_KEY_ENV`]), and,
//! once a command has read its configuration, every secret value it knows ([`add_secrets`]).

use std::io::Write;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

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

/// The redactor of every log line of this process.
fn shared() -> Option<&'static RwLock<Arc<Redactor>>> {
    static SHARED: OnceLock<Option<RwLock<Arc<Redactor>>>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            Redactor::new(&[], &[])
                .ok()
                .map(|r| RwLock::new(Arc::new(r)))
        })
        .as_ref()
}

/// Adds secret values (provider keys read from a configured variable, `[env]` and
/// `[providers]` values) to what every later log line is redacted with.
pub fn add_secrets(values: &[String]) {
    if let Some(lock) = shared() {
        let mut r = lock.write().unwrap_or_else(PoisonError::into_inner);
        *r = Arc::new((**r).clone().with_literals(values));
    }
}

/// What [`init`] started: the span exporter, when the environment asks for one. Dropping it
/// flushes the spans still queued ([`crate::telemetry::Exporter::shutdown`]); keep it alive
/// until the command returns.
#[derive(Debug, Default)]
#[must_use = "dropping it stops the span export"]
pub struct Telemetry(Option<crate::telemetry::Exporter>);

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(exporter) = self.0.take() {
            exporter.shutdown();
        }
    }
}

/// Installs the subscriber for this process (once; a second call installs nothing): log lines
/// on standard error (the runtime's spans are not logged), and the span exporter when the
/// `OTEL_*` variables ask for one ([`crate::telemetry`]; only the runtime's spans go there).
///
/// # Errors
/// An export configuration keel cannot follow (a protocol other than `http/protobuf`, an
/// endpoint that is not a URL), naming the variable.
pub fn init(format: LogFormat) -> Result<Telemetry, String> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    if shared().is_none() {
        return Ok(Telemetry::default());
    }
    let settings = crate::telemetry::Settings::from_env()?;
    // The export headers may carry credentials: never in a log line.
    add_secrets(&crate::telemetry::secret_values());
    let (exporter, tracer) = match &settings {
        Some(s) => {
            let (e, t) = crate::telemetry::Exporter::start(s)?;
            (Some(e), Some(t))
        }
        None => (None, None),
    };
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(RedactingStderr)
        .with_ansi(false);
    let lines: Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync> =
        match format {
            LogFormat::Text => Box::new(lines),
            LogFormat::Json => Box::new(lines.json()),
        };
    let off = format!("{}=off", keel_runtime::telemetry::TARGET);
    let log_filter = match off.parse() {
        Ok(directive) => filter().add_directive(directive),
        Err(_) => filter(),
    };
    let spans = tracer.map(|t| {
        tracing_opentelemetry::layer()
            .with_tracer(t)
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                meta.is_span() && meta.target() == keel_runtime::telemetry::TARGET
            }))
    });
    let _ = tracing_subscriber::registry()
        .with(lines.with_filter(log_filter))
        .with(spans)
        .try_init();
    Ok(Telemetry(exporter))
}

/// Standard error, each write redacted (the formatter writes one whole line per event).
#[derive(Clone)]
struct RedactingStderr;

impl<'a> MakeWriter<'a> for RedactingStderr {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> Self::Writer {
        let redactor = match shared() {
            Some(lock) => lock.read().unwrap_or_else(PoisonError::into_inner).clone(),
            // `init` installs no writer without a redactor.
            None => Arc::new(Redactor::with_values(&[], &[]).unwrap_or_else(|_| unreachable!())),
        };
        LineWriter {
            redactor,
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
