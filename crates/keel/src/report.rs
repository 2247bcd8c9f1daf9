//! Turning failures into one line a person can act on.

/// Rewrites a turn's failure message so that it says what to do: an unreachable server names
/// its URL and the flag to check, an exhausted script says it ended early. Other messages are
/// kept, on one line.
pub fn explain_model_failure(error: &str) -> String {
    let one = error.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some(url) = unreachable_url(&one) {
        return format!(
            "cannot reach the model server at {url}: is it running? check --base-url (or base_url in keel.toml) [{one}]"
        );
    }
    if one.contains("scripted model exhausted") {
        return format!(
            "the script ended early: {}",
            after(&one, "scripted model exhausted: ")
        );
    }
    one
}

/// An error and its causes on one line, each cause once: a cause whose text its parent's message
/// already includes (`cannot read X: No such file…` caused by `No such file…`) is not repeated.
pub fn describe(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        let text = text.trim();
        if text.is_empty() || line.contains(text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(text);
    }
    line
}

/// Whether the error is standard output (or error) closed by the reader (`keel … | head`).
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn after<'a>(text: &'a str, marker: &str) -> &'a str {
    text.find(marker)
        .map_or(text, |i| &text[i + marker.len()..])
}

/// The URL of a connection failure reported by the HTTP client (`error sending request for url
/// (http://…)`).
fn unreachable_url(text: &str) -> Option<&str> {
    let i = text.find("error sending request for url (")?;
    let rest = &text[i + "error sending request for url (".len()..];
    rest.split(')').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_say_what_to_do() {
        let e = explain_model_failure(
            "server_error: HTTP request failed: error sending request for url (http://127.0.0.1:9/v1/chat/completions)",
        );
        assert!(
            e.starts_with(
                "cannot reach the model server at http://127.0.0.1:9/v1/chat/completions"
            ),
            "{e}"
        );
        assert!(e.contains("--base-url"));
        let e = explain_model_failure(
            "invalid_request: scripted model exhausted: /x/s.jsonl has 2 lines and model response 3 was requested",
        );
        assert_eq!(
            e,
            "the script ended early: /x/s.jsonl has 2 lines and model response 3 was requested"
        );
        assert_eq!(explain_model_failure("a\nb"), "a b");
    }

    #[test]
    fn causes_are_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let e = anyhow::Error::new(io).context("cannot read s.jsonl: No such file");
        assert_eq!(describe(&e), "cannot read s.jsonl: No such file");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(describe(&e), "outer: inner");
    }
}
