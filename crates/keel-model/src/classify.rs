//! Error classification: HTTP status, headers and error bodies of all three providers map to one
//! [`ErrorKind`].
//!
//! Sources: OpenAI "Error codes" guide (401, 403, 429 `rate_limit_exceeded` vs
//! `insufficient_quota`, 500, 503), Anthropic "Errors" page (400 `invalid_request_error`, 401
//! `authentication_error`, 402 `billing_error`, 403 `permission_error`, 404 `not_found_error`, 413
//! `request_too_large`, 429 `rate_limit_error`, 500 `api_error`, 529 `overloaded_error`, and
//! errors sent as SSE `error` events after HTTP 200).

use serde_json::Value;

use crate::error::{ErrorKind, ProviderError};

/// Maps a provider error `type` or `code` string (either provider) to a kind, if it names one.
pub(crate) fn kind_from_code(code: &str) -> Option<ErrorKind> {
    Some(match code {
        "rate_limit_error" | "rate_limit_exceeded" | "rate_limited" | "too_many_requests" => {
            ErrorKind::RateLimited
        }
        "overloaded_error" | "overloaded" | "server_is_overloaded" | "slow_down" => {
            ErrorKind::Overloaded
        }
        "api_error" | "server_error" | "internal_error" | "internal_server_error" => {
            ErrorKind::ServerError
        }
        "timeout" | "timeout_error" | "request_timeout" => ErrorKind::Timeout,
        "context_length_exceeded"
        | "context_overflow"
        | "request_too_large"
        | "string_above_max_length" => ErrorKind::ContextOverflow,
        "invalid_request_error"
        | "invalid_request"
        | "not_found_error"
        | "invalid_prompt"
        | "invalid_value"
        | "model_not_found" => ErrorKind::InvalidRequest,
        "authentication_error" | "permission_error" | "invalid_api_key" | "authentication" => {
            ErrorKind::Authentication
        }
        "insufficient_quota" | "billing_error" | "quota" => ErrorKind::Quota,
        "content_filter" | "content_policy_violation" | "content_filter_error" => {
            ErrorKind::ContentFilter
        }
        "stream_truncated" => ErrorKind::StreamTruncated,
        "empty_response" => ErrorKind::EmptyResponse,
        _ => return None,
    })
}

/// Whether a message says the prompt is too long (Anthropic: "prompt is too long: 210000 tokens >
/// 200000 maximum"; OpenAI: "This model's maximum context length is ...").
fn says_context_overflow(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("prompt is too long")
        || m.contains("maximum context length")
        || m.contains("context length exceeded")
        || m.contains("context window")
        || m.contains("too many tokens")
}

/// The `(type, code, message)` of an error body: OpenAI `{"error":{"type","code","message"}}`,
/// Anthropic `{"type":"error","error":{"type","message"}}`, Responses stream
/// `{"type":"error","code","message"}` or `response.failed`'s `response.error`.
fn error_fields(body: &Value) -> (Option<&str>, Option<&str>, Option<&str>) {
    let inner = match body.get("error") {
        Some(e) if e.is_object() => e,
        _ => match body.get("response").and_then(|r| r.get("error")) {
            Some(e) if e.is_object() => e,
            _ => body,
        },
    };
    let ty = inner
        .get("type")
        .and_then(Value::as_str)
        .filter(|t| *t != "error");
    let code = inner.get("code").and_then(Value::as_str);
    let message = inner
        .get("message")
        .and_then(Value::as_str)
        .or_else(|| body.get("error").and_then(Value::as_str));
    (ty, code, message)
}

/// Whether a message says a content filter blocked the request or output (Anthropic answers
/// HTTP 400 `invalid_request_error` "Output blocked by content filtering policy").
fn says_content_filter(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("content filtering policy") || m.contains("content management policy")
}

/// Classifies an error object that arrived inside a 200 stream (no HTTP status).
pub(crate) fn classify_stream_error(body: &Value) -> ProviderError {
    let (ty, code, message) = error_fields(body);
    let message = message
        .unwrap_or("provider reported an error in the stream")
        .to_string();
    let kind = code
        .and_then(kind_from_code)
        .or_else(|| ty.and_then(kind_from_code))
        .map(|k| {
            if k == ErrorKind::InvalidRequest && says_context_overflow(&message) {
                ErrorKind::ContextOverflow
            } else {
                k
            }
        })
        .unwrap_or(ErrorKind::ServerError);
    let retry_after = retry_hint_in_message_ms(&message);
    ProviderError::new(kind, message).with_retry_after_ms(retry_after)
}

/// Classifies a non-2xx HTTP response from its status, headers and body text.
pub(crate) fn classify_http(
    status: u16,
    headers: &reqwest::header::HeaderMap,
    body: &str,
) -> ProviderError {
    let json: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let (ty, code, message) = error_fields(&json);
    let message = message.map(str::to_string).unwrap_or_else(|| {
        let trimmed = body.trim();
        if trimmed.is_empty() {
            format!("HTTP {status}")
        } else {
            trimmed.chars().take(500).collect()
        }
    });
    let by_code = code
        .and_then(kind_from_code)
        .or_else(|| ty.and_then(kind_from_code));
    let kind = match status {
        429 => match by_code {
            Some(ErrorKind::Quota) => ErrorKind::Quota,
            _ => ErrorKind::RateLimited,
        },
        529 | 503 => ErrorKind::Overloaded,
        408 | 504 => ErrorKind::Timeout,
        401 | 403 => ErrorKind::Authentication,
        402 => ErrorKind::Quota,
        413 => ErrorKind::ContextOverflow,
        400 | 404 | 409 | 422 => match by_code {
            Some(ErrorKind::ContextOverflow)
            | Some(ErrorKind::ContentFilter)
            | Some(ErrorKind::Quota) => by_code.unwrap_or(ErrorKind::InvalidRequest),
            _ if says_context_overflow(&message) => ErrorKind::ContextOverflow,
            _ if says_content_filter(&message) => ErrorKind::ContentFilter,
            _ => ErrorKind::InvalidRequest,
        },
        s if s >= 500 => match by_code {
            Some(ErrorKind::Overloaded) => ErrorKind::Overloaded,
            _ => ErrorKind::ServerError,
        },
        _ => by_code.unwrap_or(ErrorKind::InvalidRequest),
    };
    let retry_after =
        retry_after_from_headers_ms(headers).or_else(|| retry_hint_in_message_ms(&message));
    ProviderError::new(kind, message)
        .with_status(status)
        .with_retry_after_ms(retry_after)
}

