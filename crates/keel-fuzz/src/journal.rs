//! The journal target: event envelopes as a store or a peer hands them over.

use keel_core::{Event, SessionState};

/// Event envelope decoding and the fold: each line of the bytes is one event's JSON
/// ([`Event::decode`]); every event that decodes is applied to one [`SessionState`] in order
/// ([`SessionState::apply`]). To let the fuzzer reach deep states, an event whose `seq` is not
/// the next one is also applied renumbered to the next one.
///
/// Invariants: decoding and applying never panic; a decoded event encodes and decodes back to
/// itself; an event that fails to apply leaves the state unchanged.
pub fn event_fold(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut state = SessionState::default();
    for line in text.lines() {
        let Ok(event) = Event::decode(line) else {
            continue;
        };
        match Event::decode(&event.encode()) {
            Ok(again) => assert_eq!(again, event, "an event re-encoded decodes to itself"),
            Err(e) => panic!("a decoded event's encoding does not decode: {e}: {event:?}"),
        }
        let mut next = event.clone();
        next.seq = state.version.saturating_add(1);
        for ev in [event, next] {
            let before = state.clone();
            if state.apply(&ev).is_err() {
                assert!(state == before, "a failed apply changed the state: {ev:?}");
            }
        }
    }
}
