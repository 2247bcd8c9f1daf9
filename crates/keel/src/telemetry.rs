//! Span export over OTLP (http/protobuf) — on when the standard variables ask for it, off (no
//! exporter, no thread, disabled spans) otherwise.
//!
//! The spans are the runtime's ([`keel_runtime::telemetry`]: `invoke_agent` per turn, `chat` per
//! model attempt, `execute_tool` per call; OpenTelemetry GenAI conventions). Only they are
//! exported: no log event, no other span. The variables (OpenTelemetry's SDK configuration):
//!
//! | variable | meaning |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | the full URL spans are posted to (`http://collector:4318/v1/traces`) |
//! | `OTEL_EXPORTER_OTLP_ENDPOINT` | the base URL; spans go to `<base>/v1/traces` |
//! | `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TRACES_HEADERS` | `key=value,…` (values URL-encoded) sent with each export, e.g. an `Authorization` header; withheld from tool processes and redacted like a secret |
//! | `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` | only `http/protobuf` (the default); any other value stops keel at start naming the variable |
//! | `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` | one export's time limit, ms (default 10000) |
//! | `OTEL_SERVICE_NAME` | `service.name` of the resource (default `keel`); `OTEL_RESOURCE_ATTRIBUTES` adds attributes |
//! | `OTEL_SDK_DISABLED` | `true`: no export whatever else is set |
//! | `OTEL_BSP_*` | the batch processor's queue, batch size and delays (SDK defaults: 2048 spans, 512 a batch, every 5 s) |
//!
//! Export is on when either endpoint variable is set (not empty) and `OTEL_SDK_DISABLED` is not
//! `true`. Spans are batched on a background thread and posted with a blocking reqwest client on
//! the workspace's rustls (ring) stack; `https://` endpoints are verified against the system's
//! roots. [`Exporter::shutdown`] flushes what is queued: the `keel` binary calls it when the
//! command returns (`keel run` at the end of its turn, `keel serve` after its shutdown).

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{KeyValue, Value};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider, SpanData, SpanProcessor};

/// The export variables whose values are secrets (headers carry credentials): withheld from
/// tool processes and redacted from logs and sessions.
pub const SECRET_ENV: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
];

/// The secret values of [`SECRET_ENV`] in this environment: each variable's whole value, and
/// each header's value (`key=value` pairs separated by commas, percent-decoded), for the
/// redactors of logs and sessions.
pub fn secret_values() -> Vec<String> {
    let mut out = Vec::new();
    for name in SECRET_ENV {
        let Some(all) = std::env::var(name).ok().filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        for pair in all.split(',') {
            if let Some((_, value)) = pair.split_once('=') {
                let value = percent_decode(value.trim());
                if !value.is_empty() {
                    out.push(value);
                }
            }
        }
        out.push(all);
    }
    out
}

/// `%XX` sequences decoded (the header format of the OTLP exporter variables); anything else
/// kept as it is.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The only protocol keel exports with.
pub const PROTOCOL: &str = "http/protobuf";

/// Default `service.name`.
pub const SERVICE_NAME: &str = "keel";

/// What the environment asks for, read by [`Settings::from_env`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `service.name`.
    pub service_name: String,
    /// One export's time limit.
    pub timeout: Duration,
}

impl Settings {
    /// Reads the variables through `var` (a variable set to an empty string counts as unset).
    /// `Ok(None)`: export is off.
    ///
    /// # Errors
    /// A protocol other than `http/protobuf`, or a timeout that is not a number of ms, naming
    /// the variable and what to set.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if get("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
            && get("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        {
            return Ok(None);
        }
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(p) = get(name)
                && p.trim() != PROTOCOL
            {
                return Err(format!(
                    "${name}={p:?} is not supported: keel exports spans over {PROTOCOL} only (set {name}={PROTOCOL} or unset it)"
                ));
            }
        }
        let mut timeout = Duration::from_secs(10);
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ] {
            if let Some(t) = get(name) {
                let ms: u64 = t.trim().parse().map_err(|_| {
                    format!("${name}={t:?} is not a time limit: expected milliseconds (e.g. 10000)")
                })?;
                timeout = Duration::from_millis(ms);
                break;
            }
        }
        Ok(Some(Self {
            service_name: get("OTEL_SERVICE_NAME")
                .map_or_else(|| SERVICE_NAME.to_owned(), |s| s.trim().to_owned()),
            timeout,
        }))
    }

    /// [`Settings::from_vars`] on this process's environment.
    ///
    /// # Errors
    /// As [`Settings::from_vars`].
    pub fn from_env() -> Result<Option<Self>, String> {
        Self::from_vars(|name| std::env::var(name).ok())
    }
}