/// Reads `retry-after-ms` (OpenAI, milliseconds) or `retry-after` (seconds, possibly fractional;
/// HTTP-date values are ignored) in ms.
pub(crate) fn retry_after_from_headers_ms(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return Some(ms.max(0.0).round() as u64);
    }
    get("retry-after")
        .and_then(|v| v.parse::<f64>().ok())
        .map(|s| (s.max(0.0) * 1000.0).round() as u64)
}

/// Reads OpenAI's "Please try again in 1.5s" / "in 250ms" hint in ms.
pub(crate) fn retry_hint_in_message_ms(message: &str) -> Option<u64> {
    let lower = message.to_ascii_lowercase();
    let rest = &lower[lower.find("try again in ")? + "try again in ".len()..];
    let number: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let value: f64 = number.parse().ok()?;
    let unit = &rest[number.len()..];
    if unit.starts_with("ms") {
        Some(value.round() as u64)
    } else if unit.starts_with('s') {
        Some((value * 1000.0).round() as u64)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue};

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn openai_429_with_retry_after_ms_header_is_rate_limited() {
        let body = r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
        let e = classify_http(429, &headers(&[("retry-after-ms", "250")]), body);
        assert_eq!(
            (e.kind, e.retry_after_ms, e.retryable),
            (ErrorKind::RateLimited, Some(250), true)
        );
    }

    #[test]
    fn openai_429_insufficient_quota_is_quota_and_not_retryable() {
        let body = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        let e = classify_http(429, &HeaderMap::new(), body);
        assert_eq!((e.kind, e.retryable), (ErrorKind::Quota, false));
    }

    #[test]
    fn retry_after_seconds_header_and_message_hint() {
        let e = classify_http(429, &headers(&[("retry-after", "2")]), "{}");
        assert_eq!(e.retry_after_ms, Some(2000));
        let body = r#"{"error":{"message":"Rate limit reached for gpt-4o. Please try again in 1.5s.","code":"rate_limit_exceeded"}}"#;
        assert_eq!(
            classify_http(429, &HeaderMap::new(), body).retry_after_ms,
            Some(1500)
        );
        assert_eq!(retry_hint_in_message_ms("try again in 120ms."), Some(120));
    }

    #[test]
    fn anthropic_statuses_map_to_kinds() {
        let body =
            |t: &str| format!(r#"{{"type":"error","error":{{"type":"{t}","message":"m"}}}}"#);
        let cases = [
            (529, "overloaded_error", ErrorKind::Overloaded),
            (500, "api_error", ErrorKind::ServerError),
            (401, "authentication_error", ErrorKind::Authentication),
            (403, "permission_error", ErrorKind::Authentication),
            (402, "billing_error", ErrorKind::Quota),
            (413, "request_too_large", ErrorKind::ContextOverflow),
            (404, "not_found_error", ErrorKind::InvalidRequest),
            (400, "invalid_request_error", ErrorKind::InvalidRequest),
            (504, "timeout_error", ErrorKind::Timeout),
        ];
        for (status, ty, kind) in cases {
            assert_eq!(
                classify_http(status, &HeaderMap::new(), &body(ty)).kind,
                kind,
                "{status} {ty}"
            );
        }
    }

    #[test]
    fn prompt_too_long_is_context_overflow() {
        let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        assert_eq!(
            classify_http(400, &HeaderMap::new(), body).kind,
            ErrorKind::ContextOverflow
        );
        let body = r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        assert_eq!(
            classify_http(400, &HeaderMap::new(), body).kind,
            ErrorKind::ContextOverflow
        );
    }

    #[test]
    fn openai_content_filter_400_is_content_filter() {
        let body = r#"{"error":{"message":"blocked","type":"invalid_request_error","code":"content_filter"}}"#;
        assert_eq!(
            classify_http(400, &HeaderMap::new(), body).kind,
            ErrorKind::ContentFilter
        );
    }

    #[test]
    fn non_json_body_keeps_text_as_message() {
        let e = classify_http(502, &HeaderMap::new(), "<html>bad gateway</html>");
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::ServerError, "<html>bad gateway</html>")
        );
    }

    #[test]
    fn stream_errors_classify_by_type_or_code() {
        let anthropic: Value = serde_json::from_str(
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        )
        .unwrap();
        assert_eq!(
            classify_stream_error(&anthropic).kind,
            ErrorKind::Overloaded
        );
        let responses: Value = serde_json::from_str(
            r#"{"type":"error","code":"rate_limit_exceeded","message":"slow down, try again in 20ms","param":null}"#,
        )
        .unwrap();
        let e = classify_stream_error(&responses);
        assert_eq!(
            (e.kind, e.retry_after_ms),
            (ErrorKind::RateLimited, Some(20))
        );
        let unknown: Value =
            serde_json::from_str(r#"{"type":"error","error":{"type":"weird","message":"?"}}"#)
                .unwrap();
        assert_eq!(classify_stream_error(&unknown).kind, ErrorKind::ServerError);
    }
}
