//! Integration tests of keel-model: recorded streams, the fake server's faults, retries and
//! fallback, cancellation, request shapes, the scripted model.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (workspace rule applies to library code)

mod cancel;
mod faults;
mod fixtures;
mod requests;
mod route;
mod scripted;

use futures_util::StreamExt;
use keel_model::{HttpModel, ModelClient, ModelRequest, ProviderConfig, StreamEvent, Wire};
use keel_testkit::FakeModelServer;

/// An HTTP model of `wire` pointed at `server`.
pub fn model_for(server: &FakeModelServer, wire: Wire, model: &str) -> HttpModel {
    let config = ProviderConfig::new(model)
        .with_base_url(server.base_url(wire))
        .with_api_key("test-key");
    HttpModel::new(wire, config).unwrap()
}

/// A one-message request.
pub fn hello() -> ModelRequest {
    ModelRequest {
        messages: vec![
            keel_model::Message::User {
                content: "hello".into(),
            }
            .into(),
        ],
        ..ModelRequest::default()
    }
}

/// All events of one call.
pub async fn events(model: &dyn ModelClient, request: ModelRequest) -> Vec<StreamEvent> {
    model.stream(request).collect().await
}
