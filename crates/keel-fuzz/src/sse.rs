//! The SSE target: bytes as a provider's response body.

use std::cell::RefCell;

use keel_model::{StreamEvent, Wire, parse_chunks, parse_recorded};

thread_local! {
    /// One current-thread runtime per thread, with the time driver the pump needs.
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    RUNTIME.with(|cell| {
        let mut slot = cell.borrow_mut();
        let runtime =
            slot.get_or_insert_with(|| {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => panic!("cannot build a tokio runtime: {e}"),
                }
            });
        runtime.block_on(future)
    })
}

/// The events with error messages removed (they may name byte offsets, which depend on chunking).
fn shape(events: &[StreamEvent]) -> Vec<StreamEvent> {
    events
        .iter()
        .map(|e| match e {
            StreamEvent::Error { error } => {
                let mut error = error.clone();
                error.message.clear();
                StreamEvent::Error { error }
            }
            other => other.clone(),
        })
        .collect()
}

fn check_terminal(wire: Wire, how: &str, events: &[StreamEvent]) {
    let terminals = events.iter().filter(|e| e.is_terminal()).count();
    assert!(
        terminals == 1 && events.last().is_some_and(StreamEvent::is_terminal),
        "{wire} {how}: the events must end with exactly one terminal event: {events:?}"
    );
    assert!(
        !events.iter().any(|e| matches!(e, StreamEvent::Cancelled)),
        "{wire} {how}: nothing cancelled this stream: {events:?}"
    );
}

/// Feeds `data` to `wire`'s parser as a recorded file ([`parse_recorded`]), as one live chunk and
/// as live chunks of 1 to 64 bytes ([`parse_chunks`], the size taken from the data).
///
/// Invariants: every parse ends with exactly one terminal event (a malformed stream is a
/// classified error, never a panic or a stream without an end), and chunking does not change the
/// events (error messages aside).
pub fn sse(wire: Wire, data: &[u8]) {
    let recorded = block_on(parse_recorded(wire, data));
    check_terminal(wire, "recorded", &recorded);
    let whole = block_on(parse_chunks(wire, [data]));
    check_terminal(wire, "one chunk", &whole);
    let size = 1 + data
        .iter()
        .fold(0usize, |h, b| h.wrapping_mul(31) ^ usize::from(*b))
        % 64;
    let chunked = block_on(parse_chunks(wire, data.chunks(size)));
    check_terminal(wire, "chunked", &chunked);
    assert_eq!(
        shape(&whole),
        shape(&chunked),
        "{wire}: chunks of {size} bytes changed the events"
    );
}
