//! [`Client`] operations: Releases, sessions, turns, state and events: what a run over the API uses.

use super::*;

impl Client {
    /// `POST /v1/releases`: stores a release (the same definition returns the same id).
    ///
    /// # Errors
    /// See [`Error`]; 403 for a key that is not an admin's.
    pub async fn create_release(&self, body: &CreateReleaseRequest) -> Result<ReleaseBody, Error> {
        self.post_json("/v1/releases", body).await
    }

    /// `GET /v1/releases/{release_id}`.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn get_release(&self, release: &str) -> Result<ReleaseBody, Error> {
        let path = format!("/v1/releases/{}", encode_segment(release));
        self.get_json(&path, &[]).await
    }

    /// `POST /v1/sessions`.
    ///
    /// # Errors
    /// See [`Error`]; 403 naming `workspace_roots`, `max_permission_mode` or `allow_sandbox_off`.
    pub async fn create_session(&self, body: &CreateSessionRequest) -> Result<SessionBody, Error> {
        self.post_json("/v1/sessions", body).await
    }

    /// `GET /v1/sessions/{session_id}`.
    ///
    /// # Errors
    /// See [`Error`]; 404 for an unknown session.
    pub async fn get_session(&self, session: &str) -> Result<SessionBody, Error> {
        let path = format!("/v1/sessions/{}", encode_segment(session));
        self.get_json(&path, &[]).await
    }

    /// Every session (optionally in one `status`), oldest first.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn list_sessions(&self, status: Option<&str>) -> Result<Vec<SessionBody>, Error> {
        let mut q = vec![("limit", "1000".to_owned())];
        if let Some(s) = status {
            q.push(("status", s.to_owned()));
        }
        self.all::<SessionPage>("/v1/sessions", &q).await
    }

    /// `GET /v1/sessions/{session_id}/state`: the session folded from its journal.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn session_state(&self, session: &str) -> Result<StateBody, Error> {
        self.session_state_at(session, None).await
    }

    /// `GET /v1/sessions/{session_id}/state?at=SEQ`: the session folded from its journal up to
    /// seq `at` (`None`: all of it).
    ///
    /// # Errors
    /// See [`Error`]; 404 for an unknown session.
    pub async fn session_state_at(
        &self,
        session: &str,
        at: Option<u64>,
    ) -> Result<StateBody, Error> {
        let path = format!("/v1/sessions/{}/state", encode_segment(session));
        let q: Vec<(&str, String)> = at.map(|a| ("at", a.to_string())).into_iter().collect();
        self.get_json(&path, &q).await
    }

    /// `POST /v1/sessions/{session_id}/turns` (the session's multitask setting applies).
    ///
    /// # Errors
    /// See [`Error`]; 409 for a closed session or a refused second input.
    pub async fn submit_turn(&self, session: &str, input: &str) -> Result<TurnBody, Error> {
        self.submit_turn_with(session, input, None, None).await
    }

    /// `POST /v1/sessions/{session_id}/turns` with this request's `multitask` strategy (`None`:
    /// the session's setting) and `priority` (-100..=100, higher first; `None`: 0).
    ///
    /// # Errors
    /// See [`Error`]; 409 for a closed session or a second input refused (`reject`), 422 for a
    /// priority out of range.
    pub async fn submit_turn_with(
        &self,
        session: &str,
        input: &str,
        multitask: Option<keel_api::MultitaskParam>,
        priority: Option<i32>,
    ) -> Result<TurnBody, Error> {
        let path = format!("/v1/sessions/{}/turns", encode_segment(session));
        let body = SubmitTurnRequest {
            input: input.to_owned(),
            multitask,
            priority,
        };
        self.post_json(&path, &body).await
    }

    /// `POST /v1/sessions/{session_id}/turns` for input that may be a slash command: the
    /// server's input pipeline answers a command itself ([`keel_api::InputOutcome::Command`]:
    /// `/help`, `/cost`, `/status`, `/permissions`, `/compact [focus]`, `/model NAME`, `/clear`
    /// with the new session's id) or queues a turn ([`keel_api::InputOutcome::Turn`]; `@path`
    /// mentions attach workspace files).
    ///
    /// # Errors
    /// See [`Error`]; 422 naming `input` for an unknown command, `/resume` (terminal only) or
    /// an `@path` that is missing, outside the workspace or denied; as [`Client::submit_turn`].
    pub async fn submit_input(
        &self,
        session: &str,
        input: &str,
    ) -> Result<keel_api::InputOutcome, Error> {
        let path = format!("/v1/sessions/{}/turns", encode_segment(session));
        let body = SubmitTurnRequest {
            input: input.to_owned(),
            multitask: None,
            priority: None,
        };
        self.post_json(&path, &body).await
    }

    /// `GET /v1/sessions/{session_id}/turns/{turn_id}`.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn get_turn(&self, session: &str, turn: &str) -> Result<TurnBody, Error> {
        let path = format!(
            "/v1/sessions/{}/turns/{}",
            encode_segment(session),
            encode_segment(turn)
        );
        self.get_json(&path, &[]).await
    }

    /// One page of a session's journal: events with `seq > after`, at most `limit` (1 to 1000).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn events_page(
        &self,
        session: &str,
        after: u64,
        limit: u32,
    ) -> Result<EventPage, Error> {
        let path = format!("/v1/sessions/{}/events", encode_segment(session));
        self.get_json(
            &path,
            &[("after", after.to_string()), ("limit", limit.to_string())],
        )
        .await
    }

    /// A session's whole journal from `seq > after`, page by page.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn events(&self, session: &str, after: u64) -> Result<Vec<serde_json::Value>, Error> {
        let mut out = Vec::new();
        let mut after = after;
        loop {
            let page = self.events_page(session, after, 1000).await?;
            out.extend(page.items);
            if !page.has_more || page.next_after == after {
                return Ok(out);
            }
            after = page.next_after;
        }
    }

    /// The live event stream of `session` after seq `after`, reconnecting per `policy`.
    ///
    /// # Errors
    /// As the first connection: see [`EventStream::open`].
    pub async fn stream_events(
        &self,
        session: &str,
        after: u64,
        policy: Reconnect,
    ) -> Result<EventStream, Error> {
        EventStream::open(self.clone(), session, after, policy).await
    }
}
