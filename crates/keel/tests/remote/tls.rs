//! `keel --server https://…` against `keel serve --tls-cert/--tls-key` with a self-signed
//! certificate (made with rcgen): refused, saying how to trust it, until the certificate is
//! named with `--server-ca FILE` or `KEEL_SERVER_CA`; then every command works, the event
//! stream included. A CA file that cannot be used is named.

use super::{ASK, Options, remote_cmd, result_line, run_args, serve_with};
use crate::common::{Env, stderr};

#[test]
fn server_ca_trusts_the_self_signed_certificate_of_keel_serve() {
    let far = Env::new();
    far.write("script.jsonl", ASK);
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    far.write("tls/cert.pem", &ck.cert.pem());
    far.write("tls/key.pem", &ck.signing_key.serialize_pem());
    let (cert, key) = (far.path("tls/cert.pem"), far.path("tls/key.pem"));
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let s = serve_with(
        &far,
        &Options {
            args: &["--tls-cert", cert, "--tls-key", key],
            host: Some("localhost"),
            ..Options::default()
        },
    );
    assert!(s.url.starts_with("https://localhost:"), "{}", s.url);

    // Not trusted by the system: refused, naming the flag and the variable.
    let o = remote_cmd(&far, &s)
        .args(["sessions", "list"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("TLS certificate is not trusted")
            && err.contains("--server-ca")
            && err.contains("KEEL_SERVER_CA"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // Trusted with --server-ca, and with KEEL_SERVER_CA.
    let o = remote_cmd(&far, &s)
        .args(["--server-ca", cert, "sessions", "list"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = remote_cmd(&far, &s)
        .env("KEEL_SERVER_CA", cert)
        .args(run_args(&far, &["--output", "jsonl"], "hello"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let r = result_line(&o);
    assert_eq!(r["terminal_reason"], "requires_action", "{r}");
    let approval = r["pending"][0]["approval_id"].as_str().unwrap();
    let session = r["session_id"].as_str().unwrap();
    let o = remote_cmd(&far, &s)
        .env("KEEL_SERVER_CA", cert)
        .args(["approve", approval])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = remote_cmd(&far, &s)
        .env("KEEL_SERVER_CA", cert)
        .args(["resume", session, "--output", "jsonl"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(result_line(&o)["final_text"], "done");

    // A CA file that is missing, or holds no certificate.
    let o = remote_cmd(&far, &s)
        .args(["--server-ca", "missing.pem", "sessions", "list"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--server-ca missing.pem: cannot read it"),
        "{}",
        stderr(&o)
    );
    let o = remote_cmd(&far, &s)
        .args(["--server-ca", key, "sessions", "list"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("holds no PEM certificate"),
        "{}",
        stderr(&o)
    );
}