/// A running exporter: the tracer provider behind the `tracing` layer.
#[derive(Debug)]
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Starts the batch exporter for `settings` (endpoint and headers are read from the
    /// environment by the OTLP exporter, per the specification) and returns it with the tracer
    /// for the `tracing` layer.
    ///
    /// # Errors
    /// An endpoint that is not a URL, or an HTTP client that cannot be set up.
    pub fn start(
        settings: &Settings,
    ) -> Result<(Self, opentelemetry_sdk::trace::SdkTracer), String> {
        // reqwest's rustls backend takes the process-wide provider: ring, as everywhere in keel.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let timeout = settings.timeout;
        // A blocking client owns a runtime of its own: built (and later dropped) off any async
        // context.
        let client = std::thread::spawn(move || {
            reqwest::blocking::Client::builder()
                .tls_backend_rustls()
                .connect_timeout(timeout.min(Duration::from_secs(10)))
                .timeout(timeout)
                .build()
        })
        .join()
        .map_err(|_| "cannot set up the OTLP exporter's HTTP client".to_owned())?
        .map_err(|e| format!("cannot set up the OTLP exporter's HTTP client: {e}"))?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(timeout)
            .build()
            .map_err(|e| format!("cannot export spans over OTLP: {e}"))?;
        let resource = Resource::builder()
            .with_service_name(settings.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(StringArrays(BatchSpanProcessor::builder(exporter).build()))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("keel");
        Ok((Self { provider }, tracer))
    }

    /// Exports what is queued and stops the exporter (waits for the export, within its time
    /// limit). Later spans are dropped.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("keel: exporting the last spans over OTLP failed: {e}");
        }
    }
}

/// The attributes the conventions type as string arrays; `tracing` fields carry one string, so
/// the runtime records them comma-separated (see [`keel_runtime::telemetry`]).
const STRING_ARRAYS: [&str; 1] = ["gen_ai.response.finish_reasons"];

/// Forwards ended spans to the batch processor, with [`STRING_ARRAYS`] as arrays.
#[derive(Debug)]
struct StringArrays<P>(P);

impl<P: SpanProcessor> SpanProcessor for StringArrays<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.0.on_start(span, cx);
    }

    fn on_end(&self, mut span: SpanData) {
        for kv in &mut span.attributes {
            if STRING_ARRAYS.contains(&kv.key.as_str())
                && let Value::String(s) = &kv.value
            {
                let items: Vec<opentelemetry::StringValue> = s
                    .as_str()
                    .split(',')
                    .map(|v| opentelemetry::StringValue::from(v.trim().to_owned()))
                    .collect();
                kv.value = Value::Array(items.into());
            }
        }
        self.0.on_end(span);
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<Settings>, String> {
        Settings::from_vars(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn export_is_on_only_with_an_endpoint_and_not_disabled() {
        assert_eq!(settings(&[]), Ok(None));
        assert_eq!(settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]), Ok(None));
        assert_eq!(settings(&[("OTEL_SERVICE_NAME", "x")]), Ok(None));
        let on = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")])
            .unwrap()
            .unwrap();
        assert_eq!(on.service_name, "keel");
        assert_eq!(on.timeout, Duration::from_secs(10));
        let named = settings(&[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://127.0.0.1:4318/v1/traces",
            ),
            ("OTEL_SERVICE_NAME", "agents"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(named.service_name, "agents");
        assert_eq!(named.timeout, Duration::from_millis(2500));
        assert_eq!(
            settings(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_SDK_DISABLED", "TRUE"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ]),
            Ok(None)
        );
    }

    #[test]
    fn header_values_are_percent_decoded() {
        assert_eq!(percent_decode("Bearer%20abc%2Cd"), "Bearer abc,d");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn only_http_protobuf_is_accepted_and_a_bad_value_names_its_variable() {
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert!(
            settings(&[base, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")])
                .unwrap()
                .is_some()
        );
        for (name, value) in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
        ] {
            let e = settings(&[base, (name, value)]).unwrap_err();
            assert!(e.contains(name) && e.contains("http/protobuf"), "{e}");
        }
        let e = settings(&[base, ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")]).unwrap_err();
        assert!(e.contains("OTEL_EXPORTER_OTLP_TIMEOUT"), "{e}");
    }
}
