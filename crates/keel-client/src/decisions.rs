//! [`Client`] operations: Approvals and effects decided by people, and a session's lifecycle (close, update, cancel).

use super::*;

impl Client {
    /// A session's approvals (optionally in one `status`), oldest first.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn session_approvals(
        &self,
        session: &str,
        status: Option<&str>,
    ) -> Result<Vec<ApprovalBody>, Error> {
        let path = format!("/v1/sessions/{}/approvals", encode_segment(session));
        let mut q = vec![("limit", "1000".to_owned())];
        if let Some(s) = status {
            q.push(("status", s.to_owned()));
        }
        self.all::<ApprovalPage>(&path, &q).await
    }

    /// `GET /v1/approvals/{approval_id}`.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn get_approval(&self, approval: &str) -> Result<ApprovalBody, Error> {
        let path = format!("/v1/approvals/{}", encode_segment(approval));
        self.get_json(&path, &[]).await
    }

    /// Decides an approval, bound to the `args_hash` the decider saw.
    ///
    /// # Errors
    /// See [`Error`]; 409 when it was decided otherwise or expired.
    pub async fn decide_approval(
        &self,
        approval: &str,
        decision: ApprovalDecisionParam,
        args_hash: &str,
        reason: Option<&str>,
    ) -> Result<ApprovalBody, Error> {
        let path = format!("/v1/approvals/{}/decision", encode_segment(approval));
        let body = DecideApprovalRequest {
            decision,
            args_hash: args_hash.to_owned(),
            reason: reason.map(str::to_owned),
        };
        self.post_json(&path, &body).await
    }

    /// A session's effects, optionally in one `status` (`outcome_unknown`).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn list_effects(
        &self,
        session: &str,
        status: Option<&str>,
    ) -> Result<Vec<keel_api::EffectBody>, Error> {
        let path = format!("/v1/sessions/{}/effects", encode_segment(session));
        let q: Vec<(&str, String)> = status
            .map(|s| ("status", s.to_owned()))
            .into_iter()
            .collect();
        self.all::<keel_api::EffectPage>(&path, &q).await
    }

    /// Says what an `outcome_unknown` effect did.
    ///
    /// # Errors
    /// See [`Error`]; 409 when the effect is not waiting for a decision.
    pub async fn decide_effect(
        &self,
        session: &str,
        operation_key: &str,
        decision: EffectDecisionParam,
        reason: Option<&str>,
    ) -> Result<EffectDecidedBody, Error> {
        let path = format!(
            "/v1/sessions/{}/effects/{}/decision",
            encode_segment(session),
            encode_segment(operation_key)
        );
        let body = DecideEffectRequest {
            decision,
            reason: reason.map(str::to_owned),
        };
        self.post_json(&path, &body).await
    }

    /// `POST /v1/sessions/{session_id}/close` with `If-Match: "version"` (the session's ETag as
    /// [`SessionBody::version`] gives it): closes the session for good. Closing a closed session
    /// succeeds.
    ///
    /// # Errors
    /// See [`Error`]; 409 while a turn is open, 412 when the session's version is no longer
    /// `version` (read it again and retry).
    pub async fn close_session(&self, session: &str, version: u64) -> Result<SessionBody, Error> {
        let path = format!("/v1/sessions/{}/close", encode_segment(session));
        let req = self
            .request(reqwest::Method::POST, &path)
            .header(reqwest::header::IF_MATCH, format!("\"{version}\""))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body("{}");
        self.send(&path, req, std::any::type_name::<SessionBody>())
            .await
    }

    /// `PATCH /v1/sessions/{session_id}` with `If-Match: "version"` (the session's ETag as
    /// [`SessionBody::version`] gives it): changes the settings `body` names, between turns,
    /// journaled as `session.config_changed`; absent fields stay. With `body.release_id`, also
    /// re-pins the session to that release of the tenant (`session.release_pinned` naming the
    /// old and the new release, in the same commit as the settings change): its next turn runs
    /// that release's model route, tools and policy.
    ///
    /// # Errors
    /// See [`Error`]; 403 for a viewer's key or a setting beyond the server's limits, 404 for an
    /// unknown release (problem `field` `release_id`), 409 while a turn runs (to re-pin: while
    /// one is active at all) or when the session is closed, 412 when the session's version is no
    /// longer `version` (read it again and retry), 422 for an invalid value. Nothing changes on
    /// an error.
    pub async fn update_session(
        &self,
        session: &str,
        version: u64,
        body: &keel_api::UpdateSessionRequest,
    ) -> Result<SessionBody, Error> {
        let path = format!("/v1/sessions/{}", encode_segment(session));
        let bytes = serde_json::to_vec(body)
            .map_err(|e| Error::Config(format!("cannot encode the request body: {e}")))?;
        let req = self
            .request(reqwest::Method::PATCH, &path)
            .header(reqwest::header::IF_MATCH, format!("\"{version}\""))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(bytes);
        self.send(&path, req, std::any::type_name::<SessionBody>())
            .await
    }

    /// `POST /v1/sessions/{session_id}/cancel`: cancels the running (or oldest queued) turn.
    ///
    /// # Errors
    /// See [`Error`]; 409 when no turn is running or queued.
    pub async fn cancel_turn(&self, session: &str) -> Result<CancelledBody, Error> {
        let path = format!("/v1/sessions/{}/cancel", encode_segment(session));
        self.post_json(&path, &keel_api::CancelRequest {}).await
    }
}
